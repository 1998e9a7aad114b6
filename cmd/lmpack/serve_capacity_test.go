package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lmpack/lmpack/internal/shared"
)

// TestServeCapacity is the "capacity at a fixed budget", measured
// by the server's own admission: tiny1m (head_dim 64, context 256) with no
// fp16 windows and --kv-memory set to what fp16 needs for 8 full-context
// sequences (2 bytes × 2 (K, V) × layers × num_key_value_heads × head_dim ×
// 256 × 8). Many full-context requests (prompt + max_tokens = 256,
// ignore_eos) are sent at once; lmpack_running_sequences, once every
// request is either running or queued, is the number admitted. The
// scheduler allocates KV memory on demand (a sequence reserves its prompt
// plus one 16-token block at admission, then grows), so the prompts are
// 240 token ids and max_tokens 16: each reserves its whole context at
// admission, and --max-prefill-tokens 4 keeps the admitted ones
// prefilling (holding that reservation) long enough to be counted. fp16 must
// admit 8; oscar2 (an artifact packed with OSCAR rotations computed on
// calibration data, windows 0,0) at least 6× as many (the bound).
func TestServeCapacity(t *testing.T) {
	t.Parallel()
	model := tiny1mDir(t)
	var cfg struct {
		Layers    int `json:"num_hidden_layers"`
		KVHeads   int `json:"num_key_value_heads"`
		HeadDim   int `json:"head_dim"`
		MaxPos    int `json:"max_position_embeddings"`
		NumHeads  int `json:"num_attention_heads"`
		HiddenDim int `json:"hidden_size"`
	}
	b, err := os.ReadFile(filepath.Join(model, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.HeadDim == 0 {
		cfg.HeadDim = cfg.HiddenDim / cfg.NumHeads
	}
	const ctxLen, fp16Seqs = 256, 8
	if cfg.MaxPos != ctxLen {
		t.Fatalf("tiny1m max_position_embeddings %d, the test is written for %d", cfg.MaxPos, ctxLen)
	}
	budget := int64(2 * 2 * cfg.Layers * cfg.KVHeads * cfg.HeadDim * ctxLen * fp16Seqs)
	t.Logf("tiny1m: %d layers × %d kv heads × head_dim %d; --kv-memory %d bytes (fp16 for %d × %d tokens)",
		cfg.Layers, cfg.KVHeads, cfg.HeadDim, budget, fp16Seqs, ctxLen)

	dir := t.TempDir()
	calib, rot, art := filepath.Join(dir, "calib.safetensors"), filepath.Join(dir, "rot.safetensors"), filepath.Join(dir, "tiny1m-oscar2.lmpk")
	wantOK(t, lmpack(t, nil, "calibrate", model, "--data", shared.Path(t, "tinystories-valid", "calib.txt"), "--tokens", "4096", "-o", calib))
	wantOK(t, lmpack(t, nil, "quantize", "kv", model, "--calib", calib, "-o", rot))
	wantOK(t, lmpack(t, nil, "pack", model, "-o", art, "--kv-rotations", rot, "--kv-cache", "oscar2", "--kv-window", "0,0"))
	// What windows cost: the same with fp16 sink 16 + recent 64 tokens.
	artWin := filepath.Join(dir, "tiny1m-oscar2-w16-64.lmpk")
	wantOK(t, lmpack(t, nil, "pack", model, "-o", artWin, "--kv-rotations", rot, "--kv-cache", "oscar2", "--kv-window", "16,64"))

	const requests = 80
	common := []string{"--served-model-name", servedName, "--kv-memory", strconv.FormatInt(budget, 10), "--max-batch", "256",
		"--max-queue", "256", "--max-model-len", strconv.Itoa(ctxLen), "--threads", "1", "--max-prefill-tokens", "4"}
	fp16 := admitted(t, startServe(t, 0, model, append([]string{"--kv", "fp16"}, common...)...), requests, ctxLen)
	oscar2 := admitted(t, startServe(t, 0, art, common...), requests, ctxLen)
	windowed := admitted(t, startServe(t, 0, artWin, common...), requests, ctxLen)
	t.Logf("full-context sequences admitted at once in %d bytes: fp16 %d, oscar2 %d (%.2f×), oscar2 with fp16 windows 16,64: %d (%.2f×)",
		budget, fp16, oscar2, float64(oscar2)/float64(fp16), windowed, float64(windowed)/float64(fp16))
	if windowed >= oscar2 || windowed < fp16 {
		t.Errorf("oscar2 with fp16 windows 16,64 admitted %d, want fewer than without (%d) and at least fp16's %d", windowed, oscar2, fp16)
	}
	if fp16 != fp16Seqs {
		t.Errorf("fp16 admitted %d full-context sequences, want %d (the budget is fp16's for exactly %d)", fp16, fp16Seqs, fp16Seqs)
	}
	if oscar2 < 6*fp16 {
		t.Errorf("oscar2 admitted %d full-context sequences, want >= 6 × fp16's %d = %d", oscar2, fp16, 6*fp16)
	}
	if oscar2 >= requests {
		t.Errorf("oscar2 admitted all %d requests: send more to measure its capacity", requests)
	}
}

// admitted sends n streaming full-context requests (prompt + max_tokens =
// ctxLen, ignore_eos) at once and returns the most sequences running while
// others waited in the queue; it then disconnects every client and checks
// that the blocks come back.
func admitted(t *testing.T, s *serveProc, n, ctxLen int) int {
	t.Helper()
	prompt := make([]int, ctxLen-16)
	for i := range prompt {
		prompt[i] = 300 + i%100
	}
	r := s.postJSON(t, "/v1/completions", map[string]any{"model": servedName, "prompt": prompt, "max_tokens": 1, "temperature": 0})
	var c completionResp
	if r.status != 200 || json.Unmarshal(r.body, &c) != nil || c.Usage == nil {
		t.Fatalf("probe completion: %v", r)
	}
	maxTokens := ctxLen - c.Usage.PromptTokens
	if maxTokens < 1 || maxTokens > 16 {
		t.Fatalf("prompt of %d tokens leaves max_tokens %d, want 1..16 (one block: the whole context reserved at admission)", c.Usage.PromptTokens, maxTokens)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: n}}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var bad []string
	var finished atomic.Int64 // streams that have ended
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res := stream(ctx, client, s.base+"/v1/completions", map[string]any{"model": servedName, "prompt": prompt,
				"max_tokens": maxTokens, "ignore_eos": true, "temperature": 0}, nil)
			finished.Add(1)
			if res.status != 200 && ctx.Err() == nil {
				mu.Lock()
				bad = append(bad, fmt.Sprintf("HTTP %d %s", res.status, res.body))
				mu.Unlock()
			}
		}()
	}
	// While requests wait in the queue the pool is full (admission is
	// FIFO and a sequence reserves its whole context when admitted), so
	// the most sequences running at such a moment is what the budget
	// admits, whenever the requests arrived. Admission takes scheduler
	// steps (slower on a loaded machine; a request can wait a step
	// before a pool with room admits it), so the reading ends when the
	// running count has held for 30 consecutive readings with a queue
	// (≥ 300 ms: only a full pool keeps a queue that long), or once every
	// request has arrived (running or finished) and none waits: no queue
	// can form after that. Under load requests arrive slowly and early
	// ones finish while others come, so the running count may never hold.
	peak, stable, last := 0.0, 0, -1.0
	end := time.Now().Add(settleWait)
	for {
		m, err := readMetrics(s.base)
		if err != nil {
			t.Fatal(err)
		}
		run, queue := metric(t, m, "lmpack_running_sequences"), metric(t, m, "lmpack_queue_depth")
		if used, total := metric(t, m, "lmpack_kv_bytes_used"), metric(t, m, "lmpack_kv_bytes_total"); used > total {
			t.Errorf("lmpack_kv_bytes_used %v > lmpack_kv_bytes_total %v", used, total)
		}
		if queue > 0 {
			peak = max(peak, run)
			if run == last {
				stable++
			} else {
				stable = 0
			}
			last = run
		} else {
			stable, last = 0, -1
		}
		if stable >= 30 || (queue == 0 && run+float64(finished.Load()) == float64(n) && peak > 0) {
			break
		}
		if queue == 0 && run == float64(n) {
			peak = run
			break
		}
		mu.Lock()
		nbad := len(bad)
		mu.Unlock()
		if nbad > 0 {
			t.Fatalf("%d requests refused, first: %s", nbad, bad[0])
		}
		if time.Now().After(end) {
			t.Fatalf("after %v: running %v, queued %v of %d requests, peak running with a queue %v", settleWait, run, queue, n, peak)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	wg.Wait()
	wantDrained(t, s)
	return int(peak)
}
