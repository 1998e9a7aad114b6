package serve

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"os"
	"path/filepath"
	goruntime "runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ardanlabs/jinja"
	"github.com/lmpack/lmpack/formats/tokenizer"
	"github.com/lmpack/lmpack/internal/engine"
	"github.com/lmpack/lmpack/internal/fsx"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Defaults of Options.
const (
	DefaultHost              = "127.0.0.1"
	DefaultPort              = 8000
	DefaultMaxBodyBytes      = 4 << 20
	DefaultShutdownTimeout   = 30 * time.Second
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultBodyTimeout       = 60 * time.Second
	DefaultIdleTimeout       = 120 * time.Second
)

// shutdownGrace is the most of ShutdownTimeout that Serve keeps, after
// the drain, for handlers to answer the requests drain cut (at most a
// quarter of the timeout).
const shutdownGrace = 2 * time.Second

// minShutdownGrace is the least time Serve gives handlers, after the
// drain, to answer the requests it cut, even past a ShutdownTimeout too
// short to hold it: with a 50 ms timeout the quarter (12.5 ms) left most
// of 32 cut requests on a 2-core machine without their 503 or error event
// (connection closed without a response).
const minShutdownGrace = 250 * time.Millisecond

// statusClientClosed is the status logged (and counted) for a request
// whose client went away before an answer (nginx's 499).
const statusClientClosed = 499

// Options configures the HTTP server. Zero values take the defaults
// above.
type Options struct {
	// Host and Port are where cmd/lmpack listens (Serve takes a
	// listener; New only checks them). Host defaults to 127.0.0.1 (the
	// loopback interface only), Port to 8000.
	Host string
	Port int
	// AllowedHosts are the Host header names (without port) accepted
	// besides the loopback ones. When Host is a loopback address or
	// "localhost" the server answers 403 to a Host header that is neither
	// a loopback name or address (localhost, 127.0.0.0/8, [::1], any
	// port) nor in AllowedHosts: a web page that rebinds its own DNS name
	// to 127.0.0.1 sends its name as Host, so it cannot reach the server
	// (DNS rebinding). For another Host the check is off unless
	// AllowedHosts is set.
	AllowedHosts []string
	// APIKeys, when any, are the accepted Bearer keys for /v1/ paths
	// (/health and /metrics stay open, as in vLLM); each is compared in
	// constant time (SHA-256 digests, crypto/subtle) against every key.
	APIKeys [][]byte
	// MaxBodyBytes bounds a request body in bytes (413 beyond it).
	MaxBodyBytes int64
	// ModelName is the served model id (/v1/models, the "model" field);
	// default: the base name of the model directory or artifact (without
	// ".lmpk").
	ModelName string
	// MaxModelLen bounds prompt + generated tokens; default and maximum:
	// the model's max_position_embeddings (engine.DefaultContextLimit
	// when config.json gives none).
	MaxModelLen int
	// LogPrompts adds the prompt text to each request's log line.
	LogPrompts bool
	// ShutdownTimeout bounds the graceful shutdown in Serve.
	ShutdownTimeout time.Duration
	// ReadHeaderTimeout bounds reading a request's headers (slowloris),
	// BodyTimeout reading its body, IdleTimeout a kept-alive connection
	// waiting for the next request.
	ReadHeaderTimeout, BodyTimeout, IdleTimeout time.Duration
	// Logger gets one line per request; nil discards them.
	Logger *slog.Logger
}

// Server is the OpenAI-compatible HTTP layer over a Submitter. It is safe
// for concurrent use.
type Server struct {
	opt    Options
	e      *engine.Engine
	tok    *tokenizer.Tokenizer
	vocab  int
	sub    Submitter
	reg    *prometheus.Registry
	chat   *chatTemplate // nil: the model has no chat_template
	keys   [][sha256.Size]byte
	logger *slog.Logger
	ready  atomic.Bool
	// checkHost: refuse Host headers outside loopback and AllowedHosts.
	checkHost bool
	// draining: a shutdown started; new generation requests get 503
	// with Retry-After while the listener stays open.
	draining atomic.Bool
	// requests counts answered requests by endpoint and status.
	requests *prometheus.CounterVec
	now      func() time.Time
	handler  http.Handler
	// maxTokenBytes is the longest token's text in bytes (at least 4, a
	// UTF-8 character: byte fallback and unknown characters), for the
	// cheap bound on prompt text (checkTextBytes).
	maxTokenBytes int
	// prep bounds the requests rendering a chat template or tokenizing at
	// once (runtime.NumCPU slots), so a flood of large bodies cannot
	// take every core and all memory.
	prep chan struct{}
	// afterRequest, when set (tests), is called with each request's
	// final status once it is counted.
	afterRequest func(endpoint string, status int)
}

// New builds the server for the opened model e (its tokenizer, its
// description for the context length and vocabulary, the chat_template of
// its tokenizer_config.json read from the checkpoint directory or from the
// artifact's embedded copy) over sub. HTTP metrics are registered on reg
// (a new registry when nil) and /metrics serves all of reg. The server is
// not ready (/health 503) until Serve runs.
// Errors: a MaxModelLen beyond the model's context, a negative limit, an
// unreadable tokenizer_config.json or a chat_template that does not
// compile (naming the file), a metric already registered on reg.
func New(e *engine.Engine, sub Submitter, reg *prometheus.Registry, opt Options) (*Server, error) {
	if e == nil || e.Tokenizer == nil || e.Desc == nil {
		return nil, errors.New("serve: New needs an engine with a tokenizer and a model description")
	}
	if sub == nil {
		return nil, errors.New("serve: New needs a Submitter")
	}
	if opt.Host == "" {
		opt.Host = DefaultHost
	}
	if opt.Port == 0 {
		opt.Port = DefaultPort
	}
	if opt.Port < 0 || opt.Port > 65535 {
		return nil, fmt.Errorf("serve: port %d: want 0..65535", opt.Port)
	}
	for _, d := range []struct {
		v    *time.Duration
		def  time.Duration
		name string
	}{{&opt.ShutdownTimeout, DefaultShutdownTimeout, "shutdown timeout"}, {&opt.ReadHeaderTimeout, DefaultReadHeaderTimeout, "read header timeout"},
		{&opt.BodyTimeout, DefaultBodyTimeout, "body timeout"}, {&opt.IdleTimeout, DefaultIdleTimeout, "idle timeout"}} {
		if *d.v < 0 {
			return nil, fmt.Errorf("serve: %s %v: want > 0", d.name, *d.v)
		}
		if *d.v == 0 {
			*d.v = d.def
		}
	}
	if opt.MaxBodyBytes < 0 {
		return nil, fmt.Errorf("serve: max body bytes %d: want > 0", opt.MaxBodyBytes)
	}
	if opt.MaxBodyBytes == 0 {
		opt.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if opt.ModelName == "" {
		opt.ModelName = strings.TrimSuffix(filepath.Base(e.Dir), ".lmpk")
	}
	ctxLen := e.Desc.MaxPositionEmbeddings
	if ctxLen <= 0 {
		ctxLen = engine.DefaultContextLimit
	}
	switch {
	case opt.MaxModelLen < 0:
		return nil, fmt.Errorf("serve: max model length %d: want > 0", opt.MaxModelLen)
	case opt.MaxModelLen == 0:
		opt.MaxModelLen = ctxLen
	case opt.MaxModelLen > ctxLen:
		return nil, fmt.Errorf("serve: max model length %d exceeds the model's context %d (max_position_embeddings)", opt.MaxModelLen, ctxLen)
	}
	if opt.Logger == nil {
		opt.Logger = slog.New(slog.DiscardHandler)
	}
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	s := &Server{opt: opt, e: e, tok: e.Tokenizer, vocab: max(e.Desc.VocabSize, e.Tokenizer.VocabSize()), sub: sub, reg: reg, logger: opt.Logger, now: time.Now}
	for _, k := range opt.APIKeys {
		s.keys = append(s.keys, sha256.Sum256(k))
	}
	s.prep = make(chan struct{}, goruntime.NumCPU())
	s.checkHost = isLoopbackName(opt.Host) || len(opt.AllowedHosts) > 0
	s.maxTokenBytes = 4
	for id := 0; id < s.tok.VocabSize(); id++ {
		s.maxTokenBytes = max(s.maxTokenBytes, len(s.tok.Decode([]int{id}, false)), len(s.tok.Token(id)))
	}
	tmpl, err := readChatTemplate(e)
	if err != nil {
		return nil, err
	}
	if tmpl != "" {
		t, err := jinja.Compile(tmpl)
		if err != nil {
			return nil, fmt.Errorf("serve: %s: tokenizer_config.json: chat_template does not compile: %w", e.Dir, err)
		}
		s.chat = &chatTemplate{t: t}
		if id, ok := s.tok.BOS(); ok {
			s.chat.bos = s.tok.Token(id)
		}
		if id, ok := s.tok.EOS(); ok {
			s.chat.eos = s.tok.Token(id)
		}
	}
	s.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lmpack_http_requests_total",
		Help: "HTTP requests answered, by endpoint and status code (499: the client went away).",
	}, []string{"endpoint", "status"})
	if err := reg.Register(s.requests); err != nil {
		return nil, fmt.Errorf("serve: registering lmpack_http_requests_total: %w", err)
	}
	s.handler = s.buildHandler()
	return s, nil
}

// readChatTemplate reads chat_template from the model's
// tokenizer_config.json ("" when the file or the field is absent).
func readChatTemplate(e *engine.Engine) (string, error) {
	var cfg []byte
	var err error
	if e.Artifact != nil {
		cfg, err = e.Artifact.File("tokenizer_config.json")
	} else {
		cfg, err = fsx.ReadFile(filepath.Join(e.Dir, "tokenizer_config.json"))
	}
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("serve: %s: %w", e.Dir, err)
	}
	t, err := parseChatTemplate(cfg)
	if err != nil {
		return "", fmt.Errorf("serve: %s: %w", e.Dir, err)
	}
	return t, nil
}

// Options returns the options in force (defaults filled in).
func (s *Server) Options() Options { return s.opt }

// HasChatTemplate reports whether /v1/chat/completions can render
// messages for this model.
func (s *Server) HasChatTemplate() bool { return s.chat != nil }

// promptIDsOf encodes a completion prompt as lmpack run does.
func (s *Server) promptIDsOf(text string) ([]int, error) { return s.e.PromptIDs(text) }

// newID is prefix followed by 24 random hex digits.
func (s *Server) newID(prefix string) string {
	var b [12]byte
	rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// reqInfo is what a request's log line reports.
type reqInfo struct {
	id, endpoint, prompt string
	status               int
	// notRejected: the request is not an HTTP-layer refusal to count in
	// lmpack_requests_rejected_total: Submit refused it (and counted
	// that), or Submit accepted it and it ran (a drain that cut it is a
	// finish, not a refusal).
	notRejected                    bool
	promptTokens, completionTokens int
	start                          time.Time
	ttft                           time.Duration
}

// route is one endpoint.
type route struct {
	method   string
	endpoint string // the metric label
	auth     bool
	h        func(http.ResponseWriter, *http.Request, *reqInfo)
}

// Handler is the server's http.Handler: POST /v1/completions, POST
// /v1/chat/completions, GET /v1/models, GET /health, GET /metrics; JSON
// errors for unknown paths (404) and wrong methods (405); a panic in one
// request answers 500 for it (when nothing was written yet) and is
// logged with its stack.
func (s *Server) Handler() http.Handler { return s.handler }

func (s *Server) buildHandler() http.Handler {
	metrics := promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{})
	routes := map[string]route{
		"/v1/completions":      {http.MethodPost, "completions", true, s.handleCompletions},
		"/v1/chat/completions": {http.MethodPost, "chat_completions", true, s.handleChat},
		"/v1/models":           {http.MethodGet, "models", true, s.handleModels},
		"/health":              {http.MethodGet, "health", false, s.handleHealth},
		"/metrics": {http.MethodGet, "metrics", false, func(w http.ResponseWriter, r *http.Request, _ *reqInfo) {
			metrics.ServeHTTP(w, r)
		}},
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Every request's log line has an id; generation requests replace
		// it with their cmpl-/chatcmpl- id.
		info := &reqInfo{start: s.now(), endpoint: "other", id: s.newID("req-")}
		rec := &recorder{ResponseWriter: w}
		defer s.finish(rec, r, info)
		if s.checkHost && !s.hostAllowed(r.Host) {
			rec.Header().Set("Connection", "close") // the body is not read
			writeError(rec, &apiError{Status: http.StatusForbidden, Type: "invalid_request_error", Param: "Host", Code: "host_not_allowed",
				Message: fmt.Sprintf("Host header %q is not allowed: this server listens on %s and accepts loopback names (localhost, 127.0.0.1, [::1]) and --allowed-hosts only (DNS rebinding protection)", r.Host, s.opt.Host)})
			return
		}
		rt, ok := routes[r.URL.Path]
		if !ok && strings.HasPrefix(r.URL.Path, "/v1/models/") {
			rt, ok = route{http.MethodGet, "models", true, s.handleModel}, true
		}
		if !ok {
			if len(s.keys) > 0 && strings.HasPrefix(r.URL.Path, "/v1/") && !s.authorized(r) {
				s.unauthorized(rec)
				return
			}
			writeError(rec, &apiError{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "not_found", Message: fmt.Sprintf("no endpoint %s", strconv.Quote(r.URL.Path))})
			return
		}
		info.endpoint = rt.endpoint
		if r.Method != rt.method && !(rt.method == http.MethodGet && r.Method == http.MethodHead) {
			rec.Header().Set("Allow", rt.method)
			writeError(rec, &apiError{Status: http.StatusMethodNotAllowed, Type: "invalid_request_error", Code: "method_not_allowed",
				Message: fmt.Sprintf("%s %s: method not allowed; use %s", r.Method, r.URL.Path, rt.method)})
			return
		}
		if rt.auth && len(s.keys) > 0 && !s.authorized(r) {
			s.unauthorized(rec)
			return
		}
		if rt.method == http.MethodPost && !jsonContentType(r.Header.Get("Content-Type")) {
			// A browser's "simple" cross-origin POST (text/plain, forms)
			// needs no preflight: refusing it stops CSRF on the API.
			rec.Header().Set("Connection", "close") // the body is not read
			writeError(rec, &apiError{Status: http.StatusUnsupportedMediaType, Type: "invalid_request_error", Param: "Content-Type", Code: "unsupported_media_type",
				Message: fmt.Sprintf("Content-Type %q: want application/json", r.Header.Get("Content-Type"))})
			return
		}
		if ce := encoded(r.Header); rt.method == http.MethodPost && ce != "" {
			// A compressed body would otherwise reach the JSON decoder
			// and be refused as invalid JSON at byte 0.
			rec.Header().Set("Connection", "close") // the body is not read
			writeError(rec, &apiError{Status: http.StatusUnsupportedMediaType, Type: "invalid_request_error", Param: "Content-Encoding", Code: "unsupported_media_type",
				Message: fmt.Sprintf("Content-Encoding %q: request bodies must be uncompressed JSON (identity)", ce)})
			return
		}
		if s.draining.Load() && rt.method == http.MethodPost {
			rec.Header().Set("Connection", "close")
			writeError(rec, submitError(ErrShuttingDown))
			return
		}
		rt.h(rec, r, info)
	})
}

// encoded returns the request's Content-Encoding when it names a coding
// other than identity (every header line, every comma-separated element;
// empty elements ignored), "" when the body is not encoded.
func encoded(h http.Header) string {
	vals := h.Values("Content-Encoding")
	for _, v := range vals {
		for _, c := range strings.Split(v, ",") {
			if c = strings.TrimSpace(c); c != "" && !strings.EqualFold(c, "identity") {
				return strings.Join(vals, ", ")
			}
		}
	}
	return ""
}

// finish recovers a panic of the handler, counts and logs the request.
func (s *Server) finish(rec *recorder, r *http.Request, info *reqInfo) {
	if p := recover(); p != nil {
		if p == http.ErrAbortHandler {
			panic(p)
		}
		s.logger.Error("panic in request handler", "id", info.id, "endpoint", info.endpoint, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
		if !rec.wrote {
			writeError(rec, &apiError{Status: http.StatusInternalServerError, Type: "server_error", Message: "internal server error"})
		}
		info.status = http.StatusInternalServerError
	}
	status := info.status
	if status == 0 {
		status = rec.status
	}
	if status == 0 {
		status = http.StatusOK
	}
	s.requests.WithLabelValues(info.endpoint, strconv.Itoa(status)).Inc()
	if rc, ok := s.sub.(RejectCounter); ok && !info.notRejected && (info.endpoint == "completions" || info.endpoint == "chat_completions") {
		switch {
		case status == http.StatusBadRequest && rec.errCode == "context_length_exceeded":
			rc.CountRejected("too_long")
		case status == http.StatusBadRequest:
			rc.CountRejected("invalid")
		case status == http.StatusServiceUnavailable && rec.errCode == "shutting_down":
			rc.CountRejected("shutting_down")
		}
	}
	if s.afterRequest != nil {
		s.afterRequest(info.endpoint, status)
	}
	if info.endpoint == "health" || info.endpoint == "metrics" {
		return // probes would flood the log
	}
	attrs := []any{"id", info.id, "endpoint", info.endpoint, "method", r.Method, "status", status,
		"prompt_tokens", info.promptTokens, "completion_tokens", info.completionTokens,
		"ttft_ms", float64(info.ttft.Microseconds()) / 1000, "duration_ms", float64(s.now().Sub(info.start).Microseconds()) / 1000}
	if s.opt.LogPrompts && info.prompt != "" {
		attrs = append(attrs, "prompt", info.prompt)
	}
	s.logger.Info("request", attrs...)
}

// authorized checks the Bearer key against every configured key, in
// constant time for each (no early exit).
func (s *Server) authorized(r *http.Request) bool {
	h := r.Header.Get("Authorization")
	// The scheme is case-insensitive (RFC 7235 §2.1).
	scheme, key, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return false
	}
	d := sha256.Sum256([]byte(strings.TrimSpace(key)))
	match := 0
	for i := range s.keys {
		match |= subtle.ConstantTimeCompare(d[:], s.keys[i][:])
	}
	return match == 1
}

func (s *Server) unauthorized(w http.ResponseWriter) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="lmpack"`)
	writeError(w, &apiError{Status: http.StatusUnauthorized, Type: "invalid_request_error", Code: "invalid_api_key",
		Message: "missing or invalid API key: send Authorization: Bearer KEY"})
}

// readBody reads the request body (at most MaxBodyBytes, within
// BodyTimeout) and decodes its JSON object. Errors: 413 for a body over
// the limit, 408 for one that does not arrive within BodyTimeout, 400 for
// a body that cannot be read otherwise or is not one JSON object.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) (fields, *apiError) {
	rc := http.NewResponseController(w)
	rc.SetReadDeadline(time.Now().Add(s.opt.BodyTimeout))
	mw := w // the server's own writer, so that a body over the limit closes the connection
	if u, ok := w.(interface{ Unwrap() http.ResponseWriter }); ok {
		mw = u.Unwrap()
	}
	body, err := io.ReadAll(http.MaxBytesReader(mw, r.Body, s.opt.MaxBodyBytes))
	if err != nil {
		// The rest of the body is not read: close the connection after the
		// answer (net/http would otherwise try to drain it first).
		w.Header().Set("Connection", "close")
	} else {
		rc.SetReadDeadline(time.Time{}) // no deadline while generating: see Serve
	}
	if err != nil {
		var mb *http.MaxBytesError
		if errors.As(err, &mb) {
			return nil, &apiError{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error", Code: "request_too_large",
				Message: fmt.Sprintf("request body exceeds the server's limit of %d bytes", mb.Limit)}
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return nil, &apiError{Status: http.StatusRequestTimeout, Type: "invalid_request_error", Code: "request_timeout",
				Message: fmt.Sprintf("the request body did not arrive within %s", s.opt.BodyTimeout)}
		}
		return nil, badRequest("", "reading the request body: %v", err)
	}
	return parseBody(body)
}

type modelObject struct {
	ID          string `json:"id"`
	Object      string `json:"object"`
	Created     int64  `json:"created"`
	OwnedBy     string `json:"owned_by"`
	MaxModelLen int    `json:"max_model_len"`
}

func (s *Server) model() modelObject {
	return modelObject{ID: s.opt.ModelName, Object: "model", Created: 0, OwnedBy: "lmpack", MaxModelLen: s.opt.MaxModelLen}
}

func (s *Server) handleModels(w http.ResponseWriter, r *http.Request, _ *reqInfo) {
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": []modelObject{s.model()}})
}

// handleModel is GET /v1/models/{id}: the model, or 404 naming the id.
func (s *Server) handleModel(w http.ResponseWriter, r *http.Request, _ *reqInfo) {
	id := strings.TrimPrefix(r.URL.Path, "/v1/models/")
	if id != s.opt.ModelName {
		writeError(w, &apiError{Status: http.StatusNotFound, Type: "invalid_request_error", Param: "model", Code: "model_not_found",
			Message: fmt.Sprintf("the model %q does not exist; this server serves %q", id, s.opt.ModelName)})
		return
	}
	writeJSON(w, http.StatusOK, s.model())
}

// handleHealth answers 200 once Serve runs and until shutdown starts,
// 503 otherwise.
func (s *Server) handleHealth(w http.ResponseWriter, r *http.Request, _ *reqInfo) {
	if !s.ready.Load() {
		writeError(w, &apiError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "not_ready", Message: "the server is not ready"})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// recorder remembers the status a handler wrote.
type recorder struct {
	http.ResponseWriter
	status int
	wrote  bool
	// errCode is the code of the error answered (writeError), "" if none.
	errCode string
}

func (r *recorder) WriteHeader(code int) {
	if !r.wrote {
		r.status, r.wrote = code, true
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *recorder) Write(b []byte) (int, error) {
	if !r.wrote {
		r.status, r.wrote = http.StatusOK, true
	}
	return r.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach Flush and the deadlines.
func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// Serve answers HTTP on ln until ctx ends, then shuts down gracefully:
// while drain (the scheduler's: stop admitting, finish or cut the running
// requests) runs with a deadline of ShutdownTimeout, the listener stays
// open: /health answers 503, new generation requests 503 with
// Retry-After (and Connection: close; keep-alives are off), so a load
// balancer sees the server leave instead of a refused connection (the
// Kubernetes readiness pattern). A request cut at the timeout answers
// 503, or an error event in a stream. After drain the HTTP server shuts
// down (listener closed), waiting shutdownGrace for the open requests to
// send their last events, all within ShutdownTimeout (or, when a quarter
// of it is shorter than minShutdownGrace, up to minShutdownGrace past the
// drain); connections still open then are closed. It
// returns nil after a shutdown, or the error that stopped serving
// otherwise.
//
// The http.Server has ReadHeaderTimeout (slowloris) and IdleTimeout; a
// body must arrive within BodyTimeout (a per-request read deadline, set
// in readBody and lifted before generating: http.Server's ReadTimeout
// would stay in force while a response streams and cancel it).
func (s *Server) Serve(ctx context.Context, ln net.Listener, drain func(context.Context) error) error {
	hs := &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: s.opt.ReadHeaderTimeout,
		IdleTimeout:       s.opt.IdleTimeout,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(s.logger.Handler(), slog.LevelWarn),
	}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	s.ready.Store(true)
	s.logger.Info("serving", "addr", ln.Addr().String(), "model", s.opt.ModelName, "max_model_len", s.opt.MaxModelLen)
	select {
	case err := <-errc:
		s.ready.Store(false)
		return err
	case <-ctx.Done():
	}
	s.ready.Store(false)
	s.draining.Store(true)
	hs.SetKeepAlivesEnabled(false)
	s.logger.Info("shutting down", "timeout", s.opt.ShutdownTimeout.String())
	// The whole shutdown fits in ShutdownTimeout: the drain gets all of it
	// but the grace that the requests it cut need to send their last
	// events (shutdownGrace, at most a quarter of the timeout).
	grace := min(shutdownGrace, s.opt.ShutdownTimeout/4)
	end := time.Now().Add(s.opt.ShutdownTimeout)
	sctx, cancel := context.WithDeadline(context.Background(), end.Add(-grace))
	defer cancel()
	if drain != nil {
		if err := drain(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
			s.logger.Warn("drain", "err", err)
		}
	}
	// The requests drain cut (or that finished) still send their last
	// events within shutdownGrace.
	hctx, hcancel := context.WithDeadline(context.Background(), later(end, time.Now().Add(minShutdownGrace)))
	defer hcancel()
	if err := hs.Shutdown(hctx); err != nil {
		s.logger.Warn("requests still open at the shutdown timeout were cut", "err", err)
		hs.Close()
	}
	<-errc // http.ErrServerClosed
	s.logger.Info("shut down")
	return nil
}

// acquirePrep takes one of the prep slots (template rendering and
// tokenization), waiting while all are taken; it returns false when ctx
// ends first (the client went away).
func (s *Server) acquirePrep(ctx context.Context) bool {
	select {
	case s.prep <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	}
}

func (s *Server) releasePrep() { <-s.prep }

// textBytesFactor is the slack of checkTextBytes over the plain bound:
// tokenizer normalizers may shorten text a little (Unicode composition),
// so text is refused only beyond twice what the context can hold.
const textBytesFactor = 2

// checkTextBytes refuses, before any template rendering or tokenizing,
// text of n bytes that cannot fit the context: every token covers at most
// maxTokenBytes bytes of text, so more than MaxModelLen × maxTokenBytes ×
// textBytesFactor bytes need more tokens than the context holds (400
// naming param, code context_length_exceeded).
func (s *Server) checkTextBytes(n int, param string) *apiError {
	if limit := s.opt.MaxModelLen * s.maxTokenBytes * textBytesFactor; n > limit {
		e := badRequest(param, "%q holds %d bytes of text; this model's maximum context length is %d tokens of at most %d bytes each, so it cannot fit (limit %d bytes)",
			param, n, s.opt.MaxModelLen, s.maxTokenBytes, limit)
		e.Code = "context_length_exceeded"
		return e
	}
	return nil
}

// jsonContentType reports whether a Content-Type header is
// application/json, parameters (charset) allowed.
func jsonContentType(v string) bool {
	mt, _, err := mime.ParseMediaType(v)
	return err == nil && mt == "application/json"
}

// isLoopbackName reports whether host (no port) is "localhost" or a
// loopback IP address.
func isLoopbackName(host string) bool {
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// hostAllowed reports whether a request's Host header (with or without a
// port) is a loopback name or address or one of AllowedHosts.
func (s *Server) hostAllowed(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	if isLoopbackName(host) {
		return true
	}
	for _, a := range s.opt.AllowedHosts {
		if strings.EqualFold(a, host) {
			return true
		}
	}
	return false
}

// later returns the later of two times.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
