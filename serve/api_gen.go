package serve

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"strings"
	"time"
)

// sampling holds the generation parameters common to /v1/completions and
// /v1/chat/completions, as OpenAI names them (top_k, stop_token_ids and
// ignore_eos are vLLM's extensions).
type sampling struct {
	temperature, topP float64
	topK              int
	seed              uint64
	stop              []string
	stopIDs           []int
	ignoreEOS         bool
	// maxTokens is the request's max_tokens (or max_completion_tokens);
	// maxParam names the field it came from, "" when absent.
	maxTokens    int
	maxParam     string
	stream       bool
	includeUsage bool
}

// samplingKeys are the request fields parseSampling reads.
var samplingKeys = []string{"model", "temperature", "top_p", "top_k", "seed", "stop", "stop_token_ids",
	"ignore_eos", "n", "best_of", "stream", "stream_options", "user", "presence_penalty",
	"frequency_penalty", "repetition_penalty", "min_p", "logit_bias", "max_tokens"}

// parseSampling reads the sampling fields of f. maxKeys lists the fields
// that may set the most tokens generated (max_tokens; chat also
// max_completion_tokens). Errors (400) name the field.
func (s *Server) parseSampling(f fields, maxKeys ...string) (*sampling, *apiError) {
	p := &sampling{temperature: 1, topP: 1}
	var model string
	if ok, e := f.getString("model", &model); e != nil {
		return nil, e
	} else if ok && model != s.opt.ModelName {
		return nil, &apiError{Status: http.StatusNotFound, Type: "invalid_request_error", Param: "model", Code: "model_not_found",
			Message: fmt.Sprintf("the model %q does not exist; this server serves %q", model, s.opt.ModelName)}
	}
	if ok, e := f.getFloat("temperature", &p.temperature); e != nil {
		return nil, e
	} else if ok && !(p.temperature >= 0 && p.temperature <= 2) {
		return nil, badRequest("temperature", `"temperature" %g: want a number in [0, 2]`, p.temperature)
	}
	if ok, e := f.getFloat("top_p", &p.topP); e != nil {
		return nil, e
	} else if ok && !(p.topP > 0 && p.topP <= 1) {
		return nil, badRequest("top_p", `"top_p" %g: want a number in (0, 1]`, p.topP)
	}
	if ok, e := f.getInt("top_k", &p.topK); e != nil {
		return nil, e
	} else if ok {
		switch {
		case p.topK == -1: // vLLM: -1 disables top-k
			p.topK = 0
		case p.topK < 0:
			return nil, badRequest("top_k", `"top_k" %d: want -1 or 0 (all tokens) or a count >= 1`, p.topK)
		}
	}
	var seed float64
	if ok, e := f.getFloat("seed", &seed); e != nil {
		return nil, e
	} else if ok {
		if seed != math.Trunc(seed) {
			return nil, badRequest("seed", `"seed" must be an integer, got %s`, preview(f["seed"]))
		}
		if math.Abs(seed) > 1<<63 {
			return nil, badRequest("seed", `"seed" %s is out of range: want an integer in [-2^63, 2^63]`, preview(f["seed"]))
		}
		p.seed = uint64(int64(seed))
	} else {
		p.seed = rand.Uint64()
	}
	var e *apiError
	if p.stop, e = f.stopList(); e != nil {
		return nil, e
	}
	if _, e := f.get("stop_token_ids", &p.stopIDs, "a list of token ids"); e != nil {
		return nil, e
	}
	for i, id := range p.stopIDs {
		if id < 0 || id >= s.vocab {
			return nil, badRequest("stop_token_ids", `"stop_token_ids"[%d] = %d: want a token id in [0, %d)`, i, id, s.vocab)
		}
	}
	if _, e := f.getBool("ignore_eos", &p.ignoreEOS); e != nil {
		return nil, e
	}
	var n int
	if ok, e := f.getInt("n", &n); e != nil {
		return nil, e
	} else if ok && n != 1 {
		return nil, unsupported("n", fmt.Sprintf("n = %d; only one choice per request (n = 1)", n))
	}
	if e := f.unsupportedUnless("best_of", "only best_of = 1", "1"); e != nil {
		return nil, e
	}
	for _, k := range []string{"presence_penalty", "frequency_penalty"} {
		if e := f.unsupportedUnless(k, "only 0 (no penalty)", "0", "0.0"); e != nil {
			return nil, e
		}
	}
	if e := f.unsupportedUnless("min_p", "only 0 (no min-p filtering; temperature, top_p and top_k are supported)", "0", "0.0"); e != nil {
		return nil, e
	}
	if e := f.unsupportedUnless("repetition_penalty", "only 1 (no penalty)", "1", "1.0"); e != nil {
		return nil, e
	}
	if e := f.unsupportedUnless("logit_bias", "token biases are not implemented", "{}"); e != nil {
		return nil, e
	}
	var user string
	if _, e := f.getString("user", &user); e != nil { // accepted and ignored
		return nil, e
	}
	if _, e := f.getBool("stream", &p.stream); e != nil {
		return nil, e
	}
	if f.has("stream_options") {
		if !p.stream {
			return nil, badRequest("stream_options", `"stream_options" is only allowed with "stream": true`)
		}
		so, e := subFields(f, "stream_options")
		if e != nil {
			return nil, e
		}
		if e := so.checkKnownIn("stream_options", []string{"include_usage"}); e != nil {
			return nil, e
		}
		if _, e := so.get("include_usage", &p.includeUsage, "a boolean"); e != nil {
			e.Param = "stream_options.include_usage"
			return nil, e
		}
	}
	for _, k := range maxKeys {
		var m int
		ok, e := f.getInt(k, &m)
		if e != nil {
			return nil, e
		}
		if !ok {
			continue
		}
		if m < 1 {
			return nil, badRequest(k, "%q %d: want at least 1", k, m)
		}
		if p.maxParam != "" && m != p.maxTokens {
			return nil, badRequest(k, "%q %d and %q %d disagree; give one", p.maxParam, p.maxTokens, k, m)
		}
		p.maxTokens, p.maxParam = m, k
	}
	return p, nil
}

// subFields decodes the object-valued field key of f.
func subFields(f fields, key string) (fields, *apiError) {
	var sub fields
	if _, e := f.get(key, &sub, "an object"); e != nil {
		return nil, e
	}
	return sub, nil
}

// checkKnownIn is checkKnown for a nested object, naming "parent.key".
func (f fields) checkKnownIn(parent string, known []string) *apiError {
	if e := f.checkKnown(known); e != nil {
		e.Param = parent + "." + e.Param
		e.Message = fmt.Sprintf("unrecognized argument %q", e.Param)
		return e
	}
	return nil
}

// budget resolves the tokens to generate for a prompt of n tokens: the
// request's max tokens, or def (clipped to what the context leaves) when
// it gives none; def <= 0 means all the context leaves. Errors (400, as
// vLLM words them): a prompt that fills the context (naming promptParam),
// a max tokens beyond the context (naming the field, with both numbers).
func (s *Server) budget(p *sampling, n int, promptParam string, def int) (int, *apiError) {
	limit := s.opt.MaxModelLen
	if n >= limit {
		e := badRequest(promptParam, "this model's maximum context length is %d tokens, but the prompt has %d tokens; nothing can be generated", limit, n)
		e.Code = "context_length_exceeded"
		return 0, e
	}
	left := limit - n
	if p.maxParam != "" {
		if p.maxTokens > left {
			e := badRequest(p.maxParam, "%q is too large: %d. This model's maximum context length is %d tokens and your request has %d input tokens (%d > %d - %d)",
				p.maxParam, p.maxTokens, limit, n, p.maxTokens, limit, n)
			e.Code = "context_length_exceeded"
			return 0, e
		}
		return p.maxTokens, nil
	}
	if def <= 0 || def > left {
		return left, nil
	}
	return def, nil
}

// tokOut is one generated token as the API reports it: Text is the part
// of the completion text that became final with this token (the stream
// decoder's output, "" while bytes are held back), Offset its byte offset
// in the completion text, Prev the token before it (for decoding the
// alternatives in Top).
type tokOut struct {
	ID, Prev int
	Text     string
	Offset   int
	Logprob  float32
	Top      []TokenLogprob
}

// genResult is how a generation ended.
type genResult struct {
	Finish           string // "stop" or "length"
	PromptTokens     int
	CompletionTokens int
}

// errGenerate is a generation that failed after submission (the
// scheduler's "error" event).
var errGenerate = errors.New("serve: generation failed")

// errCut is a request the scheduler cancelled while its client still
// waited: a shutdown past its timeout (Drain) or the scheduler stopping.
var errCut = errors.New("serve: the server cut the request while shutting down")

// submitError maps the Submitter's errors to HTTP errors: 503 with
// Retry-After for a full queue or a shutdown, 400 for a request that can
// never fit (naming max_tokens), 500 otherwise.
func submitError(err error) *apiError {
	switch {
	case errors.Is(err, ErrQueueFull):
		return &apiError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "queue_full", Message: "the server's request queue is full; retry later"}
	case errors.Is(err, ErrShuttingDown):
		return &apiError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "shutting_down", Message: "the server is shutting down"}
	case errors.Is(err, ErrNeverFits):
		e := badRequest("max_tokens", "the prompt plus max_tokens needs more KV cache memory than the server's whole budget (--kv-memory); lower max_tokens or shorten the prompt")
		e.Code = "context_length_exceeded"
		return e
	case errors.Is(err, ErrInvalidRequest):
		return badRequest("", "%v", err)
	case errors.Is(err, ErrTooLong):
		e := badRequest("max_tokens", "the prompt plus max_tokens exceeds the server's maximum model length")
		e.Code = "context_length_exceeded"
		return e
	default:
		return &apiError{Status: http.StatusInternalServerError, Type: "server_error", Message: "internal error"}
	}
}

// generateAll is generate for a response sent whole: the text and the
// tokens of every event, in order, with generate's result and errors.
func (s *Server) generateAll(ctx context.Context, info *reqInfo, req *GenRequest, stops []string) ([]byte, []tokOut, genResult, error) {
	var text []byte
	var all []tokOut
	res, err := s.generate(ctx, info, req, stops, func(t string, toks []tokOut) error {
		text = append(text, t...)
		all = append(all, toks...)
		return nil
	})
	return text, all, res, err
}

// generate submits req and feeds the generated text to sink, with stop
// strings applied: text is detokenized incrementally
// (tokenizer.StreamDecoderAfter the prompt), the earliest occurrence of
// any stop string ends the completion (the stop string and everything
// after it are never passed to sink; text that might be the start of a
// stop string is held back until it is not). The scheduler matches the
// same stop strings on its own decoder (GenRequest.Stop) and finishes the
// request "stop" at the token that completes one; the context is
// cancelled here too, for a Submitter that does not.
// CompletionTokens counts every token sampled up to the stop string's
// end.
// sink gets each newly final piece of text and the tokens whose text it
// completes (a token is passed once all of its text is; at a stop string,
// the tokens that began before it, their text cut there).
// Errors: a Submit error (returned before sink is ever called), ctx's
// end (the client went away), errCut, errGenerate, or sink's error.
func (s *Server) generate(ctx context.Context, info *reqInfo, req *GenRequest, stops []string, sink func(text string, toks []tokOut) error) (genResult, error) {
	res := genResult{PromptTokens: len(req.Prompt)}
	info.promptTokens = len(req.Prompt)
	gctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch, err := s.sub.Submit(gctx, s.withStops(req, stops))
	if err != nil {
		return res, err
	}
	drain := func() {
		go func() {
			for range ch {
			}
		}()
	}
	dec := s.tok.NewStreamDecoderAfter(req.Prompt, true)
	g := stopper{stops: stops}
	for _, st := range stops {
		g.maxStop = max(g.maxStop, len(st))
	}
	prev := req.Prompt[len(req.Prompt)-1]
	for ev := range ch {
		if ev.Finish == "" {
			if res.CompletionTokens == 0 {
				info.ttft = time.Since(info.start)
			}
			res.CompletionTokens++
			info.completionTokens = res.CompletionTokens
			piece := dec.Next(ev.Token)
			g.add(tokOut{ID: ev.Token, Prev: prev, Text: piece, Offset: len(g.text), Logprob: ev.Logprob, Top: ev.Top}, piece)
			prev = ev.Token
			if text, toks, stopped := g.step(false); stopped {
				cancel()
				drain()
				res.Finish = "stop"
				return res, sink(text, toks)
			} else if text != "" || len(toks) > 0 {
				if err := sink(text, toks); err != nil {
					cancel()
					drain()
					return res, err
				}
			}
			continue
		}
		switch ev.Finish {
		case "stop", "length":
			g.addFlush(dec.Flush())
			text, toks, stopped := g.step(true)
			res.Finish = ev.Finish
			if stopped {
				res.Finish = "stop"
			}
			return res, sink(text, toks)
		case "cancelled":
			if ctx.Err() != nil {
				return res, ctx.Err()
			}
			return res, errCut
		default:
			return res, fmt.Errorf("%w: %v", errGenerate, ev.Err)
		}
	}
	return res, fmt.Errorf("%w: the event channel closed without a finish", errGenerate)
}

// stopper applies stop strings to the text of a generation.
type stopper struct {
	stops   []string
	maxStop int
	// text is all the decoded text; sent how much of it went to the sink.
	text []byte
	sent int
	// toks are the tokens not yet passed on (their text not all sent).
	toks []tokOut
}

// add appends a token and its text.
func (g *stopper) add(t tokOut, piece string) {
	g.text = append(g.text, piece...)
	g.toks = append(g.toks, t)
}

// addFlush appends text that belongs to the last token (the decoder's
// flush at the end).
func (g *stopper) addFlush(piece string) {
	g.text = append(g.text, piece...)
	if n := len(g.toks); n > 0 {
		g.toks[n-1].Text += piece
	}
}

// step returns the text that can be sent now and the tokens it completes;
// stopped reports that a stop string was found (the text is then cut
// before it, and the tokens that began before it are returned). final
// releases everything (no more text will come).
func (g *stopper) step(final bool) (text string, toks []tokOut, stopped bool) {
	cut := len(g.text)
	if len(g.stops) > 0 {
		win := string(g.text[g.sent:])
		first := -1
		for _, st := range g.stops {
			if i := strings.Index(win, st); i >= 0 && (first < 0 || i < first) {
				first = i
			}
		}
		if first >= 0 {
			cut, stopped = g.sent+first, true
		} else if !final {
			cut -= g.holdBack(win)
		}
	}
	text = string(g.text[g.sent:cut])
	g.sent = cut
	n := 0
	for n < len(g.toks) {
		t := g.toks[n]
		if stopped {
			if t.Offset >= cut {
				break
			}
			if end := t.Offset + len(t.Text); end > cut {
				t.Text = t.Text[:max(0, cut-t.Offset)]
			}
		} else if t.Offset+len(t.Text) > cut {
			break
		}
		toks = append(toks, t)
		n++
	}
	g.toks = g.toks[n:]
	if stopped {
		g.toks = nil
	}
	return text, toks, stopped
}

// holdBack is the length of the longest suffix of win that is a proper
// prefix of a stop string (it may still grow into one).
func (g *stopper) holdBack(win string) int {
	for k := min(len(win), g.maxStop-1); k > 0; k-- {
		suf := win[len(win)-k:]
		for _, st := range g.stops {
			if strings.HasPrefix(st, suf) {
				return k
			}
		}
	}
	return 0
}
