package main

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/internal/openaijs"
)

// The "real client that no one here wrote": `lmpack serve` on
// stories260K (given a chat template in a temp copy of its folder) driven
// by the official openai npm client (internal/openaijs). Greedy answers
// are checked against `lmpack run --temperature 0` of the same prompt
// (text and token counts), streamed answers against the non-streamed
// ones, and everything against the API's schema.

// completionResp is the part of an OpenAI completion the tests read.
type completionResp struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Index        int     `json:"index"`
		Text         string  `json:"text"`
		FinishReason *string `json:"finish_reason"`
		Logprobs     *struct {
			Tokens        []string             `json:"tokens"`
			TokenLogprobs []float64            `json:"token_logprobs"`
			TopLogprobs   []map[string]float64 `json:"top_logprobs"`
			TextOffset    []int                `json:"text_offset"`
		} `json:"logprobs"`
		Message *struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
	} `json:"choices"`
	Usage *usage `json:"usage"`
}

type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

// chatLogprobs is choices[0].logprobs of a chat completion.
type chatLogprobs struct {
	Choices []struct {
		Logprobs *struct {
			Content []struct {
				Token       string  `json:"token"`
				Logprob     float64 `json:"logprob"`
				TopLogprobs []struct {
					Token   string  `json:"token"`
					Logprob float64 `json:"logprob"`
				} `json:"top_logprobs"`
			} `json:"content"`
		} `json:"logprobs"`
	} `json:"choices"`
}

const servedName = "stories260K"

func TestServeOpenAIClient(t *testing.T) {
	t.Parallel()
	js := openaijs.Require(t)
	model := chatModel(t, modelDir(t))
	keyFile := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(keyFile, []byte("sk-first\nsk-lmpack-test\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := startServeKey(t, 0, "sk-lmpack-test", model, "--served-model-name", servedName, "--api-key-file", keyFile, "--threads", "1")

	const prompt, n = "Once upon a time", 40
	const stop = " park" // a stop string inside the greedy text
	msgs := []map[string]string{{"role": "user", "content": "Tell me a story about a cat."}}
	const chatN = 30
	refText, refPrompt, refGen := runGreedy(t, model, prompt, n)
	chatText, chatPrompt, chatGen := runGreedy(t, model, renderChat(msgs), chatN)
	cut := strings.Index(refText, stop)
	if cut < 0 {
		t.Fatalf("lmpack run's greedy text %q lacks the stop string %q", refText, stop)
	}

	comp := map[string]any{"model": servedName, "prompt": prompt, "max_tokens": n, "temperature": 0}
	with := func(m map[string]any, kv ...any) map[string]any {
		out := map[string]any{}
		for k, v := range m {
			out[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			out[kv[i].(string)] = kv[i+1]
		}
		return out
	}
	chat := map[string]any{"model": servedName, "messages": msgs, "max_tokens": chatN, "temperature": 0}
	incl := map[string]any{"include_usage": true}
	cases := []openaijs.Case{
		{Name: "models", Kind: "models"},
		{Name: "completion", Kind: "completion", Params: comp},
		{Name: "completion_stop", Kind: "completion", Params: with(comp, "stop", []string{stop})},
		{Name: "completion_stop_stream", Kind: "completion_stream", Params: with(comp, "stop", []string{"zzz", stop}, "stream_options", incl)},
		{Name: "completion_stream", Kind: "completion_stream", Params: with(comp, "stream_options", incl)},
		{Name: "chat", Kind: "chat", Params: chat},
		{Name: "chat_stream", Kind: "chat_stream", Params: with(chat, "stream_options", incl)},
		{Name: "logprobs", Kind: "completion", Params: with(comp, "max_tokens", 10, "logprobs", 3)},
		{Name: "chat_logprobs", Kind: "chat", Params: with(chat, "max_tokens", 10, "logprobs", true, "top_logprobs", 3)},
		{Name: "seeded_a", Kind: "completion", Params: with(comp, "temperature", 0.9, "seed", 7, "max_tokens", 30)},
		{Name: "seeded_b", Kind: "completion", Params: with(comp, "temperature", 0.9, "seed", 7, "max_tokens", 30)},
		{Name: "bad_n", Kind: "completion", Params: with(comp, "n", 2)},
		{Name: "bad_max_tokens", Kind: "completion", Params: with(comp, "max_tokens", 100000)},
		{Name: "bad_field", Kind: "completion", Params: with(comp, "no_such_field", 1)},
		{Name: "auth", Kind: "completion", Params: comp, APIKey: "sk-wrong"},
		{Name: "auth_chat", Kind: "chat", Params: chat, APIKey: "sk-lmpack-tes"},
	}
	res, err := js.Run(context.Background(), s.base+"/v1", "sk-lmpack-test", cases)
	if err != nil {
		t.Fatalf("%v\nserver stderr:\n%s", err, abbrev(s.stderr.String()))
	}
	got := map[string]openaijs.Result{}
	for _, r := range res {
		got[r.Name] = r
	}
	ok := func(name string) openaijs.Result {
		t.Helper()
		r := got[name]
		if !r.OK {
			t.Errorf("%s: the client threw %+v", name, r.Error)
		}
		return r
	}
	decode := func(name string, raw json.RawMessage, v any) bool {
		t.Helper()
		if err := json.Unmarshal(raw, v); err != nil {
			t.Errorf("%s: %v: %s", name, err, raw)
			return false
		}
		return true
	}

	if r := ok("models"); r.OK {
		var m struct {
			Data []struct {
				ID, Object string
			} `json:"data"`
		}
		if decode("models", r.Response, &m) && (len(m.Data) != 1 || m.Data[0].ID != servedName || m.Data[0].Object != "model") {
			t.Errorf("models: %s, want one model %q", r.Response, servedName)
		}
	}

	finishFor := func(gen, max int) string {
		if gen < max {
			return "stop"
		}
		return "length"
	}
	checkCompletion := func(name, object string, r openaijs.Result, text string, pt, ct, max int) *completionResp {
		t.Helper()
		var c completionResp
		if !r.OK || !decode(name, r.Response, &c) {
			return nil
		}
		prefix := map[string]string{"text_completion": "cmpl-", "chat.completion": "chatcmpl-"}[object]
		if !strings.HasPrefix(c.ID, prefix) || c.Object != object || c.Created <= 0 || c.Model != servedName || len(c.Choices) != 1 || c.Choices[0].Index != 0 {
			t.Errorf("%s: schema: id %q object %q created %d model %q choices %d; want %s… %s, created > 0, %s, one choice",
				name, c.ID, c.Object, c.Created, c.Model, len(c.Choices), prefix, object, servedName)
			return nil
		}
		ch := c.Choices[0]
		gotText := ch.Text
		if object == "chat.completion" {
			if ch.Message == nil || ch.Message.Role != "assistant" {
				t.Errorf("%s: message %+v, want role assistant", name, ch.Message)
				return nil
			}
			gotText = ch.Message.Content
		}
		if gotText != text {
			t.Errorf("%s: text\n%q\nwant (lmpack run --temperature 0)\n%q", name, gotText, text)
		}
		if want := finishFor(ct, max); ch.FinishReason == nil || *ch.FinishReason != want {
			t.Errorf("%s: finish_reason %v, want %q (%d of %d tokens)", name, ch.FinishReason, want, ct, max)
		}
		if c.Usage == nil || *c.Usage != (usage{pt, ct, pt + ct}) {
			t.Errorf("%s: usage %+v, want %+v (lmpack run's token counts)", name, c.Usage, usage{pt, ct, pt + ct})
		}
		return &c
	}
	checkCompletion("completion", "text_completion", ok("completion"), refText, refPrompt, refGen, n)
	// A stop string: the greedy text up to it, finish_reason "stop".
	for _, name := range []string{"completion_stop", "completion_stop_stream"} {
		r := ok(name)
		if !r.OK {
			continue
		}
		var text, finish string
		var u *usage
		if r.Chunks != nil {
			res := &sseResult{}
			for _, raw := range r.Chunks {
				var c map[string]any
				if decode(name, raw, &c) {
					res.chunks = append(res.chunks, c)
				}
			}
			var um map[string]any
			text, finish, um = res.streamText()
			if um != nil {
				u = &usage{int(um["prompt_tokens"].(float64)), int(um["completion_tokens"].(float64)), int(um["total_tokens"].(float64))}
			}
		} else {
			var c completionResp
			if !decode(name, r.Response, &c) || len(c.Choices) != 1 || c.Choices[0].FinishReason == nil {
				t.Errorf("%s: %s", name, r.Response)
				continue
			}
			text, finish, u = c.Choices[0].Text, *c.Choices[0].FinishReason, c.Usage
		}
		if text != refText[:cut] || finish != "stop" {
			t.Errorf("%s: text %q finish_reason %q, want the greedy text up to %q: %q, \"stop\"", name, text, finish, stop, refText[:cut])
		}
		if u == nil || u.PromptTokens != refPrompt || u.CompletionTokens < 1 || u.CompletionTokens > n || u.TotalTokens != u.PromptTokens+u.CompletionTokens {
			t.Errorf("%s: usage %+v, want prompt_tokens %d and 1..%d completion tokens", name, u, refPrompt, n)
		}
	}
	checkCompletion("chat", "chat.completion", ok("chat"), chatText, chatPrompt, chatGen, chatN)

	checkStream := func(name, object string, r openaijs.Result, text string, pt, ct, max int) {
		t.Helper()
		if !r.OK {
			return
		}
		if len(r.Chunks) < 2 {
			t.Errorf("%s: %d chunks", name, len(r.Chunks))
			return
		}
		res := &sseResult{}
		var id string
		for i, raw := range r.Chunks {
			var c map[string]any
			if !decode(name, raw, &c) {
				return
			}
			res.chunks = append(res.chunks, c)
			if c["object"] != object || c["model"] != servedName {
				t.Errorf("%s: chunk %d: object %v model %v, want %s %s", name, i, c["object"], c["model"], object, servedName)
			}
			cid, _ := c["id"].(string)
			if i == 0 {
				id = cid
			} else if cid != id {
				t.Errorf("%s: chunk %d id %q, chunk 0's %q", name, i, cid, id)
			}
		}
		if object == "chat.completion.chunk" {
			c0 := res.chunks[0]["choices"].([]any)[0].(map[string]any)
			if d, _ := c0["delta"].(map[string]any); d == nil || d["role"] != "assistant" {
				t.Errorf("%s: first chunk %v, want delta.role assistant", name, c0)
			}
		}
		gotText, finish, u := res.streamText()
		if gotText != text {
			t.Errorf("%s: streamed text\n%q\nwant the non-streamed\n%q", name, gotText, text)
		}
		if want := finishFor(ct, max); finish != want {
			t.Errorf("%s: finish_reason %q, want %q", name, finish, want)
		}
		last := res.chunks[len(res.chunks)-1]
		if ch, _ := last["choices"].([]any); len(ch) != 0 || u == nil {
			t.Errorf("%s: last chunk %v, want the usage chunk with choices []", name, last)
		}
		if u == nil || u["prompt_tokens"] != float64(pt) || u["completion_tokens"] != float64(ct) || u["total_tokens"] != float64(pt+ct) {
			t.Errorf("%s: usage %v, want %d + %d", name, u, pt, ct)
		}
	}
	checkStream("completion_stream", "text_completion", ok("completion_stream"), refText, refPrompt, refGen, n)
	checkStream("chat_stream", "chat.completion.chunk", ok("chat_stream"), chatText, chatPrompt, chatGen, chatN)

	// Completion logprobs: one entry per token, finite and <= 0, 3
	// alternatives, and (greedy) the sampled token's log-probability is
	// the largest of them and listed among them.
	if r := ok("logprobs"); r.OK {
		var c completionResp
		if decode("logprobs", r.Response, &c) && len(c.Choices) == 1 {
			lp := c.Choices[0].Logprobs
			k := c.Usage.CompletionTokens
			switch {
			case lp == nil:
				t.Errorf("logprobs: choices[0].logprobs missing: %s", r.Response)
			case len(lp.Tokens) != k || len(lp.TokenLogprobs) != k || len(lp.TopLogprobs) != k || len(lp.TextOffset) != k:
				t.Errorf("logprobs: %d tokens, %d token_logprobs, %d top_logprobs, %d text_offset; want %d (completion_tokens)",
					len(lp.Tokens), len(lp.TokenLogprobs), len(lp.TopLogprobs), len(lp.TextOffset), k)
			default:
				if strings.Join(lp.Tokens, "") != c.Choices[0].Text {
					t.Errorf("logprobs: tokens %q do not join to the text %q", lp.Tokens, c.Choices[0].Text)
				}
				off := 0
				for i := range lp.Tokens {
					if lp.TextOffset[i] != off {
						t.Errorf("logprobs: text_offset[%d] = %d, want %d", i, lp.TextOffset[i], off)
					}
					off += len(lp.Tokens[i])
					checkTop(t, "logprobs", i, lp.Tokens[i], lp.TokenLogprobs[i], lp.TopLogprobs[i])
				}
			}
			if !strings.HasPrefix(refText, c.Choices[0].Text) {
				t.Errorf("logprobs: text %q is not a prefix of the greedy %q", c.Choices[0].Text, refText)
			}
		}
	}
	if r := ok("chat_logprobs"); r.OK {
		var c chatLogprobs
		if decode("chat_logprobs", r.Response, &c) {
			if len(c.Choices) != 1 || c.Choices[0].Logprobs == nil || len(c.Choices[0].Logprobs.Content) == 0 {
				t.Errorf("chat_logprobs: no choices[0].logprobs.content: %s", r.Response)
			} else {
				for i, e := range c.Choices[0].Logprobs.Content {
					top := map[string]float64{}
					for _, a := range e.TopLogprobs {
						top[a.Token] = a.Logprob
					}
					if len(top) != len(e.TopLogprobs) {
						t.Errorf("chat_logprobs: token %d: duplicate alternatives %+v", i, e.TopLogprobs)
					}
					checkTop(t, "chat_logprobs", i, e.Token, e.Logprob, top)
				}
			}
		}
	}

	// The same seed and temperature give the same text.
	var a, b completionResp
	if ra, rb := ok("seeded_a"), ok("seeded_b"); ra.OK && rb.OK && decode("seeded_a", ra.Response, &a) && decode("seeded_b", rb.Response, &b) {
		if a.Choices[0].Text != b.Choices[0].Text || a.Choices[0].Text == "" {
			t.Errorf("seed 7 at temperature 0.9 twice: %q and %q", a.Choices[0].Text, b.Choices[0].Text)
		}
	}

	// Bad requests: the client's BadRequestError, status 400, the param
	// named.
	for name, param := range map[string]string{"bad_n": "n", "bad_max_tokens": "max_tokens", "bad_field": "no_such_field"} {
		r := got[name]
		e := r.Error
		if r.OK || e == nil || !e.BadRequest || e.Class != "BadRequestError" || e.Status == nil || *e.Status != 400 || e.Param == nil || *e.Param != param {
			t.Errorf("%s: ok %v error %+v, want BadRequestError 400 with param %q (response %s)", name, r.OK, e, param, r.Response)
			continue
		}
		if e.Type == nil || *e.Type == "" || !strings.Contains(e.Message, param) {
			t.Errorf("%s: type %v message %q: want a type and a message naming %q", name, e.Type, e.Message, param)
		}
	}
	if e := got["bad_max_tokens"].Error; e != nil && !strings.Contains(e.Message, "100000") {
		t.Errorf("bad_max_tokens: message %q does not give the requested 100000", e.Message)
	}
	for _, name := range []string{"auth", "auth_chat"} {
		r := got[name]
		if e := r.Error; r.OK || e == nil || !e.Authentication || e.Class != "AuthenticationError" || e.Status == nil || *e.Status != 401 {
			t.Errorf("%s: ok %v error %+v, want AuthenticationError 401", name, r.OK, e)
		}
	}
	// No key at all: 401 in OpenAI's shape, and the key is not needed
	// for /health.
	wantAPIError(t, "no key", s.do(t, "POST", "/v1/completions", "", []byte(`{"model":"stories260K","prompt":"x"}`)), 401)
	if r := s.do(t, "GET", "/health", "", nil); r.status != 200 {
		t.Errorf("GET /health without a key: %v, want 200 (health checks carry no key, as with vLLM)", r)
	}
	if t.Failed() {
		t.Logf("server stderr:\n%s", abbrev(s.stderr.String()))
	}
}

// checkTop checks one position's logprobs: finite, <= 0, exactly 3
// alternatives, and the sampled (greedy) token among them with the
// largest log-probability.
func checkTop(t *testing.T, name string, i int, tok string, lp float64, top map[string]float64) {
	t.Helper()
	if !finite(lp) || lp > 0 {
		t.Errorf("%s: token %d %q: logprob %v, want finite and <= 0", name, i, tok, lp)
	}
	if len(top) != 3 {
		t.Errorf("%s: token %d: %d top alternatives %v, want 3", name, i, len(top), top)
	}
	best := math.Inf(-1)
	for alt, v := range top {
		if !finite(v) || v > 0 {
			t.Errorf("%s: token %d: alternative %q logprob %v", name, i, alt, v)
		}
		best = math.Max(best, v)
	}
	if v, ok := top[tok]; !ok || v != lp {
		t.Errorf("%s: token %d %q (logprob %v) is not among its top alternatives %v", name, i, tok, lp, top)
	}
	if lp != best {
		t.Errorf("%s: token %d %q: greedy logprob %v is not the largest alternative's %v", name, i, tok, lp, best)
	}
}
