package serve

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ardanlabs/jinja"
	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/internal/engine"
	"github.com/lmpack/lmpack/internal/shared"
	"github.com/lmpack/lmpack/model"
	"github.com/prometheus/client_golang/prometheus"
)

// testChatTemplate is a small Jinja chat template (role: content lines)
// written into a temporary tokenizer_config.json.
const testChatTemplate = "{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"

// testEngine is stories260K's tokenizer and description from a temporary
// copy of its config files (no weights: the fake Submitter generates),
// with chatTemplate set in tokenizer_config.json when not "".
func testEngine(t *testing.T, chatTemplate string) *engine.Engine {
	t.Helper()
	src := shared.Path(t, "stories260K-hf")
	dir := filepath.Join(t.TempDir(), "stories260K")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"} {
		b, err := os.ReadFile(filepath.Join(src, name))
		if err != nil {
			t.Fatal(err)
		}
		if name == "tokenizer_config.json" && chatTemplate != "" {
			var cfg map[string]any
			if err := json.Unmarshal(b, &cfg); err != nil {
				t.Fatal(err)
			}
			cfg["chat_template"] = chatTemplate
			if b, err = json.Marshal(cfg); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	d, err := arch.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := model.LoadTokenizer(dir, d)
	if err != nil {
		t.Fatal(err)
	}
	return &engine.Engine{Dir: dir, Desc: d, Tokenizer: tok}
}

// fakeSub is a Submitter that "generates" a fixed token list (up to
// MaxTokens, then finish "length", or finish after the list), one
// unbuffered event at a time, stopping with "cancelled" once ctx ends.
type fakeSub struct {
	tokens []int
	finish string // after all tokens; default "stop"
	err    error  // returned by Submit
	panics bool
	hang   bool // after the tokens, wait for ctx (or cut) instead of finishing
	cut    chan struct{}
	// cutDelay is how long a hung request takes, after the cut, to send
	// its last event (a scheduler step still running).
	cutDelay time.Duration

	mu      sync.Mutex
	reqs    []*GenRequest
	sent    int  // token events of the last request
	stopped bool // the last request saw its ctx end
	done    chan struct{}
}

func (f *fakeSub) Submit(ctx context.Context, r *GenRequest) (<-chan Event, error) {
	if f.panics {
		panic("fake submitter exploded")
	}
	if f.err != nil {
		return nil, f.err
	}
	f.mu.Lock()
	f.reqs = append(f.reqs, r)
	f.sent, f.stopped = 0, false
	done := make(chan struct{})
	f.done = done
	f.mu.Unlock()
	ch := make(chan Event)
	go func() {
		defer close(done)
		defer close(ch)
		for i, id := range f.tokens {
			if i == r.MaxTokens {
				ch <- Event{Finish: "length"}
				return
			}
			if ctx.Err() != nil {
				f.mu.Lock()
				f.stopped = true
				f.mu.Unlock()
				ch <- Event{Finish: "cancelled"}
				return
			}
			ev := Event{Token: id, Logprob: -0.25 * float32(i+1)}
			if r.TopLogprobs > 0 {
				ev.Top = []TokenLogprob{{ID: id, Logprob: ev.Logprob}, {ID: 2 + i, Logprob: ev.Logprob - 1}}[:min(2, r.TopLogprobs)]
			}
			ch <- ev
			f.mu.Lock()
			f.sent++
			f.mu.Unlock()
		}
		if f.hang {
			select {
			case <-ctx.Done():
			case <-f.cut: // the scheduler cancels it (Drain at its deadline)
				time.Sleep(f.cutDelay)
			}
			f.mu.Lock()
			f.stopped = true
			f.mu.Unlock()
			ch <- Event{Finish: "cancelled"}
			return
		}
		fin := f.finish
		if fin == "" {
			fin = "stop"
		}
		if len(f.tokens) == r.MaxTokens {
			fin = "length"
		}
		ch <- Event{Finish: fin}
	}()
	return ch, nil
}

func (f *fakeSub) last(t *testing.T) *GenRequest {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.reqs) == 0 {
		t.Fatal("no request reached the Submitter")
	}
	return f.reqs[len(f.reqs)-1]
}

// wait waits for the last request's event goroutine to end.
func (f *fakeSub) wait() {
	f.mu.Lock()
	d := f.done
	f.mu.Unlock()
	if d != nil {
		<-d
	}
}

// lily is ", there was a little girl named Lily." after "Once upon a
// time" in stories260K's tokenizer: "," "▁there" "▁was" "▁a" "▁little"
// "▁g" "ir" "l" "▁named" "▁Lily" ".".
var lily = []int{432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426}

const lilyText = ", there was a little girl named Lily."

type testServer struct {
	s    *Server
	sub  *fakeSub
	url  string
	logs *bytes.Buffer
	reg  *prometheus.Registry
}

func newTestServer(t *testing.T, chat string, opt Options) *testServer {
	t.Helper()
	e := testEngine(t, chat)
	sub := &fakeSub{tokens: lily}
	logs := &bytes.Buffer{}
	var mu sync.Mutex
	opt.Logger = slog.New(slog.NewJSONHandler(lockedWriter{&mu, logs}, nil))
	reg := prometheus.NewRegistry()
	s, err := New(e, sub, reg, opt)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(s.Handler())
	t.Cleanup(hs.Close)
	return &testServer{s: s, sub: sub, url: hs.URL, logs: logs, reg: reg}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

type response struct {
	status int
	header http.Header
	body   []byte
}

func (ts *testServer) do(t *testing.T, method, path, body string, hdr ...string) response {
	t.Helper()
	req, err := http.NewRequest(method, ts.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i] == "Host" {
			req.Host = hdr[i+1]
			continue
		}
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return response{resp.StatusCode, resp.Header, b}
}

func (ts *testServer) post(t *testing.T, path, body string, hdr ...string) response {
	t.Helper()
	return ts.do(t, http.MethodPost, path, body, hdr...)
}

func decode[T any](t *testing.T, b []byte) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("response is not the JSON expected: %v\n%s", err, b)
	}
	return v
}

// events splits an SSE body into its data payloads, checking the framing.
func events(t *testing.T, body []byte) []string {
	t.Helper()
	var out []string
	for _, ev := range strings.Split(strings.TrimSuffix(string(body), "\n\n"), "\n\n") {
		data, ok := strings.CutPrefix(ev, "data: ")
		if !ok || strings.Contains(data, "\n") {
			t.Fatalf("bad SSE event %q in\n%s", ev, body)
		}
		out = append(out, data)
	}
	if !strings.HasSuffix(string(body), "\n\n") || len(out) == 0 || out[len(out)-1] != "[DONE]" {
		t.Fatalf("stream does not end with data: [DONE]\n\n:\n%s", body)
	}
	return out[:len(out)-1]
}

type completionResp struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Index    int     `json:"index"`
		Text     string  `json:"text"`
		Finish   *string `json:"finish_reason"`
		Logprobs *struct {
			Tokens        []string             `json:"tokens"`
			TokenLogprobs []float32            `json:"token_logprobs"`
			TopLogprobs   []map[string]float32 `json:"top_logprobs"`
			TextOffset    []int                `json:"text_offset"`
		} `json:"logprobs"`
	} `json:"choices"`
	Usage *usage `json:"usage"`
}

func TestCompletionsShape(t *testing.T) {
	ts := newTestServer(t, "", Options{})
	r := ts.post(t, "/v1/completions", `{"model":"stories260K","prompt":"Once upon a time","max_tokens":64,"temperature":0,"top_k":5,"seed":7,"stop_token_ids":[13],"user":"u1"}`)
	if r.status != 200 || r.header.Get("Content-Type") != "application/json" {
		t.Fatalf("status %d %q: %s", r.status, r.header.Get("Content-Type"), r.body)
	}
	c := decode[completionResp](t, r.body)
	if !strings.HasPrefix(c.ID, "cmpl-") || c.Object != "text_completion" || c.Model != "stories260K" || c.Created <= 0 {
		t.Errorf("header fields: %+v", c)
	}
	if len(c.Choices) != 1 || c.Choices[0].Text != lilyText || c.Choices[0].Finish == nil || *c.Choices[0].Finish != "stop" || c.Choices[0].Logprobs != nil {
		t.Fatalf("choices: %s", r.body)
	}
	if *c.Usage != (usage{PromptTokens: 5, CompletionTokens: len(lily), TotalTokens: 5 + len(lily)}) {
		t.Errorf("usage %+v", *c.Usage)
	}
	g := ts.sub.last(t)
	if !slices.Equal(g.Prompt, []int{1, 403, 407, 261, 378}) || g.MaxTokens != 64 || g.Temperature != 0 || g.TopK != 5 || g.Seed != 7 ||
		!slices.Equal(g.StopTokenIDs, []int{13}) || g.TopLogprobs != -1 || g.TopP != 1 || g.ID != c.ID {
		t.Errorf("GenRequest %+v", g)
	}
	// Defaults: max_tokens 16 (OpenAI's), temperature 1; token-id prompt.
	r = ts.post(t, "/v1/completions", `{"prompt":[1,403,407,261,378],"max_tokens":null}`)
	c = decode[completionResp](t, r.body)
	if g := ts.sub.last(t); g.MaxTokens != defaultCompletionTokens || g.Temperature != 1 || !slices.Equal(g.Prompt, []int{1, 403, 407, 261, 378}) {
		t.Errorf("defaults: %+v", g)
	}
	if c.Choices[0].Text != lilyText {
		t.Errorf("token prompt text %q", c.Choices[0].Text)
	}
	// max_tokens reached: finish length, text cut there.
	r = ts.post(t, "/v1/completions", `{"prompt":"Once upon a time","max_tokens":3}`)
	c = decode[completionResp](t, r.body)
	if c.Choices[0].Text != ", there was" || *c.Choices[0].Finish != "length" || c.Usage.CompletionTokens != 3 {
		t.Errorf("length: %s", r.body)
	}
}

func TestCompletionsStream(t *testing.T) {
	ts := newTestServer(t, "", Options{})
	for _, usageOn := range []bool{false, true} {
		r := ts.post(t, "/v1/completions", fmt.Sprintf(`{"prompt":"Once upon a time","stream":true,"stream_options":{"include_usage":%v}}`, usageOn))
		if r.status != 200 || r.header.Get("Content-Type") != "text/event-stream" {
			t.Fatalf("status %d %q: %s", r.status, r.header.Get("Content-Type"), r.body)
		}
		evs := events(t, r.body)
		var text strings.Builder
		n := len(evs)
		if usageOn {
			n--
			u := decode[completionResp](t, []byte(evs[n]))
			if len(u.Choices) != 0 || u.Usage == nil || *u.Usage != (usage{5, len(lily), 5 + len(lily)}) {
				t.Errorf("usage chunk %s", evs[n])
			}
		}
		for i, ev := range evs[:n] {
			c := decode[completionResp](t, []byte(ev))
			if c.Object != "text_completion" || !strings.HasPrefix(c.ID, "cmpl-") || len(c.Choices) != 1 || c.Usage != nil {
				t.Fatalf("chunk %d: %s", i, ev)
			}
			if fin := c.Choices[0].Finish; (fin != nil) != (i == n-1) || (fin != nil && *fin != "stop") {
				t.Errorf("chunk %d finish_reason: %s", i, ev)
			}
			text.WriteString(c.Choices[0].Text)
		}
		if text.String() != lilyText {
			t.Errorf("streamed text %q, want %q", text.String(), lilyText)
		}
		// One chunk per token with text (none held back here) plus the finish.
		if n != len(lily)+1 {
			t.Errorf("%d chunks, want %d", n, len(lily)+1)
		}
	}
}

// TestStopStrings: a stop string ends the text before it, across token
// boundaries, streamed or not, never emitting any of it; the request's
// ctx is cancelled so that the scheduler stops generating.
func TestStopStrings(t *testing.T) {
	ts := newTestServer(t, "", Options{})
	long := slices.Repeat(lily, 4)
	ts.sub.tokens = long
	cases := []struct {
		stop string
		want string
	}{
		{`"girl"`, ", there was a little "},      // spans "▁g" "ir" "l"
		{`["zzz","ttle g"]`, ", there was a li"}, // spans "▁little" "▁g"
		{`["Lily", "was a"]`, ", there "},        // the earliest wins
		{`"."`, ", there was a little girl named Lily"},
		{`".,"`, ", there was a little girl named Lily"}, // spans the repeat
		{`"never"`, strings.Repeat(lilyText, 4)},         // no match: all, finish stop from the Submitter
	}
	for _, tc := range cases {
		for _, stream := range []bool{false, true} {
			body := fmt.Sprintf(`{"prompt":"Once upon a time","max_tokens":100,"stop":%s,"stream":%v}`, tc.stop, stream)
			r := ts.post(t, "/v1/completions", body)
			ts.sub.wait()
			var text, finish string
			if stream {
				for _, ev := range events(t, r.body) {
					c := decode[completionResp](t, []byte(ev))
					text += c.Choices[0].Text
					if c.Choices[0].Finish != nil {
						finish = *c.Choices[0].Finish
					}
				}
			} else {
				c := decode[completionResp](t, r.body)
				text, finish = c.Choices[0].Text, *c.Choices[0].Finish
			}
			if text != tc.want || finish != "stop" {
				t.Errorf("stop %s stream %v: text %q finish %q, want %q stop", tc.stop, stream, text, finish, tc.want)
			}
			ts.sub.mu.Lock()
			sent, stopped := ts.sub.sent, ts.sub.stopped
			ts.sub.mu.Unlock()
			if tc.stop != `"never"` && (!stopped || sent >= len(long)) {
				t.Errorf("stop %s: the request was not cancelled at the stop string (sent %d of %d tokens, cancelled %v)", tc.stop, sent, len(long), stopped)
			}
		}
	}
}

// TestStopperHoldBack: text that may grow into a stop string is held back
// and released once it cannot.
func TestStopperHoldBack(t *testing.T) {
	g := stopper{stops: []string{"abc"}, maxStop: 3}
	var out []string
	for i, p := range []string{"xa", "b", "d", "ab", "c", "z"} {
		g.add(tokOut{ID: i + 10, Text: p, Offset: len(g.text)}, p)
		text, _, stopped := g.step(false)
		out = append(out, text)
		if stopped {
			break
		}
	}
	if want := []string{"x", "", "abd", "", ""}; !slices.Equal(out, want) {
		t.Errorf("released %q, want %q", out, want)
	}
	if string(g.text[:g.sent]) != "xabd" {
		t.Errorf("sent %q", g.text[:g.sent])
	}
}

func TestCompletionsLogprobs(t *testing.T) {
	ts := newTestServer(t, "", Options{})
	r := ts.post(t, "/v1/completions", `{"prompt":"Once upon a time","max_tokens":4,"logprobs":2}`)
	c := decode[completionResp](t, r.body)
	lp := c.Choices[0].Logprobs
	if r.status != 200 || lp == nil {
		t.Fatalf("%d %s", r.status, r.body)
	}
	if g := ts.sub.last(t); g.TopLogprobs != 2 {
		t.Errorf("TopLogprobs %d", g.TopLogprobs)
	}
	if want := []string{",", " there", " was", " a"}; !slices.Equal(lp.Tokens, want) {
		t.Errorf("tokens %q, want %q", lp.Tokens, want)
	}
	if want := []float32{-0.25, -0.5, -0.75, -1}; !slices.Equal(lp.TokenLogprobs, want) {
		t.Errorf("token_logprobs %v", lp.TokenLogprobs)
	}
	if want := []int{0, 1, 7, 11}; !slices.Equal(lp.TextOffset, want) {
		t.Errorf("text_offset %v", lp.TextOffset)
	}
	// Alternatives decode as they would follow the previous token: the
	// fake's second alternative of token 1 is id 3 ("<0x00>" byte) and of
	// token 2 is id 4.
	if len(lp.TopLogprobs) != 4 || len(lp.TopLogprobs[1]) != 2 || lp.TopLogprobs[1][" there"] != -0.5 {
		t.Errorf("top_logprobs %v", lp.TopLogprobs)
	}
	alt := ts.s.altText(383, 286)
	if alt != " was" {
		t.Errorf("altText(there, was) = %q", alt)
	}
	// logprobs 0: the sampled token's only.
	r = ts.post(t, "/v1/completions", `{"prompt":"Once upon a time","max_tokens":2,"logprobs":0}`)
	c = decode[completionResp](t, r.body)
	if lp := c.Choices[0].Logprobs; lp == nil || len(lp.TopLogprobs) != 2 || len(lp.TopLogprobs[0]) != 0 || ts.sub.last(t).TopLogprobs != 0 {
		t.Errorf("logprobs 0: %s", r.body)
	}
}

type chatResp struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Message *struct {
			Role    string  `json:"role"`
			Content *string `json:"content"`
		} `json:"message"`
		Delta *struct {
			Role    *string `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
		Finish   *string `json:"finish_reason"`
		Logprobs *struct {
			Content []struct {
				Token       string  `json:"token"`
				Logprob     float32 `json:"logprob"`
				Bytes       []int   `json:"bytes"`
				TopLogprobs []struct {
					Token   string  `json:"token"`
					Logprob float32 `json:"logprob"`
				} `json:"top_logprobs"`
			} `json:"content"`
		} `json:"logprobs"`
	} `json:"choices"`
	Usage *usage `json:"usage"`
}

func TestChat(t *testing.T) {
	ts := newTestServer(t, testChatTemplate, Options{})
	body := `{"model":"stories260K","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":[{"type":"text","text":"Hi"}]}],"max_completion_tokens":50,"temperature":0}`
	r := ts.post(t, "/v1/chat/completions", body)
	if r.status != 200 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	c := decode[chatResp](t, r.body)
	want := ts.s.tok.Encode("<s>system: Be brief.\nuser: Hi\nassistant:", false)
	g := ts.sub.last(t)
	if !slices.Equal(g.Prompt, want) || g.Prompt[0] != 1 || g.MaxTokens != 50 {
		t.Errorf("prompt %v, want %v (max %d)", g.Prompt, want, g.MaxTokens)
	}
	if !strings.HasPrefix(c.ID, "chatcmpl-") || c.Object != "chat.completion" || len(c.Choices) != 1 || c.Choices[0].Message == nil ||
		c.Choices[0].Message.Role != "assistant" || *c.Choices[0].Message.Content != lilyText || *c.Choices[0].Finish != "stop" ||
		c.Usage.PromptTokens != len(want) || c.Usage.CompletionTokens != len(lily) {
		t.Errorf("response %s", r.body)
	}
	// Default max tokens: all the context leaves.
	ts.post(t, "/v1/chat/completions", `{"messages":[{"role":"user","content":"Hi"}]}`)
	if g := ts.sub.last(t); g.MaxTokens != ts.s.opt.MaxModelLen-len(g.Prompt) || ts.s.opt.MaxModelLen != 512 {
		t.Errorf("default max tokens %d (prompt %d, context %d)", g.MaxTokens, len(g.Prompt), ts.s.opt.MaxModelLen)
	}
	// Streaming: role first, then content deltas, finish, usage, [DONE].
	r = ts.post(t, "/v1/chat/completions", `{"messages":[{"role":"user","content":"Hi"}],"stream":true,"stream_options":{"include_usage":true},"logprobs":true,"top_logprobs":1}`)
	evs := events(t, r.body)
	first := decode[chatResp](t, []byte(evs[0]))
	if first.Object != "chat.completion.chunk" || first.Choices[0].Delta == nil || first.Choices[0].Delta.Role == nil || *first.Choices[0].Delta.Role != "assistant" {
		t.Fatalf("first chunk %s", evs[0])
	}
	var text strings.Builder
	var toks []string
	for _, ev := range evs[1 : len(evs)-2] {
		c := decode[chatResp](t, []byte(ev))
		if c.Choices[0].Delta.Role != nil || c.Choices[0].Finish != nil {
			t.Errorf("content chunk %s", ev)
		}
		text.WriteString(*c.Choices[0].Delta.Content)
		for _, lp := range c.Choices[0].Logprobs.Content {
			toks = append(toks, lp.Token)
			if string(intsBytes(lp.Bytes)) != lp.Token || len(lp.TopLogprobs) != 1 || lp.TopLogprobs[0].Token != lp.Token {
				t.Errorf("logprob entry %+v", lp)
			}
		}
	}
	if text.String() != lilyText || strings.Join(toks, "") != lilyText {
		t.Errorf("streamed %q tokens %q", text.String(), toks)
	}
	fin := decode[chatResp](t, []byte(evs[len(evs)-2]))
	if *fin.Choices[0].Finish != "stop" || fin.Choices[0].Delta.Content != nil {
		t.Errorf("finish chunk %s", evs[len(evs)-2])
	}
	if u := decode[chatResp](t, []byte(evs[len(evs)-1])); u.Usage == nil || u.Usage.CompletionTokens != len(lily) || len(u.Choices) != 0 {
		t.Errorf("usage chunk %s", evs[len(evs)-1])
	}
}

func intsBytes(v []int) []byte {
	b := make([]byte, len(v))
	for i, x := range v {
		b[i] = byte(x)
	}
	return b
}

type errResp struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

// TestErrors: every refusal has OpenAI's error shape, its status, the
// parameter at fault and a message that says what is wrong.
func TestErrors(t *testing.T) {
	ts := newTestServer(t, "", Options{MaxBodyBytes: 1 << 16})
	longPrompt := "[" + strings.Repeat("1,", 511) + "1]"
	cases := []struct {
		name, method, path, body string
		status                   int
		param                    string
		msg                      []string
	}{
		{"bad json", "POST", "/v1/completions", `{"prompt": "x",}`, 400, "", []string{"not valid JSON", "offset 16"}},
		{"truncated json", "POST", "/v1/completions", `{"prompt": "x"`, 400, "", []string{"not valid JSON", "offset 14"}},
		{"not an object", "POST", "/v1/completions", `["x"]`, 400, "", []string{"JSON object"}},
		{"trailing data", "POST", "/v1/completions", `{"prompt":"x"} {}`, 400, "", []string{"after the object"}},
		{"unknown field", "POST", "/v1/completions", `{"prompt":"x","max_token":3}`, 400, "max_token", []string{"unrecognized", "max_token"}},
		{"wrong type", "POST", "/v1/completions", `{"prompt":"x","max_tokens":"3"}`, 400, "max_tokens", []string{"integer"}},
		{"fraction", "POST", "/v1/completions", `{"prompt":"x","max_tokens":2.5}`, 400, "max_tokens", []string{"integer"}},
		{"temperature", "POST", "/v1/completions", `{"prompt":"x","temperature":-1}`, 400, "temperature", []string{"[0, 2]"}},
		{"top_p", "POST", "/v1/completions", `{"prompt":"x","top_p":0}`, 400, "top_p", []string{"(0, 1]"}},
		{"no prompt", "POST", "/v1/completions", `{}`, 400, "prompt", []string{"required"}},
		{"bad utf8", "POST", "/v1/completions", "{\"prompt\":\"a\xff\"}", 400, "prompt", []string{"UTF-8", "offset 2"}},
		{"bad token", "POST", "/v1/completions", `{"prompt":[1,512]}`, 400, "prompt", []string{"512", "[0, 512)"}},
		{"prompt fills context", "POST", "/v1/completions", `{"prompt":` + longPrompt + `}`, 400, "prompt", []string{"512"}},
		{"max_tokens beyond context", "POST", "/v1/completions", `{"prompt":"Once upon a time","max_tokens":600}`, 400, "max_tokens", []string{"600", "512", "5 input tokens"}},
		{"max_tokens 0", "POST", "/v1/completions", `{"prompt":"x","max_tokens":0}`, 400, "max_tokens", []string{"at least 1"}},
		{"n", "POST", "/v1/completions", `{"prompt":"x","n":2}`, 400, "n", []string{"n = 2"}},
		{"best_of", "POST", "/v1/completions", `{"prompt":"x","best_of":3}`, 400, "best_of", []string{"not supported"}},
		{"suffix", "POST", "/v1/completions", `{"prompt":"x","suffix":"y"}`, 400, "suffix", []string{"not supported"}},
		{"echo", "POST", "/v1/completions", `{"prompt":"x","echo":true}`, 400, "echo", []string{"not supported"}},
		{"logit_bias", "POST", "/v1/completions", `{"prompt":"x","logit_bias":{"5":1}}`, 400, "logit_bias", []string{"not supported"}},
		{"logprobs range", "POST", "/v1/completions", `{"prompt":"x","logprobs":21}`, 400, "logprobs", []string{"[0, 20]"}},
		{"stream_options alone", "POST", "/v1/completions", `{"prompt":"x","stream_options":{"include_usage":true}}`, 400, "stream_options", []string{"stream"}},
		{"empty stop", "POST", "/v1/completions", `{"prompt":"x","stop":[""]}`, 400, "stop", []string{"empty"}},
		{"two prompts", "POST", "/v1/completions", `{"prompt":["a","b"]}`, 400, "prompt", []string{"2 prompts"}},
		{"unknown model", "POST", "/v1/completions", `{"prompt":"x","model":"gpt-9"}`, 404, "model", []string{"gpt-9", "stories260K"}},
		{"no chat template", "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`, 400, "messages", []string{"chat_template"}},
		{"tools", "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"tools":[]}`, 400, "tools", []string{"not supported"}},
		{"response_format", "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_object"}}`, 400, "response_format", []string{"not supported"}},
		{"bad role", "POST", "/v1/chat/completions", `{"messages":[{"role":"robot","content":"hi"}]}`, 400, "messages[0].role", []string{"robot"}},
		{"message field", "POST", "/v1/chat/completions", `{"messages":[{"role":"user","text":"hi"}]}`, 400, "messages[0].text", []string{"unrecognized"}},
		{"image part", "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":[{"type":"image_url"}]}]}`, 400, "messages[0].content[0]", []string{"image_url"}},
		{"text part without text", "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":[{"type":"text"}]}]}`, 400, "messages[0].content[0].text", []string{"is required"}},
		{"min_p", "POST", "/v1/completions", `{"prompt":"a","min_p":0.1}`, 400, "min_p", []string{"no min-p filtering"}},
		{"top_logprobs alone", "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"top_logprobs":2}`, 400, "top_logprobs", []string{"logprobs"}},
		{"unknown path", "GET", "/v1/nothing", ``, 404, "", []string{"/v1/nothing"}},
		{"unknown model path", "GET", "/v1/models/other", ``, 404, "model", []string{"other"}},
		{"wrong method", "GET", "/v1/completions", ``, 405, "", []string{"POST"}},
		{"body too large", "POST", "/v1/completions", `{"prompt":"` + strings.Repeat("a", 1<<17) + `"}`, 413, "", []string{"65536 bytes"}},
	}
	for _, tc := range cases {
		r := ts.do(t, tc.method, tc.path, tc.body)
		if r.status != tc.status {
			t.Errorf("%s: status %d, want %d: %s", tc.name, r.status, tc.status, r.body)
			continue
		}
		e := decode[errResp](t, r.body)
		param := ""
		if e.Error.Param != nil {
			param = *e.Error.Param
		}
		if param != tc.param || e.Error.Type == "" {
			t.Errorf("%s: param %q type %q, want %q: %s", tc.name, param, e.Error.Type, tc.param, r.body)
		}
		for _, m := range tc.msg {
			if !strings.Contains(e.Error.Message, m) {
				t.Errorf("%s: message %q lacks %q", tc.name, e.Error.Message, m)
			}
		}
	}
	if r := ts.do(t, "GET", "/v1/completions", ""); r.header.Get("Allow") != "POST" {
		t.Errorf("405 Allow %q", r.header.Get("Allow"))
	}
}

// TestHTTPSubmitErrors: the Submitter's errors answer 503 with Retry-After
// (queue full, shutting down), 400 (never fits, too long) or 500.
func TestHTTPSubmitErrors(t *testing.T) {
	ts := newTestServer(t, "", Options{})
	for _, tc := range []struct {
		err    error
		status int
		code   string
	}{
		{ErrQueueFull, 503, "queue_full"},
		{fmt.Errorf("wrapped: %w", ErrShuttingDown), 503, "shutting_down"},
		{ErrNeverFits, 400, "context_length_exceeded"},
		{ErrTooLong, 400, "context_length_exceeded"},
		{errors.New("disk on fire"), 500, ""},
	} {
		ts.sub.err = tc.err
		for _, stream := range []bool{false, true} {
			r := ts.post(t, "/v1/completions", fmt.Sprintf(`{"prompt":"x","stream":%v}`, stream))
			e := decode[errResp](t, r.body)
			code := ""
			if e.Error.Code != nil {
				code = *e.Error.Code
			}
			if r.status != tc.status || code != tc.code || (tc.status == 503) != (r.header.Get("Retry-After") != "") {
				t.Errorf("%v stream %v: %d %q Retry-After %q: %s", tc.err, stream, r.status, code, r.header.Get("Retry-After"), r.body)
			}
			if tc.status == 500 && strings.Contains(string(r.body), "disk on fire") {
				t.Errorf("internal error text leaked to the client: %s", r.body)
			}
		}
	}
}

func TestAuth(t *testing.T) {
	ts := newTestServer(t, "", Options{APIKeys: [][]byte{[]byte("key-one"), []byte("key-two")}})
	body := `{"prompt":"Once upon a time","max_tokens":2}`
	for _, tc := range []struct {
		hdr    []string
		status int
	}{
		{nil, 401},
		{[]string{"Authorization", "Bearer nope"}, 401},
		{[]string{"Authorization", "key-one"}, 401},
		{[]string{"Authorization", "Bearer key-on"}, 401},
		{[]string{"Authorization", "Bearer key-one"}, 200},
		{[]string{"Authorization", "Bearer key-two"}, 200},
	} {
		r := ts.post(t, "/v1/completions", body, tc.hdr...)
		if r.status != tc.status {
			t.Errorf("%v: status %d, want %d: %s", tc.hdr, r.status, tc.status, r.body)
		}
		if tc.status == 401 {
			e := decode[errResp](t, r.body)
			if e.Error.Code == nil || *e.Error.Code != "invalid_api_key" || r.header.Get("WWW-Authenticate") == "" {
				t.Errorf("401 body %s", r.body)
			}
		}
	}
	if r := ts.do(t, "GET", "/v1/models", ""); r.status != 401 {
		t.Errorf("models without key: %d", r.status)
	}
	if r := ts.do(t, "GET", "/v1/unknown", ""); r.status != 401 {
		t.Errorf("unknown /v1 path without key: %d (must not reveal what exists)", r.status)
	}
	if r := ts.do(t, "GET", "/metrics", ""); r.status != 200 {
		t.Errorf("metrics: %d", r.status)
	}
}

func TestModels(t *testing.T) {
	ts := newTestServer(t, "", Options{ModelName: "tiny", MaxModelLen: 100})
	r := ts.do(t, "GET", "/v1/models", "")
	m := decode[struct {
		Object string        `json:"object"`
		Data   []modelObject `json:"data"`
	}](t, r.body)
	if r.status != 200 || m.Object != "list" || len(m.Data) != 1 || m.Data[0].ID != "tiny" || m.Data[0].Object != "model" || m.Data[0].MaxModelLen != 100 {
		t.Errorf("%d %s", r.status, r.body)
	}
	if r := ts.do(t, "GET", "/v1/models/tiny", ""); r.status != 200 || decode[modelObject](t, r.body).ID != "tiny" {
		t.Errorf("model: %d %s", r.status, r.body)
	}
	// MaxModelLen 100 bounds max_tokens.
	if r := ts.post(t, "/v1/completions", `{"prompt":"Once upon a time","max_tokens":96}`); r.status != 400 {
		t.Errorf("max_tokens past --max-model-len: %d", r.status)
	}
	e := testEngine(t, "")
	if _, err := New(e, &fakeSub{}, nil, Options{MaxModelLen: 513}); err == nil || !strings.Contains(err.Error(), "512") {
		t.Errorf("MaxModelLen beyond the context: %v", err)
	}
}

// TestPanicRecovery: a panic while handling one request answers 500 for
// it; the server goes on serving.
func TestPanicRecovery(t *testing.T) {
	ts := newTestServer(t, "", Options{})
	ts.sub.panics = true
	r := ts.post(t, "/v1/completions", `{"prompt":"x"}`)
	if r.status != 500 || decode[errResp](t, r.body).Error.Type != "server_error" {
		t.Errorf("panic: %d %s", r.status, r.body)
	}
	ts.sub.panics = false
	if r := ts.post(t, "/v1/completions", `{"prompt":"Once upon a time"}`); r.status != 200 {
		t.Errorf("after the panic: %d %s", r.status, r.body)
	}
	if !strings.Contains(ts.logs.String(), "fake submitter exploded") {
		t.Errorf("panic not logged: %s", ts.logs)
	}
}

func TestMetricsAndLogs(t *testing.T) {
	ts := newTestServer(t, "", Options{})
	ts.post(t, "/v1/completions", `{"prompt":"Once upon a time","max_tokens":3}`)
	ts.post(t, "/v1/completions", `{"prompt":"Once upon a time","n":3}`)
	r := ts.do(t, "GET", "/metrics", "")
	for _, want := range []string{
		`lmpack_http_requests_total{endpoint="completions",status="200"} 1`,
		`lmpack_http_requests_total{endpoint="completions",status="400"} 1`,
	} {
		if !strings.Contains(string(r.body), want) {
			t.Errorf("metrics lack %s:\n%s", want, r.body)
		}
	}
	var line map[string]any
	sc := bufio.NewScanner(bytes.NewReader(ts.logs.Bytes()))
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil && m["msg"] == "request" && m["status"] == 200.0 {
			line = m
		}
	}
	if line == nil || !strings.HasPrefix(line["id"].(string), "cmpl-") || line["prompt_tokens"] != 5.0 || line["completion_tokens"] != 3.0 ||
		line["endpoint"] != "completions" || line["ttft_ms"] == nil || line["duration_ms"] == nil {
		t.Errorf("request log line %v in\n%s", line, ts.logs)
	}
	if strings.Contains(ts.logs.String(), "Once upon") {
		t.Errorf("prompt text logged without LogPrompts:\n%s", ts.logs)
	}
	lp := newTestServer(t, "", Options{LogPrompts: true})
	lp.post(t, "/v1/completions", `{"prompt":"Once upon a time","max_tokens":3}`)
	if !strings.Contains(lp.logs.String(), "Once upon a time") {
		t.Errorf("LogPrompts: prompt not logged:\n%s", lp.logs)
	}
}

// TestServeLifecycle: /health is 503 before Serve and after shutdown
// starts, 200 while serving; a cancelled ctx drains and Serve returns nil.
func TestServeLifecycle(t *testing.T) {
	e := testEngine(t, "")
	s, err := New(e, &fakeSub{tokens: lily}, nil, Options{})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("GET", "/health", nil)
	req.Host = "127.0.0.1"
	s.Handler().ServeHTTP(rec, req)
	if rec.Code != 503 {
		t.Errorf("health before Serve: %d", rec.Code)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	drained := make(chan bool, 1)
	served := make(chan error, 1)
	url := "http://" + ln.Addr().String()
	go func() {
		served <- s.Serve(ctx, ln, func(dctx context.Context) error {
			if s.ready.Load() {
				t.Error("health still ready during drain")
			}
			// During the drain the listener stays open: /health and new
			// generation requests answer 503 (with Retry-After), not a
			// refused connection.
			resp, err := http.Get(url + "/health")
			if err != nil {
				t.Errorf("health during drain: %v, want 503", err)
			} else if resp.Body.Close(); resp.StatusCode != 503 {
				t.Errorf("health during drain: %d, want 503", resp.StatusCode)
			}
			resp, err = http.Post(url+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"Once upon a time"}`))
			if err != nil {
				t.Errorf("completion during drain: %v, want 503", err)
			} else if resp.Body.Close(); resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" {
				t.Errorf("completion during drain: %d, Retry-After %q; want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
			}
			_, ok := dctx.Deadline()
			drained <- ok
			return nil
		})
	}()
	var resp *http.Response
	for { // Serve sets ready right after starting to accept
		resp, err = http.Get(url + "/health")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode == 200 {
			break
		}
	}
	resp, err = http.Post(url+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"Once upon a time"}`))
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("completion while serving: %v %v", err, resp)
	}
	resp.Body.Close()
	cancel()
	if err := <-served; err != nil {
		t.Errorf("Serve returned %v after shutdown", err)
	}
	if ok := <-drained; !ok {
		t.Error("drain got no deadline (ShutdownTimeout)")
	}
	if _, err := http.Get(url + "/health"); err == nil {
		t.Error("still accepting connections after shutdown")
	}
}

// TestSlowHeaders: a client that never finishes its headers is
// disconnected after ReadHeaderTimeout (slowloris).
func TestSlowHeaders(t *testing.T) {
	e := testEngine(t, "")
	s, err := New(e, &fakeSub{}, nil, Options{ReadHeaderTimeout: 50 * 1e6})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.Serve(ctx, ln, nil)
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"); err != nil {
		t.Fatal(err)
	}
	// The server closes the connection; without the timeout this read
	// would block until the test binary's own timeout.
	b, _ := io.ReadAll(c)
	if len(b) > 0 && !strings.Contains(string(b), "408") {
		t.Errorf("slow headers answered %q", b)
	}
}

// TestClientDisconnect: a streaming client that goes away cancels its
// request's ctx (the scheduler then frees its blocks); the request is
// logged and counted with status 499.
func TestClientDisconnect(t *testing.T) {
	ts := newTestServer(t, "", Options{})
	ts.sub.hang = true
	statuses := make(chan int, 1)
	ts.s.afterRequest = func(endpoint string, status int) { statuses <- status }
	resp, err := http.Post(ts.url+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"Once upon a time","stream":true,"max_tokens":100}`))
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "data: {") {
		t.Fatalf("first event %q %v", line, err)
	}
	resp.Body.Close()
	ts.sub.wait() // returns only once the request's ctx ended
	ts.sub.mu.Lock()
	stopped := ts.sub.stopped
	ts.sub.mu.Unlock()
	if !stopped {
		t.Fatal("the request's ctx did not end when the client left")
	}
	if st := <-statuses; st != statusClientClosed {
		t.Errorf("status %d, want %d", st, statusClientClosed)
	}
	if m := ts.do(t, "GET", "/metrics", ""); !strings.Contains(string(m.body), `lmpack_http_requests_total{endpoint="completions",status="499"} 1`) {
		t.Errorf("metrics:\n%s", m.body)
	}
}

// TestQwen3ChatTemplate renders the real Qwen3 chat_template (shared
// qwen3-tokenizer's tokenizer_config.json: namespace, reversed slices,
// string methods, loop variables) to the text transformers'
// apply_chat_template produces for these messages with
// add_generation_prompt.
func TestQwen3ChatTemplate(t *testing.T) {
	cfg, err := os.ReadFile(shared.Path(t, "qwen3-tokenizer", "tokenizer_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	src, err := parseChatTemplate(cfg)
	if err != nil || src == "" {
		t.Fatalf("chat_template: %q, %v", src, err)
	}
	tmpl, err := jinja.Compile(src)
	if err != nil {
		t.Fatal(err)
	}
	c := &chatTemplate{t: tmpl, eos: "<|im_end|>"}
	got, err := c.render([]chatMessage{{Role: "system", Content: "You are terse."}, {Role: "user", Content: "Hi"},
		{Role: "assistant", Content: "Hello!"}, {Role: "user", Content: "Bye"}})
	if err != nil {
		t.Fatal(err)
	}
	want := "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n" +
		"<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n"
	if got != want {
		t.Errorf("rendered\n%q\nwant\n%q", got, want)
	}
	// The list form of chat_template picks "default".
	if s, err := parseChatTemplate([]byte(`{"chat_template":[{"name":"tool_use","template":"T"},{"name":"default","template":"D"}]}`)); s != "D" || err != nil {
		t.Errorf("list form: %q %v", s, err)
	}
	if s, err := parseChatTemplate([]byte(`{"bos_token":"<s>"}`)); s != "" || err != nil {
		t.Errorf("no template: %q %v", s, err)
	}
}

// TestHostileInputs: a 10 MB body (default 4 MiB limit), 100,000-token
// prompts (ids and text) and a body that stops arriving get errors.
func TestHostileInputs(t *testing.T) {
	ts := newTestServer(t, "", Options{})
	r := ts.post(t, "/v1/completions", `{"prompt":"`+strings.Repeat("a", 10<<20)+`"}`)
	if r.status != 413 || !strings.Contains(decode[errResp](t, r.body).Error.Message, "4194304 bytes") {
		t.Errorf("10 MB body: %d %s", r.status, r.body)
	}
	ids := "[" + strings.Repeat("403,", 99999) + "403]"
	r = ts.post(t, "/v1/completions", `{"prompt":`+ids+`}`)
	if e := decode[errResp](t, r.body); r.status != 400 || e.Error.Param == nil || *e.Error.Param != "prompt" || !strings.Contains(e.Error.Message, "100000 tokens") {
		t.Errorf("100,000 token ids: %d %s", r.status, r.body)
	}
	r = ts.post(t, "/v1/completions", `{"prompt":"`+strings.Repeat(" a", 100000)+`"}`)
	if e := decode[errResp](t, r.body); r.status != 400 || e.Error.Param == nil || *e.Error.Param != "prompt" || !strings.Contains(e.Error.Message, "512 tokens") {
		t.Errorf("100,000-token text: %d %s", r.status, r.body)
	}
	// A body that stops arriving: 400 once BodyTimeout passes.
	ts = newTestServer(t, "", Options{BodyTimeout: 50 * 1e6})
	c, err := net.Dial("tcp", strings.TrimPrefix(ts.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"prompt\":")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 408 || !strings.Contains(string(b), "did not arrive within 50ms") || strings.Contains(string(b), "127.0.0.1") {
		t.Errorf("stalled body: %d %s", resp.StatusCode, b)
	}
}

// TestShutdownCutsStream: a stream still running when the shutdown
// timeout ends is cut by drain and gets an error event and [DONE]; Serve
// returns nil. The cut request's last event may come 60 ms after the cut,
// three times the 20 ms timeout: handlers get minShutdownGrace after the
// drain however short the timeout (with a quarter of it, 5 ms, the
// connection was closed before the event).
func TestShutdownCutsStream(t *testing.T) {
	for _, delay := range []time.Duration{0, 60 * time.Millisecond} {
		t.Run(delay.String(), func(t *testing.T) { testShutdownCutsStream(t, delay) })
	}
}

func testShutdownCutsStream(t *testing.T, delay time.Duration) {
	e := testEngine(t, "")
	sub := &fakeSub{tokens: lily[:2], hang: true, cut: make(chan struct{}), cutDelay: delay}
	s, err := New(e, sub, nil, Options{ShutdownTimeout: 20 * 1e6})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() {
		served <- s.Serve(ctx, ln, func(dctx context.Context) error {
			<-dctx.Done() // the request does not finish by itself
			close(sub.cut)
			return dctx.Err()
		})
	}()
	resp, err := http.Post("http://"+ln.Addr().String()+"/v1/completions", "application/json",
		strings.NewReader(`{"prompt":"Once upon a time","stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); err != nil || !strings.HasPrefix(line, "data: {") {
		t.Fatalf("first event %q %v", line, err)
	}
	cancel()
	rest, _ := io.ReadAll(br)
	resp.Body.Close()
	if err := <-served; err != nil {
		t.Errorf("Serve: %v", err)
	}
	evs := events(t, append([]byte("data: {}\n\n"), rest[1:]...))
	last := decode[errResp](t, []byte(evs[len(evs)-1]))
	if last.Error.Code == nil || *last.Error.Code != "shutting_down" {
		t.Errorf("stream end after the cut:\n%s", rest)
	}
}

// TestCheapRejection: requests that cannot fit the context are refused
// before the chat template is rendered or the text tokenized (the
// template here raises when rendered, so a rendering shows in the
// error): more messages than the context has tokens, content longer
// than the context can hold in bytes (max_model_len × the longest
// token's bytes × 2), a completions prompt likewise; stop is limited to
// 16 strings of at most 256 bytes.
func TestCheapRejection(t *testing.T) {
	ts := newTestServer(t, `{{ raise_exception("rendered") }}`, Options{})
	lim := ts.s.opt.MaxModelLen * ts.s.maxTokenBytes * textBytesFactor
	if ts.s.maxTokenBytes < 4 || lim >= 1<<20 {
		t.Fatalf("longest token %d bytes, text limit %d", ts.s.maxTokenBytes, lim)
	}
	msgs := "[" + strings.Repeat(`{"role":"user","content":"a"},`, 99999) + `{"role":"user","content":"a"}]`
	for _, c := range []struct {
		name, path, body, param, msg string
	}{
		{"100,000 messages", "/v1/chat/completions", `{"messages":` + msgs + `,"max_tokens":1}`, "messages", "100000 messages"},
		{"long content", "/v1/chat/completions", `{"messages":[{"role":"user","content":"` + strings.Repeat("ab", lim/2+1) + `"}]}`, "messages", "bytes of text"},
		{"long prompt text", "/v1/completions", `{"prompt":"` + strings.Repeat("ab", lim/2+1) + `"}`, "prompt", "bytes of text"},
		{"17 stops", "/v1/completions", `{"prompt":"a","stop":["a","b","c","d","e","f","g","h","i","j","k","l","m","n","o","p","q"]}`, "stop", "at most 16"},
		{"long stop", "/v1/completions", `{"prompt":"a","stop":"` + strings.Repeat("x", 257) + `"}`, "stop", "at most 256"},
		{"long stop in a list", "/v1/completions", `{"prompt":"a","stop":["a","` + strings.Repeat("x", 257) + `"]}`, "stop", "at most 256"},
	} {
		r := ts.post(t, c.path, c.body)
		e := decode[errResp](t, r.body)
		if r.status != 400 || e.Error.Param == nil || *e.Error.Param != c.param || !strings.Contains(e.Error.Message, c.msg) || strings.Contains(e.Error.Message, "rendered") {
			t.Errorf("%s: %d %s, want 400 naming %s with %q, before rendering", c.name, r.status, r.body, c.param, c.msg)
		}
	}
	// Within the limits: the template is rendered (and raises), 16 stops
	// and a 256-byte stop are accepted.
	r := ts.post(t, "/v1/chat/completions", `{"messages":[{"role":"user","content":"`+strings.Repeat("a", lim/4)+`"}]}`)
	if r.status != 400 || !strings.Contains(string(r.body), "rendered") {
		t.Errorf("content within the byte bound: %d %s, want the template's error", r.status, r.body)
	}
	r = ts.post(t, "/v1/completions", `{"prompt":"a","max_tokens":2,"stop":["a1","b","c","d","e","f","g","h","i","j","k","l","m","n","o","`+strings.Repeat("x", 256)+`"]}`)
	if r.status != 200 {
		t.Errorf("16 stops, one of 256 bytes: %d %s", r.status, r.body)
	}
}

// TestBrowserDefaults: POSTs need Content-Type application/json (a
// charset parameter allowed), else 415 naming Content-Type, and an
// uncompressed body, else 415 naming Content-Encoding; on a
// loopback Host the server answers only loopback Host headers (any
// port) and AllowedHosts, else 403 naming Host (DNS rebinding); on
// another Host the check is off.
func TestBrowserDefaults(t *testing.T) {
	ts := newTestServer(t, "", Options{})
	body := `{"prompt":"Once upon a time","max_tokens":2}`
	for _, c := range []struct {
		name   string
		hdr    []string
		status int
		param  string
	}{
		{"text/plain", []string{"Content-Type", "text/plain"}, 415, "Content-Type"},
		{"form", []string{"Content-Type", "application/x-www-form-urlencoded"}, 415, "Content-Type"},
		{"no Content-Type", []string{"Content-Type", ""}, 415, "Content-Type"},
		{"charset", []string{"Content-Type", "application/json; charset=utf-8"}, 200, ""},
		{"gzip", []string{"Content-Encoding", "gzip"}, 415, "Content-Encoding"},
		{"identity", []string{"Content-Encoding", "identity"}, 200, ""},
		{"attacker Host", []string{"Host", "attacker.example"}, 403, "Host"},
		{"attacker Host with port", []string{"Host", "attacker.example:8000"}, 403, "Host"},
		{"localhost", []string{"Host", "localhost:8000"}, 200, ""},
		{"127.0.0.1", []string{"Host", "127.0.0.1"}, 200, ""},
		{"[::1]", []string{"Host", "[::1]:8000"}, 200, ""},
	} {
		r := ts.post(t, "/v1/completions", body, c.hdr...)
		if r.status != c.status {
			t.Errorf("%s: %d %s, want %d", c.name, r.status, r.body, c.status)
			continue
		}
		if c.param != "" {
			if e := decode[errResp](t, r.body); e.Error.Param == nil || *e.Error.Param != c.param {
				t.Errorf("%s: %s, want the error naming %s", c.name, r.body, c.param)
			}
		}
	}
	if r := ts.do(t, "GET", "/health", "", "Host", "evil.example"); r.status != 403 {
		t.Errorf("/health with a foreign Host: %d, want 403", r.status)
	}
	open := newTestServer(t, "", Options{Host: "0.0.0.0"})
	if r := open.post(t, "/v1/completions", body, "Host", "api.example"); r.status != 200 {
		t.Errorf("--host 0.0.0.0, Host api.example: %d %s, want 200 (no check)", r.status, r.body)
	}
	allow := newTestServer(t, "", Options{AllowedHosts: []string{"api.example"}})
	if r := allow.post(t, "/v1/completions", body, "Host", "api.example:443"); r.status != 200 {
		t.Errorf("AllowedHosts api.example: %d %s, want 200", r.status, r.body)
	}
	if r := allow.post(t, "/v1/completions", body, "Host", "other.example"); r.status != 403 {
		t.Errorf("AllowedHosts api.example, Host other.example: %d, want 403", r.status)
	}
}

// TestSmallAPIDetails: the Bearer scheme is case-insensitive (RFC 7235);
// an integer too large for its field is refused naming the range.
func TestSmallAPIDetails(t *testing.T) {
	ts := newTestServer(t, "", Options{APIKeys: [][]byte{[]byte("key1")}})
	body := `{"prompt":"Once upon a time","max_tokens":2}`
	for _, h := range []string{"Bearer key1", "bearer key1", "BEARER key1"} {
		if r := ts.post(t, "/v1/completions", body, "Authorization", h); r.status != 200 {
			t.Errorf("Authorization %q: %d %s, want 200", h, r.status, r.body)
		}
	}
	if r := ts.post(t, "/v1/completions", body, "Authorization", "Basic key1"); r.status != 401 {
		t.Errorf("Authorization Basic: %d, want 401", r.status)
	}
	for _, c := range []struct{ body, param, want string }{
		{`{"prompt":"a","max_tokens":99999999999999999999999}`, "max_tokens", "out of range: want an integer in [-2^53, 2^53]"},
		{`{"prompt":"a","seed":18446744073709551615}`, "seed", "out of range: want an integer in [-2^63, 2^63]"},
	} {
		r := ts.post(t, "/v1/completions", c.body, "Authorization", "Bearer key1")
		if e := decode[errResp](t, r.body); r.status != 400 || e.Error.Param == nil || *e.Error.Param != c.param || !strings.Contains(e.Error.Message, c.want) {
			t.Errorf("%s: %d %s, want 400 naming %s with %q", c.body, r.status, r.body, c.param, c.want)
		}
	}
}
