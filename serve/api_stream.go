package serve

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
)

// maxTopLogprobs is the most alternatives logprobs / top_logprobs may ask
// for (OpenAI's limit for chat; vLLM's default limit too).
const maxTopLogprobs = 20

// request builds the scheduler's GenRequest from the parsed parameters.
func (p *sampling) request(id string, ids []int, maxTokens, topLogprobs int) *GenRequest {
	return &GenRequest{
		ID: id, Prompt: ids, MaxTokens: maxTokens, DefaultMaxTokens: p.maxParam == "",
		Temperature: p.temperature, TopP: p.topP, TopK: p.topK, Seed: p.seed,
		StopTokenIDs: p.stopIDs, IgnoreEOS: p.ignoreEOS, TopLogprobs: topLogprobs,
	}
}

// withStops gives req the stop strings for the scheduler to match, with a
// stream decoder of its own after the prompt.
func (s *Server) withStops(req *GenRequest, stops []string) *GenRequest {
	if len(stops) > 0 {
		req.Stop = stops
		req.StopDecoder = s.tok.NewStreamDecoderAfter(req.Prompt, true)
	}
	return req
}

// altText is the text token id adds after token prev: how an alternative
// in top_logprobs reads in place of the sampled token (a SentencePiece
// "▁park" keeps its space).
func (s *Server) altText(prev, id int) string {
	d := s.tok.NewStreamDecoderAfter([]int{prev}, true)
	return d.Next(id) + d.Flush()
}

// generateFailed answers an error of generate before anything was sent:
// the Submit errors by submitError, a client that went away with nothing
// (status 499 in the log, as nginx counts it), anything else 500.
func (s *Server) generateFailed(w http.ResponseWriter, info *reqInfo, err error) {
	var ae *apiError
	switch {
	case errors.As(err, &ae):
		writeError(w, ae)
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		info.status = statusClientClosed
	case errors.Is(err, errCut):
		info.notRejected = true // accepted, then cut by the drain: counted as finished
		writeError(w, &apiError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "shutting_down",
			Message: "the server shut down before the request finished; retry"})
	case errors.Is(err, errGenerate):
		s.logger.Error("generation failed", "id", info.id, "err", err)
		writeError(w, &apiError{Status: http.StatusInternalServerError, Type: "server_error", Message: "the generation failed on the server"})
	default:
		info.notRejected = true
		writeError(w, submitError(err))
	}
}

// sse writes server-sent events: `data: JSON\n\n`, each flushed.
type sse struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	started bool
	err     error
}

func newSSE(w http.ResponseWriter) *sse {
	return &sse{w: w, rc: http.NewResponseController(w)}
}

func (s *sse) start() {
	if s.started {
		return
	}
	s.started = true
	h := s.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	s.w.WriteHeader(http.StatusOK)
}

// send writes one event holding v as JSON and flushes it.
func (s *sse) send(v any) error {
	if s.err != nil {
		return s.err
	}
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return s.raw(b)
}

func (s *sse) raw(b []byte) error {
	s.start()
	msg := make([]byte, 0, len(b)+8)
	msg = append(msg, "data: "...)
	msg = append(msg, b...)
	msg = append(msg, "\n\n"...)
	if _, err := s.w.Write(msg); err != nil {
		s.err = err
		return err
	}
	if err := s.rc.Flush(); err != nil {
		s.err = err
	}
	return s.err
}

// done ends the stream with `data: [DONE]`.
func (s *sse) done() { s.raw([]byte("[DONE]")) }

// fail ends a started stream that failed: an error event in OpenAI's
// shape (as vLLM sends one) and [DONE]; nothing when the client is gone.
func (s *sse) fail(srv *Server, info *reqInfo, err error) {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || s.err != nil {
		info.status = statusClientClosed
		return
	}
	e := &apiError{Status: http.StatusInternalServerError, Type: "server_error", Message: "the generation failed on the server"}
	if errors.Is(err, errCut) {
		e = &apiError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "shutting_down", Message: "the server shut down before the request finished"}
	} else {
		srv.logger.Error("generation failed mid-stream", "id", info.id, "err", err)
	}
	info.status = e.Status
	s.send(e.body())
	s.done()
}
