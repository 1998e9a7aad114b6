package main

// Helpers of the end-to-end tests of `lmpack serve`: a server process on
// 127.0.0.1 (the binary TestMain built), raw HTTP and server-sent-event
// clients, and a reader of the Prometheus text on /metrics.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lmpack/lmpack/internal/shared"
)

// serveProc is one running `lmpack serve`.
type serveProc struct {
	cmd    *exec.Cmd
	args   []string
	key    string // Bearer key sent by do and the health check ("" none)
	port   int
	base   string // http://127.0.0.1:PORT
	stderr *syncBuffer
	stdout *syncBuffer
	done   chan struct{}
	err    error // cmd.Wait's error, valid after done is closed
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// healthWait bounds the wait for /health to answer 200 after the start of
// a server: a guard against a hang, not a speed assertion (a tiny model
// loads in milliseconds).
const healthWait = 120 * time.Second

// startServe starts `lmpack serve model args...` on 127.0.0.1 at port (0:
// a free one) with no API keys, waits until GET /health answers 200 and registers a cleanup
// that kills the process if the test has not stopped it. It fails the test
// when the process exits before it is healthy.
func startServe(t testing.TB, port int, model string, args ...string) *serveProc {
	t.Helper()
	return startServeKey(t, port, "", model, args...)
}

// startServeKey is startServe for a server started with --api-key-file in
// args: key is sent as the Bearer key of the health check and of do.
func startServeKey(t testing.TB, port int, key, model string, args ...string) *serveProc {
	t.Helper()
	if port == 0 {
		port = freePort(t)
	}
	all := append([]string{"serve", model, "--host", "127.0.0.1", "--port", strconv.Itoa(port), "--log-format", "json"}, args...)
	s := &serveProc{args: all, key: key, port: port, base: fmt.Sprintf("http://127.0.0.1:%d", port),
		stderr: &syncBuffer{}, stdout: &syncBuffer{}, done: make(chan struct{})}
	s.cmd = exec.Command(lmpackBin, all...)
	if tt, ok := t.(*testing.T); ok {
		s.cmd.Env = isolatedEnv(tt)
	}
	s.cmd.Stdout, s.cmd.Stderr = s.stdout, s.stderr
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { s.err = s.cmd.Wait(); close(s.done) }()
	t.Cleanup(func() {
		select {
		case <-s.done:
		default:
			s.cmd.Process.Kill()
			<-s.done
		}
		if t.Failed() {
			// The server's warnings and errors, for the failure's cause.
			var b strings.Builder
			for _, l := range strings.Split(s.stderr.String(), "\n") {
				if l != "" && !strings.Contains(l, `"level":"INFO"`) {
					b.WriteString(l + "\n")
				}
			}
			t.Logf("lmpack %s: stderr lines above INFO:\n%s", strings.Join(s.args, " "), abbrev(b.String()))
		}
		if strings.Contains(s.stderr.String(), "panic:") {
			t.Errorf("lmpack %s: Go panic in stderr:\n%s", strings.Join(s.args, " "), abbrev(s.stderr.String()))
		}
	})
	deadline := time.Now().Add(healthWait)
	for {
		select {
		case <-s.done:
			t.Fatalf("lmpack %s exited before /health was ready (%v):\n%s", strings.Join(all, " "), s.err, abbrev(s.stderr.String()))
		default:
		}
		req, _ := http.NewRequest("GET", s.base+"/health", nil)
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		if resp, err := http.DefaultClient.Do(req); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return s
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("lmpack %s: /health not 200 after %v:\n%s", strings.Join(all, " "), healthWait, abbrev(s.stderr.String()))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop sends SIGTERM and waits for the exit; it returns the exit code and
// how long the exit took after the signal.
func (s *serveProc) stop(t testing.TB) (int, time.Duration) {
	t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	sent := time.Now()
	<-s.done
	took := time.Since(sent)
	code := 0
	var ee *exec.ExitError
	if errors.As(s.err, &ee) {
		code = ee.ExitCode()
	} else if s.err != nil {
		t.Fatal(s.err)
	}
	return code, took
}

// exited reports whether the process has ended.
func (s *serveProc) exited() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// httpReply is one answered HTTP request.
type httpReply struct {
	status int
	header http.Header
	body   []byte
}

func (r httpReply) String() string {
	return fmt.Sprintf("HTTP %d %s", r.status, abbrev(string(r.body)))
}

// do sends method path with body (nil: none) and the Bearer key (""
// none; "-": the server's key) and reads the whole answer.
func (s *serveProc) do(t testing.TB, method, path, key string, body []byte) httpReply {
	t.Helper()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequest(method, s.base+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if key == "-" {
		key = s.key
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v\nserver stderr:\n%s", method, path, err, abbrev(s.stderr.String()))
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the body: %v", method, path, err)
	}
	return httpReply{status: resp.StatusCode, header: resp.Header, body: b}
}

// postJSON marshals v and POSTs it to path.
func (s *serveProc) postJSON(t testing.TB, path string, v any) httpReply {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return s.do(t, "POST", path, "-", b)
}

// openAIError is the body of an error answer in OpenAI's shape.
type openAIError struct {
	Error *struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    any     `json:"code"`
	} `json:"error"`
}

// wantAPIError fails t unless r has the status and an error body in
// OpenAI's shape ({"error": {"message", "type", "param", "code"}}, all four
// keys present, a non-empty message).
func wantAPIError(t testing.TB, what string, r httpReply, status int) {
	t.Helper()
	if r.status != status {
		t.Errorf("%s: %v, want status %d", what, r, status)
		return
	}
	var raw map[string]map[string]json.RawMessage
	if err := json.Unmarshal(r.body, &raw); err != nil || raw["error"] == nil {
		t.Errorf("%s: body is not {\"error\": {...}}: %v", what, r)
		return
	}
	for _, k := range []string{"message", "type", "param", "code"} {
		if _, ok := raw["error"][k]; !ok {
			t.Errorf("%s: error object lacks %q: %v", what, k, r)
		}
	}
	var e openAIError
	if json.Unmarshal(r.body, &e) != nil || e.Error.Message == "" {
		t.Errorf("%s: error without a message: %v", what, r)
	}
}

// sseResult is one streamed answer read to its end.
type sseResult struct {
	status int
	body   []byte // the whole body when status != 200
	// chunks are the JSON payloads of the data: lines before [DONE].
	chunks []map[string]any
	done   bool // data: [DONE] seen
	// readErr is the error that ended reading (nil: clean EOF).
	readErr error
	// firstToken and tokenTimes are when chunks with text arrived.
	start      time.Time
	tokenTimes []time.Time
}

// streamText is the text of the chunks (completion choices[0].text or chat
// choices[0].delta.content), the finish_reason seen, and the usage chunk.
func (r *sseResult) streamText() (text, finish string, usage map[string]any) {
	var b strings.Builder
	for _, c := range r.chunks {
		if u, ok := c["usage"].(map[string]any); ok {
			usage = u
		}
		ch, _ := c["choices"].([]any)
		if len(ch) == 0 {
			continue
		}
		c0, _ := ch[0].(map[string]any)
		if s, ok := c0["text"].(string); ok {
			b.WriteString(s)
		}
		if d, ok := c0["delta"].(map[string]any); ok {
			if s, ok := d["content"].(string); ok {
				b.WriteString(s)
			}
		}
		if f, ok := c0["finish_reason"].(string); ok && f != "" {
			finish = f
		}
	}
	return b.String(), finish, usage
}

// chunkHasText reports whether a streamed chunk carries generated text.
func chunkHasText(c map[string]any) bool {
	ch, _ := c["choices"].([]any)
	if len(ch) == 0 {
		return false
	}
	c0, _ := ch[0].(map[string]any)
	if s, ok := c0["text"].(string); ok && s != "" {
		return true
	}
	if d, ok := c0["delta"].(map[string]any); ok {
		if s, ok := d["content"].(string); ok && s != "" {
			return true
		}
	}
	return false
}

// stream POSTs body to path with stream true and reads server-sent events
// until [DONE], the end of the body, an error, or ctx's end; onChunk (may
// be nil) sees each chunk and returning false stops reading (the client
// disconnects).
func stream(ctx context.Context, client *http.Client, url string, body map[string]any, onChunk func(n int, c map[string]any) bool) *sseResult {
	body["stream"] = true
	b, _ := json.Marshal(body)
	res := &sseResult{start: time.Now()}
	req, err := http.NewRequestWithContext(ctx, "POST", url, bytes.NewReader(b))
	if err != nil {
		res.readErr = err
		return res
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		res.readErr = err
		return res
	}
	defer resp.Body.Close()
	res.status = resp.StatusCode
	if resp.StatusCode != 200 {
		res.body, _ = io.ReadAll(resp.Body)
		return res
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<16), 1<<24)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "data:") {
			continue
		}
		data := strings.TrimSpace(strings.TrimPrefix(line, "data:"))
		if data == "[DONE]" {
			res.done = true
			continue
		}
		var c map[string]any
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			res.readErr = fmt.Errorf("chunk %d is not JSON: %v: %q", len(res.chunks), err, data)
			return res
		}
		res.chunks = append(res.chunks, c)
		if chunkHasText(c) {
			res.tokenTimes = append(res.tokenTimes, time.Now())
		}
		if onChunk != nil && !onChunk(len(res.chunks), c) {
			return res
		}
	}
	res.readErr = sc.Err()
	return res
}

// metrics reads GET /metrics and returns every sample by its series name
// with labels as written ("lmpack_requests_finished_total{finish=\"stop\"}").
func readMetrics(base string) (map[string]float64, error) {
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return nil, fmt.Errorf("GET /metrics: HTTP %d", resp.StatusCode)
	}
	return parseMetrics(resp.Body)
}

// parseMetrics reads the Prometheus text exposition format (samples
// without timestamps, as client_golang writes them).
func parseMetrics(r io.Reader) (map[string]float64, error) {
	out := map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<16), 1<<22)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			return nil, fmt.Errorf("metrics line %q: no value", line)
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			return nil, fmt.Errorf("metrics line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	return out, sc.Err()
}

// metric returns the sample name (no labels), failing t when absent.
func metric(t testing.TB, m map[string]float64, name string) float64 {
	t.Helper()
	v, ok := m[name]
	if !ok {
		var have []string
		for k := range m {
			if strings.HasPrefix(k, "lmpack_") {
				have = append(have, k)
			}
		}
		t.Fatalf("/metrics has no %s (lmpack series: %v)", name, have)
	}
	return v
}

// chatModel returns a temp folder holding symlinks to the files of the
// shared model dir src and a tokenizer_config.json that is src's plus a
// chat_template ("role: content" lines, then "assistant:"); src is never
// modified.
func chatModel(t *testing.T, src string) string {
	t.Helper()
	dir := t.TempDir()
	ents, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.Name() == "tokenizer_config.json" {
			continue
		}
		if err := os.Symlink(filepath.Join(src, e.Name()), filepath.Join(dir, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(filepath.Join(src, "tokenizer_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	cfg["chat_template"] = chatTemplate
	out, _ := json.MarshalIndent(cfg, "", "  ")
	if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), out, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// chatTemplate is the test's Jinja2 chat template: BOS, "role: content"
// lines, then "assistant:"; renderChat is what it renders to after the BOS
// (add_generation_prompt true), the prompt `lmpack run` gets (run adds the
// BOS itself). Servers tokenize a rendered chat without adding special
// tokens (the template writes them), as transformers and vLLM do.
const chatTemplate = "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"

func renderChat(msgs []map[string]string) string {
	var b strings.Builder
	for _, m := range msgs {
		b.WriteString(m["role"] + ": " + m["content"] + "\n")
	}
	return b.String() + "assistant:"
}

// runGreedy is `lmpack run model --prompt p --temperature 0 --max-tokens n`:
// the generated text and the token counts of its "generation done" log.
func runGreedy(t *testing.T, model, prompt string, n int) (text string, promptTokens, genTokens int) {
	t.Helper()
	r := lmpack(t, nil, "run", model, "--prompt", prompt, "--temperature", "0", "--max-tokens", strconv.Itoa(n), "--threads", "1", "--log-format", "json")
	wantOK(t, r)
	done := findLog(jsonLogLines(t, r.stderr), "generation done")
	if done == nil {
		t.Fatalf("no \"generation done\" log:\n%v", r)
	}
	if !strings.HasSuffix(r.stdout, "\n") {
		t.Fatalf("run's stdout does not end with a newline:\n%v", r)
	}
	return strings.TrimSuffix(r.stdout, "\n"), int(done["prompt_tokens"].(float64)), int(done["generated_tokens"].(float64))
}

// finite reports whether x is a finite number.
func finite(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }

// tiny1mDir is the shared tiny1m Hugging Face directory (head_dim 64,
// context 256).
func tiny1mDir(t *testing.T) string {
	t.Helper()
	shared.Path(t, "tiny1m-hf", "model.safetensors")
	shared.Path(t, "tiny1m-hf", "tokenizer.json")
	return shared.Path(t, "tiny1m-hf")
}
