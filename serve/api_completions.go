package serve

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
)

// completionKeys are the fields POST /v1/completions accepts.
var completionKeys = append(slices.Clone(samplingKeys), "prompt", "logprobs", "echo", "suffix")

// defaultCompletionTokens is max_tokens when a completion request gives
// none: 16, OpenAI's documented default for the legacy completions API.
const defaultCompletionTokens = 16

// completionResponse is OpenAI's text_completion object (and, with
// Object "text_completion" and one choice holding a text delta, each
// streamed chunk).
type completionResponse struct {
	ID      string             `json:"id"`
	Object  string             `json:"object"`
	Created int64              `json:"created"`
	Model   string             `json:"model"`
	Choices []completionChoice `json:"choices"`
	Usage   *usage             `json:"usage,omitempty"`
}

type completionChoice struct {
	Index        int                 `json:"index"`
	Text         string              `json:"text"`
	Logprobs     *completionLogprobs `json:"logprobs"`
	FinishReason *string             `json:"finish_reason"`
}

// completionLogprobs is the legacy logprobs object: per token its text,
// log-probability, the top alternatives (text -> log-probability) and the
// byte offset of its text in the choice's text.
type completionLogprobs struct {
	Tokens        []string             `json:"tokens"`
	TokenLogprobs []float32            `json:"token_logprobs"`
	TopLogprobs   []map[string]float32 `json:"top_logprobs"`
	TextOffset    []int                `json:"text_offset"`
}

type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

func newUsage(r genResult) *usage {
	return &usage{PromptTokens: r.PromptTokens, CompletionTokens: r.CompletionTokens, TotalTokens: r.PromptTokens + r.CompletionTokens}
}

// promptIDs decodes OpenAI's prompt: a string, a list of one string, a
// list of token ids, or a list of one list of token ids. Errors (400,
// param "prompt"): other shapes, several prompts, invalid UTF-8, ids out
// of the vocabulary, an empty id list.
func (s *Server) promptIDs(f fields) ([]int, *apiError) {
	if !f.has("prompt") {
		return nil, badRequest("prompt", `"prompt" is required`)
	}
	raw := f["prompt"]
	if e := checkUTF8("prompt", raw); e != nil {
		return nil, e
	}
	var text string
	if json.Unmarshal(raw, &text) == nil {
		return s.encode(text, "prompt")
	}
	var texts []string
	if json.Unmarshal(raw, &texts) == nil {
		if len(texts) != 1 {
			return nil, unsupported("prompt", fmt.Sprintf("a list of %d prompts; give one prompt per request", len(texts)))
		}
		return s.encode(texts[0], "prompt")
	}
	var ids []int
	if json.Unmarshal(raw, &ids) != nil {
		var lists [][]int
		if json.Unmarshal(raw, &lists) != nil {
			return nil, badRequest("prompt", `"prompt" must be a string, a list of token ids, or a list of one of them; got %s`, preview(raw))
		}
		if len(lists) != 1 {
			return nil, unsupported("prompt", fmt.Sprintf("a list of %d prompts; give one prompt per request", len(lists)))
		}
		ids = lists[0]
	}
	if len(ids) == 0 {
		return nil, badRequest("prompt", `"prompt" token list is empty`)
	}
	for i, id := range ids {
		if id < 0 || id >= s.vocab {
			return nil, badRequest("prompt", `"prompt"[%d] = %d: want a token id in [0, %d)`, i, id, s.vocab)
		}
	}
	return ids, nil
}

// encode tokenizes text as a prompt (special tokens added, as lmpack run
// does; the empty text is BOS alone).
func (s *Server) encode(text, param string) ([]int, *apiError) {
	if e := s.checkTextBytes(len(strings.TrimSpace(text)), param); e != nil {
		return nil, e
	}
	ids, err := s.promptIDsOf(text)
	if err != nil {
		return nil, badRequest(param, "%q: %v", param, err)
	}
	return ids, nil
}

func (s *Server) handleCompletions(w http.ResponseWriter, r *http.Request, info *reqInfo) {
	f, e := s.readBody(w, r)
	if e != nil {
		writeError(w, e)
		return
	}
	if e := f.checkKnown(completionKeys); e != nil {
		writeError(w, e)
		return
	}
	p, e := s.parseSampling(f, "max_tokens")
	if e != nil {
		writeError(w, e)
		return
	}
	if e := f.unsupportedUnless("echo", "echoing the prompt is not implemented", "false"); e != nil {
		writeError(w, e)
		return
	}
	if e := f.unsupportedUnless("suffix", "insertion (suffix) is not implemented", `""`); e != nil {
		writeError(w, e)
		return
	}
	top := -1
	if ok, e := f.getInt("logprobs", &top); e != nil {
		writeError(w, e)
		return
	} else if ok && (top < 0 || top > maxTopLogprobs) {
		writeError(w, badRequest("logprobs", `"logprobs" %d: want an integer in [0, %d]`, top, maxTopLogprobs))
		return
	}
	if !s.acquirePrep(r.Context()) {
		info.status = statusClientClosed
		return
	}
	ids, e := s.promptIDs(f)
	s.releasePrep()
	if e != nil {
		writeError(w, e)
		return
	}
	if s.opt.LogPrompts {
		info.prompt = string(f["prompt"])
	}
	maxTok, e := s.budget(p, len(ids), "prompt", defaultCompletionTokens)
	if e != nil {
		writeError(w, e)
		return
	}
	req := p.request(s.newID("cmpl-"), ids, maxTok, top)
	info.id = req.ID
	created := s.now().Unix()
	base := completionResponse{ID: req.ID, Object: "text_completion", Created: created, Model: s.opt.ModelName}
	logprobs := func(toks []tokOut) *completionLogprobs {
		if top < 0 || toks == nil { // nil: a chunk without tokens (the finish)
			return nil
		}
		lp := &completionLogprobs{Tokens: []string{}, TokenLogprobs: []float32{}, TopLogprobs: []map[string]float32{}, TextOffset: []int{}}
		for _, t := range toks {
			lp.Tokens = append(lp.Tokens, t.Text)
			lp.TokenLogprobs = append(lp.TokenLogprobs, t.Logprob)
			lp.TextOffset = append(lp.TextOffset, t.Offset)
			m := make(map[string]float32, len(t.Top))
			for _, a := range t.Top {
				k := s.altText(t.Prev, a.ID)
				if _, dup := m[k]; !dup {
					m[k] = a.Logprob
				}
			}
			lp.TopLogprobs = append(lp.TopLogprobs, m)
		}
		return lp
	}
	if !p.stream {
		text, all, res, err := s.generateAll(r.Context(), info, req, p.stop)
		if err != nil {
			s.generateFailed(w, info, err)
			return
		}
		resp := base
		if all == nil {
			all = []tokOut{}
		}
		resp.Choices = []completionChoice{{Text: string(text), Logprobs: logprobs(all), FinishReason: &res.Finish}}
		resp.Usage = newUsage(res)
		writeJSON(w, http.StatusOK, resp)
		return
	}
	sse := newSSE(w)
	chunk := func(text string, toks []tokOut, finish *string) any {
		c := base
		c.Choices = []completionChoice{{Text: text, Logprobs: logprobs(toks), FinishReason: finish}}
		return c
	}
	res, err := s.generate(r.Context(), info, req, p.stop, func(t string, toks []tokOut) error {
		if t == "" && len(toks) == 0 {
			return nil
		}
		if toks == nil {
			toks = []tokOut{}
		}
		return sse.send(chunk(t, toks, nil))
	})
	if !sse.started && err != nil {
		s.generateFailed(w, info, err)
		return
	}
	if err != nil {
		sse.fail(s, info, err)
		return
	}
	sse.send(chunk("", nil, &res.Finish))
	if p.includeUsage {
		c := base
		c.Choices = []completionChoice{}
		c.Usage = newUsage(res)
		sse.send(c)
	}
	sse.done()
}
