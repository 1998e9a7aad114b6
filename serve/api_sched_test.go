package serve

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lmpack/lmpack/internal/engine"
	"github.com/lmpack/lmpack/internal/shared"
	"github.com/lmpack/lmpack/runtime"
	"github.com/lmpack/lmpack/runtime/kvcache"
	"github.com/prometheus/client_golang/prometheus"
)

// TestServerOnScheduler: the HTTP layer on the real Scheduler and
// kvcache.Pool with stories260K: 8 concurrent greedy requests (4
// streamed), each with its own prompt, answer the text engine.Generate
// gives for that prompt alone.
func TestServerOnScheduler(t *testing.T) {
	ctx := context.Background()
	st := newSchedServer(t, 8, nil)
	e, pool, hs := st.e, st.pool, st.hs
	prompts := []string{"Once upon a time", "The cat", "Tom and Sue went", "One day, a little", "She was happy", "The sun", "Lily saw a big", "He said"}
	want := make([]string, len(prompts))
	for i, p := range prompts {
		var b strings.Builder
		if _, err := e.Generate(ctx, p, engine.GenerateOptions{MaxTokens: 20, StopAtEOS: true}, func(s string) error {
			b.WriteString(s)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		want[i] = b.String()
	}
	bodies := make([][]byte, len(prompts))
	errs := make([]error, len(prompts))
	var wg sync.WaitGroup
	for i, p := range prompts {
		wg.Add(1)
		go func() { // no t.Fatal off the test goroutine: results are checked below
			defer wg.Done()
			body := fmt.Sprintf(`{"prompt":%q,"max_tokens":20,"temperature":0,"stream":%v}`, p, i%2 == 1)
			resp, err := http.Post(hs.URL+"/v1/completions", "application/json", strings.NewReader(body))
			if err != nil {
				errs[i] = err
				return
			}
			defer resp.Body.Close()
			bodies[i], errs[i] = io.ReadAll(resp.Body)
		}()
	}
	wg.Wait()
	got := make([]string, len(prompts))
	for i := range prompts {
		if errs[i] != nil {
			t.Fatalf("prompt %q: %v", prompts[i], errs[i])
		}
		if i%2 == 0 {
			got[i] = decode[completionResp](t, bodies[i]).Choices[0].Text
			continue
		}
		for _, ev := range events(t, bodies[i]) {
			got[i] += decode[completionResp](t, []byte(ev)).Choices[0].Text
		}
	}
	for i := range prompts {
		if got[i] != want[i] || want[i] == "" {
			t.Errorf("prompt %q: served %q, alone %q", prompts[i], got[i], want[i])
		}
	}
	// Refusals of the HTTP layer count under the scheduler's rejected
	// reasons: a prompt beyond the context (too_long), a malformed field
	// (invalid); nothing else was refused.
	rejected := func() string {
		resp, err := http.Get(hs.URL + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var out []string
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "lmpack_requests_rejected_total{") {
				out = append(out, l)
			}
		}
		return strings.Join(out, "; ")
	}
	long := strings.Repeat("Once upon a time ", 200)
	for _, body := range []string{fmt.Sprintf(`{"prompt":%q}`, long), `{"prompt":"x","temperature":"hot"}`, `{"prompt":"x","max_tokens":100000}`} {
		resp, err := http.Post(hs.URL+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 400 {
			t.Errorf("%.40s…: status %d, want 400", body, resp.StatusCode)
		}
	}
	wantRej := `lmpack_requests_rejected_total{reason="invalid"} 1; lmpack_requests_rejected_total{reason="never_fits"} 0; lmpack_requests_rejected_total{reason="queue_full"} 0; lmpack_requests_rejected_total{reason="shutting_down"} 0; lmpack_requests_rejected_total{reason="too_long"} 2`
	if got := rejected(); got != wantRej {
		t.Errorf("rejected counters:\n got %s\nwant %s", got, wantRej)
	}
	if st := pool.Stats(); st.UsedBytes != 0 || st.Sequences != 0 {
		t.Errorf("pool after the requests: %+v", st)
	}
}

// TestCutNotRejected: requests that Submit accepted and a drain then cut
// (503 shutting_down after they ran) count as finished, not as rejected;
// a request refused by the HTTP layer while draining counts once as
// rejected shutting_down.
func TestCutNotRejected(t *testing.T) {
	ctx := context.Background()
	hm := &hookModel{before: func(int64, []runtime.Seq) error { time.Sleep(10 * time.Millisecond); return nil }}
	st := newSchedServer(t, 1, hm)
	sched, s, reg, hs := st.sched, st.s, st.reg, st.hs
	var wg sync.WaitGroup
	codes := make([]int, 2)
	for i := range codes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := http.Post(hs.URL+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"Once","max_tokens":400,"ignore_eos":true}`))
			if err != nil {
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			codes[i] = resp.StatusCode
		}()
	}
	// Wait until both are accepted: one running, one queued behind
	// MaxBatch 1, and the running one has decoded a few steps.
	gauge := func(name string) float64 {
		mfs, _ := reg.Gather()
		for _, mf := range mfs {
			if mf.GetName() == name && len(mf.GetMetric()) == 1 {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		return -1
	}
	deadline := time.Now().Add(30 * time.Second)
	for !(hm.calls.Load() >= 5 && gauge("lmpack_running_sequences") == 1 && gauge("lmpack_queue_depth") == 1) {
		if time.Now().After(deadline) {
			t.Fatalf("the two requests were not running and queued within 30 s (calls %d)", hm.calls.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
	s.draining.Store(true)
	dctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	sched.Drain(dctx)
	wg.Wait()
	resp, err := http.Post(hs.URL+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if codes[0] != 503 || codes[1] != 503 || resp.StatusCode != 503 {
		t.Fatalf("statuses %v and %d after the drain, want 503s (cut, and refused while draining)", codes, resp.StatusCode)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var rejected, finished float64
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			switch mf.GetName() {
			case "lmpack_requests_rejected_total":
				rejected += m.GetCounter().GetValue()
			case "lmpack_requests_finished_total":
				finished += m.GetCounter().GetValue()
			}
		}
	}
	if rejected != 1 || finished != 2 {
		t.Errorf("rejected %g, finished %g: want 1 (the POST while draining) and 2 (the cut requests)", rejected, finished)
	}
}

// TestEncoded: a body is encoded when any Content-Encoding line names a
// coding other than identity.
func TestEncoded(t *testing.T) {
	for _, c := range []struct {
		vals []string
		want string
	}{
		{nil, ""}, {[]string{"identity"}, ""}, {[]string{" IDENTITY "}, ""}, {[]string{"identity,"}, ""},
		{[]string{"gzip"}, "gzip"}, {[]string{"identity, gzip"}, "identity, gzip"},
		{[]string{"identity", "gzip"}, "identity, gzip"}, {[]string{"", "br"}, ", br"},
	} {
		h := http.Header{}
		for _, v := range c.vals {
			h.Add("Content-Encoding", v)
		}
		if got := encoded(h); got != c.want {
			t.Errorf("Content-Encoding %q: encoded %q, want %q", c.vals, got, c.want)
		}
	}
}

// schedServer is the HTTP layer on a running Scheduler over stories260K's
// model and an fp32 kvcache.Pool of 8 MiB (newSchedServer).
type schedServer struct {
	e     *engine.Engine
	pool  *kvcache.Pool
	reg   *prometheus.Registry
	sched *Scheduler
	s     *Server
	hs    *httptest.Server
}

// newSchedServer starts it with a batch of maxBatch sequences; hm, when
// not nil, wraps the model (its Model field is set here). Everything is
// stopped at the end of the test.
func newSchedServer(t *testing.T, maxBatch int, hm *hookModel) *schedServer {
	t.Helper()
	e, err := engine.Open(context.Background(), shared.Path(t, "stories260K-hf"), engine.Options{Threads: 1, Device: "cpu"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	pool, err := kvcache.NewPool("fp32", kvcache.LayersOf(e.Desc), kvcache.Options{}, 8<<20, 16)
	if err != nil {
		t.Fatal(err)
	}
	var m runtime.Model = e.Model
	if hm != nil {
		hm.Model = e.Model
		m = hm
	}
	reg := prometheus.NewRegistry()
	sched, err := NewScheduler(m, pool, SchedOptions{MaxBatch: maxBatch, MaxPrefillTokens: 64, MaxQueue: 16}, reg)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- sched.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-ran })
	s, err := New(e, sched, reg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(s.Handler())
	t.Cleanup(hs.Close)
	return &schedServer{e: e, pool: pool, reg: reg, sched: sched, s: s, hs: hs}
}
