package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// Fault tests of `lmpack serve`: hostile or broken requests get an HTTP
// error in OpenAI's shape and the server keeps serving; SIGTERM under load
// exits 0 within --shutdown-timeout with every finished stream complete;
// SIGKILL and a restart on the same port serve again.

// wantServing fails t unless a short greedy completion succeeds.
func wantServing(t *testing.T, s *serveProc, after string) string {
	t.Helper()
	r := s.postJSON(t, "/v1/completions", map[string]any{"model": servedName, "prompt": "Once upon a time", "max_tokens": 8, "temperature": 0})
	var c completionResp
	if r.status != 200 || json.Unmarshal(r.body, &c) != nil || len(c.Choices) != 1 || c.Choices[0].Text == "" {
		t.Fatalf("after %s the server does not serve: %v\nstderr:\n%s", after, r, abbrev(s.stderr.String()))
	}
	return c.Choices[0].Text
}

func TestServeBadRequests(t *testing.T) {
	t.Parallel()
	s := startServe(t, 0, modelDir(t), "--served-model-name", servedName, "--threads", "1")
	wantServing(t, s, "start")

	ids := make([]int, 100000)
	for i := range ids {
		ids[i] = 3 + i%500
	}
	idsJSON, _ := json.Marshal(map[string]any{"model": servedName, "prompt": ids, "max_tokens": 4})
	longText, _ := json.Marshal(map[string]any{"model": servedName, "prompt": strings.Repeat("the cat ", 50000), "max_tokens": 4})
	big := append([]byte(`{"model":"`+servedName+`","max_tokens":4,"prompt":"`), bytes.Repeat([]byte("a"), 10<<20)...)
	big = append(big, `"}`...)
	for _, c := range []struct {
		name, path string
		body       []byte
		status     int
		param      string // "" when any (or none)
		mention    string // the message must contain it ("" no check)
	}{
		{"malformed JSON", "/v1/completions", []byte(`{"model": "stories260K", "prompt": "Once`), 400, "", ""},
		{"not an object", "/v1/completions", []byte(`[1, 2, 3]`), 400, "", ""},
		{"wrong type", "/v1/completions", []byte(`{"model":"stories260K","prompt":"x","max_tokens":"many"}`), 400, "max_tokens", ""},
		{"10 MB body", "/v1/completions", big, 413, "", ""},
		{"invalid UTF-8 prompt", "/v1/completions", []byte("{\"model\":\"stories260K\",\"prompt\":\"Once \xff\xfe upon\",\"max_tokens\":4}"), 400, "", "UTF-8"},
		{"invalid UTF-8 chat", "/v1/chat/completions", []byte("{\"model\":\"stories260K\",\"messages\":[{\"role\":\"user\",\"content\":\"hi \xc3\x28\"}],\"max_tokens\":4}"), 400, "", ""},
		{"100,000-token prompt (ids)", "/v1/completions", idsJSON, 400, "", ""},
		{"100,000-token prompt (text)", "/v1/completions", longText, 400, "", ""},
		{"chat without a template", "/v1/chat/completions", []byte(`{"model":"stories260K","messages":[{"role":"user","content":"hi"}],"max_tokens":4}`), 400, "", "chat_template"},
		{"unknown model", "/v1/completions", []byte(`{"model":"gpt-4","prompt":"x","max_tokens":4}`), 404, "", ""},
	} {
		r := s.do(t, "POST", c.path, "", c.body)
		wantAPIError(t, c.name, r, c.status)
		var e openAIError
		if c.param != "" && (json.Unmarshal(r.body, &e) != nil || e.Error == nil || e.Error.Param == nil || *e.Error.Param != c.param) {
			t.Errorf("%s: %v, want param %q", c.name, r, c.param)
		}
		if c.mention != "" && !strings.Contains(string(r.body), c.mention) {
			t.Errorf("%s: %v, want a message naming %q", c.name, r, c.mention)
		}
		wantServing(t, s, c.name)
	}
	if r := s.do(t, "GET", "/v1/completions", "", nil); r.status != 405 {
		t.Errorf("GET /v1/completions: %v, want 405", r)
	}
	if r := s.do(t, "GET", "/no/such/path", "", nil); r.status != 404 {
		t.Errorf("GET /no/such/path: %v, want 404", r)
	}

	// A raw stream: text/event-stream, data: lines, [DONE] last.
	res := stream(context.Background(), http.DefaultClient, s.base+"/v1/completions",
		map[string]any{"model": servedName, "prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}, nil)
	if text, finish, _ := res.streamText(); res.status != 200 || !res.done || res.readErr != nil || finish != "length" || text == "" {
		t.Errorf("raw stream: status %d done %v err %v finish %q text %q", res.status, res.done, res.readErr, finish, text)
	}
	wantServing(t, s, "the bad requests")
}

// TestServeSlowHeaders: a client sending its request headers one byte
// every 200 ms (slowloris) is disconnected by the server's header timeout
// while other clients are served. The test sends at most 30 s of bytes.
func TestServeSlowHeaders(t *testing.T) {
	t.Parallel()
	s := startServe(t, 0, modelDir(t), "--served-model-name", servedName, "--threads", "1")
	conn, err := net.Dial("tcp", strings.TrimPrefix(s.base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	closed := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, conn)
		closed <- err
	}()
	head := "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nX-Slow: " + strings.Repeat("a", 1000)
	start := time.Now()
	const maxSlow = 30 * time.Second
	sent := 0
	for time.Since(start) < maxSlow {
		select {
		case <-closed:
			t.Logf("server closed the slow-header connection after %v (%d header bytes)", time.Since(start).Round(time.Millisecond), sent)
			wantServing(t, s, "a slow-header client")
			return
		case <-time.After(200 * time.Millisecond):
		}
		if _, err := conn.Write([]byte{head[sent%len(head)]}); err != nil {
			t.Logf("write failed after %v (%d header bytes): %v", time.Since(start).Round(time.Millisecond), sent, err)
			wantServing(t, s, "a slow-header client")
			return
		}
		sent++
		if sent == 10 {
			// Others are served meanwhile.
			wantServing(t, s, "a slow-header client started")
		}
	}
	t.Errorf("the server kept a connection sending one header byte per 200 ms open for %v (no header timeout)", maxSlow)
}

// TestServeSIGTERMUnderLoad: SIGTERM while 48 clients stream long
// generations (more work than the drain allows, so some are cut): the
// server exits 0 within --shutdown-timeout, and every stream that ended
// cleanly is complete ([DONE] seen, finish_reason set) or says it was cut
// (an error event in OpenAI's shape, then [DONE], as vLLM ends a failed
// stream): none is silently truncated. A request the shutting-down server
// refuses (503) or no longer accepts (connection refused) is not an
// error; any other status is.
func TestServeSIGTERMUnderLoad(t *testing.T) {
	t.Parallel()
	const timeout = 2 * time.Second
	s := startServe(t, 0, modelDir(t), "--served-model-name", servedName, "--shutdown-timeout", timeout.String(), "--threads", "1")
	// 8 short requests (max_tokens 100 + i) start first, then 40 long
	// ones (400 + i, more work than the drain allows); SIGTERM once every
	// short one and 4 long ones stream text.
	const short, clients, signalAfter = 8, 48, 12
	maxTokens := func(i int) int {
		if i < short {
			return 100 + i
		}
		return 400 + i
	}
	var started sync.WaitGroup
	started.Add(signalAfter)
	var shortStarted sync.WaitGroup
	shortStarted.Add(short)
	var nStarted atomic.Int32
	results := make([]*sseResult, clients)
	var wg sync.WaitGroup
	for i := 0; i < clients; i++ {
		if i == short {
			shortStarted.Wait()
		}
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			once := false
			results[i] = stream(context.Background(), &http.Client{}, s.base+"/v1/completions",
				map[string]any{"model": servedName, "prompt": "Once upon a time", "max_tokens": maxTokens(i), "ignore_eos": true,
					"temperature": 0.8, "seed": i, "stream_options": map[string]any{"include_usage": true}},
				func(n int, c map[string]any) bool {
					if !once && chunkHasText(c) {
						once = true
						if i < short {
							shortStarted.Done()
						}
						if nStarted.Add(1) <= signalAfter {
							started.Done()
						}
					}
					return true
				})
			if !once && i < short {
				shortStarted.Done()
			}
			if !once && nStarted.Add(1) <= signalAfter {
				started.Done()
			}
		}(i)
	}
	started.Wait()
	code, took := s.stop(t)
	wg.Wait()
	t.Logf("exit %d %v after SIGTERM", code, took.Round(time.Millisecond))
	if code != 0 {
		t.Errorf("exit status %d after SIGTERM, want 0:\n%s", code, abbrev(s.stderr.String()))
	}
	// The bound: within the timeout (plus 1 s for the process to
	// end after its drain).
	if took > timeout+time.Second {
		t.Errorf("exited %v after SIGTERM, want within --shutdown-timeout %v", took, timeout)
	}
	complete, cut, errored, refused := 0, 0, 0, 0
	for i, r := range results {
		text, finish, u := r.streamText()
		switch {
		case r.status == 0 || r.status == 503:
			refused++
		case r.status != 200:
			t.Errorf("client %d: HTTP %d %s", i, r.status, r.body)
		case r.readErr == nil && r.done && len(r.chunks) > 0 && r.chunks[len(r.chunks)-1]["error"] != nil:
			errored++
		case r.readErr == nil && (!r.done || finish == ""):
			last, _ := json.Marshal(r.chunks[max(0, len(r.chunks)-2):])
			t.Errorf("client %d: the stream ended cleanly but incomplete: [DONE] %v, finish_reason %q, %d chars; last chunks %s", i, r.done, finish, len(text), last)
		case r.readErr == nil:
			complete++
			if finish != "length" || u == nil || u["completion_tokens"] != float64(maxTokens(i)) {
				t.Errorf("client %d: finish_reason %q usage %v, want length after %d completion tokens (ignore_eos)", i, finish, u, maxTokens(i))
			}
		default:
			cut++
			if cut == 1 {
				t.Logf("client %d: cut: %v", i, r.readErr)
			}
		}
	}
	t.Logf("%d streams complete, %d ended with an error event, %d cut by the shutdown, %d refused", complete, errored, cut, refused)
	if complete < short {
		t.Errorf("%d streams completed, want at least the %d short ones (running when SIGTERM came, %d tokens at most)", complete, short, maxTokens(short-1))
	}
	if _, err := http.Get(s.base + "/health"); err == nil {
		t.Errorf("the port still answers after the exit")
	}
}

// TestServeKillRestart: after SIGKILL a new server on the same port serves
// again, with the same greedy answer.
func TestServeKillRestart(t *testing.T) {
	t.Parallel()
	port := freePort(t)
	s := startServe(t, port, modelDir(t), "--served-model-name", servedName, "--threads", "1")
	// A stream in flight while the process is killed.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	inflight := make(chan *sseResult, 1)
	go func() {
		inflight <- stream(ctx, &http.Client{}, s.base+"/v1/completions", map[string]any{"model": servedName, "prompt": "One day", "max_tokens": 480, "ignore_eos": true}, nil)
	}()
	first := wantServing(t, s, "start")
	if err := s.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-s.done
	if r := <-inflight; r.readErr == nil && r.done {
		t.Logf("the in-flight stream finished before the kill")
	}
	s2 := startServe(t, port, modelDir(t), "--served-model-name", servedName, "--threads", "1")
	if s2.port != port {
		t.Fatalf("restarted on port %d, want %d", s2.port, port)
	}
	if again := wantServing(t, s2, "SIGKILL and restart on port "+strconv.Itoa(port)); again != first {
		t.Errorf("greedy text after restart %q, before %q", again, first)
	}
	if code, took := s2.stop(t); code != 0 {
		t.Errorf("exit %d after SIGTERM (%v)", code, took)
	}
}

// TestServeSignals: SIGHUP starts the graceful drain like SIGTERM (the
// process stays up while streams run, the listener stays open and
// /health answers 503), and a second signal during the drain exits at
// once with 128+SIGTERM = 143.
func TestServeSignals(t *testing.T) {
	t.Parallel()
	s := startServe(t, 0, modelDir(t), "--served-model-name", servedName, "--threads", "1", "--max-batch", "1", "--shutdown-timeout", "120s")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	started := make(chan struct{}, 8)
	for i := 0; i < 8; i++ {
		go stream(ctx, &http.Client{}, s.base+"/v1/completions", map[string]any{"model": servedName, "prompt": "One day", "max_tokens": 480, "ignore_eos": true},
			func(n int, _ map[string]any) bool {
				if n == 1 {
					started <- struct{}{}
				}
				return true
			})
	}
	<-started
	if err := s.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	var health int
	for deadline := time.Now().Add(healthWait); time.Now().Before(deadline) && !s.exited(); time.Sleep(10 * time.Millisecond) {
		if r := s.do(t, "GET", "/health", "", nil); r.status != 200 {
			health = r.status
			break
		}
	}
	if s.exited() || health != 503 {
		t.Fatalf("after SIGHUP: exited %v (%v), /health %d; want a drain with /health 503:\n%s", s.exited(), s.err, health, abbrev(s.stderr.String()))
	}
	code, took := s.stop(t) // the second signal
	if code != 143 {
		t.Errorf("exit %d %v after a second signal during the drain, want 143 at once", code, took)
	}
	t.Logf("second signal: exit %d after %v", code, took.Round(time.Millisecond))
}

// TestServeWindowsCoverContext: a quantized --kv whose fp16 windows cover
// the whole --max-model-len quantizes nothing; serve says so at start
// (a warning naming the windows and the length), and only then.
func TestServeWindowsCoverContext(t *testing.T) {
	t.Parallel()
	const warn = "the KV windows cover the whole max model length"
	covered := startServe(t, 0, modelDir(t), "--served-model-name", servedName, "--threads", "1", "--kv", "int4", "--kv-window", "64,64", "--max-model-len", "128")
	covered.stop(t)
	if out := covered.stderr.String(); !strings.Contains(out, warn) || !strings.Contains(out, `"max_model_len":128`) {
		t.Errorf("--kv int4 --kv-window 64,64 --max-model-len 128: no warning %q with max_model_len 128 in stderr:\n%s", warn, abbrev(out))
	}
	// 127 fp16 tokens of 128: the newest token reads the first 127 exact
	// (windows) and itself exact, so nothing is read quantized either.
	edge := startServe(t, 0, modelDir(t), "--served-model-name", servedName, "--threads", "1", "--kv", "int4", "--kv-window", "100,27", "--max-model-len", "128")
	edge.stop(t)
	if out := edge.stderr.String(); !strings.Contains(out, warn) {
		t.Errorf("--kv int4 --kv-window 100,27 --max-model-len 128: no warning %q in stderr:\n%s", warn, abbrev(out))
	}
	partial := startServe(t, 0, modelDir(t), "--served-model-name", servedName, "--threads", "1", "--kv", "int4", "--kv-window", "100,26", "--max-model-len", "128")
	partial.stop(t)
	if out := partial.stderr.String(); strings.Contains(out, warn) {
		t.Errorf("--kv int4 --kv-window 100,26 --max-model-len 128 (126 of 128 tokens in fp16): unexpected warning %q:\n%s", warn, abbrev(out))
	}
}
