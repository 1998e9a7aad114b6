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

	"github.com/lmpack/lmpack/internal/engine"
	"github.com/lmpack/lmpack/internal/shared"
	"github.com/lmpack/lmpack/runtime/kvcache"
	"github.com/prometheus/client_golang/prometheus"
)

// TestServerOnScheduler: the HTTP layer on the real Scheduler and
// kvcache.Pool with stories260K: 8 concurrent greedy requests (4
// streamed), each with its own prompt, answer the text engine.Generate
// gives for that prompt alone.
func TestServerOnScheduler(t *testing.T) {
	ctx := context.Background()
	e, err := engine.Open(ctx, shared.Path(t, "stories260K-hf"), engine.Options{Threads: 1, Device: "cpu"})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	pool, err := kvcache.NewPool("fp32", kvcache.LayersOf(e.Desc), kvcache.Options{}, 8<<20, 16)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	sched, err := NewScheduler(e.Model, pool, SchedOptions{MaxBatch: 8, MaxPrefillTokens: 64, MaxQueue: 16}, reg)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- sched.Run(runCtx) }()
	defer func() { stop(); <-ran }()
	s, err := New(e, sched, reg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(s.Handler())
	defer hs.Close()
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
