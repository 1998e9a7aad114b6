package benchcmp

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"time"

	"github.com/lmpack/lmpack/internal/engine"
	"github.com/lmpack/lmpack/runtime"
)

// Setup is the first line a side reads: the model to load (lmpack: a
// checkpoint directory; llama.cpp: a GGUF file), the CPU thread count and
// the KV cache length in tokens.
type Setup struct {
	Model       string `json:"model"`
	Threads     int    `json:"threads"`
	ContextSize int    `json:"context_size"`
	BatchSize   int    `json:"batch_size,omitempty"`
}

// Request is one timed run: Op "prefill" (Tokens from an empty cache, in
// one forward pass), "decode" (N single-token steps from an empty cache,
// starting from token Start and feeding back the greedy token) or "quit".
type Request struct {
	Op     string `json:"op"`
	Tokens []int  `json:"tokens,omitempty"`
	N      int    `json:"n,omitempty"`
	Start  int    `json:"start,omitempty"`
}

// Answer is a side's reply: Ready after Setup (LoadSeconds the load's wall
// time); for a run, the tokens processed and Seconds as that side times
// them (lmpack: the wall clock around runtime.Model.Forward calls;
// llama.cpp: its own llama_perf_context timer), WallSeconds the wall clock
// around the whole run, IDs the greedy decode ids; after "quit", VmHWMKiB,
// the process's peak resident set in KiB (/proc/self/status).
type Answer struct {
	Ready       bool    `json:"ready,omitempty"`
	LoadSeconds float64 `json:"load_seconds,omitempty"`
	Op          string  `json:"op,omitempty"`
	Tokens      int     `json:"tokens,omitempty"`
	Seconds     float64 `json:"seconds,omitempty"`
	WallSeconds float64 `json:"wall_seconds,omitempty"`
	IDs         []int   `json:"ids,omitempty"`
	VmHWMKiB    int64   `json:"vmhwm_kib,omitempty"`
}

var vmhwmRE = regexp.MustCompile(`(?m)^VmHWM:\s+(\d+)\s+kB`)

// VmHWMKiB returns this process's peak resident set size in KiB, read
// from /proc/self/status (Linux). Errors: the file or its VmHWM line
// missing.
func VmHWMKiB() (int64, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, fmt.Errorf("benchcmp: peak RSS: %w", err)
	}
	m := vmhwmRE.FindSubmatch(b)
	if m == nil {
		return 0, fmt.Errorf("benchcmp: peak RSS: no VmHWM line in /proc/self/status")
	}
	return strconv.ParseInt(string(m[1]), 10, 64)
}

// ServeLmpack is lmpack's side: it reads a Setup line from r, opens the
// model with engine.Open on the CPU backend with Setup.Threads threads
// and a float32 KV cache of Setup.ContextSize tokens, answers Ready, then
// answers every Request line until "quit" (after which it writes VmHWMKiB
// and returns). Prefill is one Forward of the tokens (logits of the last
// one only); decode is N Forward calls of one token each, the next token
// the argmax of the logits; Seconds sums the wall time of the Forward
// calls only. Errors: malformed lines, a model that does not open, a
// Forward error, a prompt longer than the cache.
func ServeLmpack(ctx context.Context, r io.Reader, w io.Writer) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	enc := json.NewEncoder(w)
	var setup Setup
	if !sc.Scan() {
		return fmt.Errorf("benchcmp: lmpack side: no setup line on stdin")
	}
	if err := json.Unmarshal(sc.Bytes(), &setup); err != nil {
		return fmt.Errorf("benchcmp: lmpack side: setup line: %w", err)
	}
	if setup.Threads < 1 || setup.ContextSize < 2 {
		return fmt.Errorf("benchcmp: lmpack side: setup threads %d, context_size %d: want >= 1 and >= 2", setup.Threads, setup.ContextSize)
	}
	t0 := time.Now()
	e, err := engine.Open(ctx, setup.Model, engine.Options{Threads: setup.Threads, Device: "cpu"})
	if err != nil {
		return fmt.Errorf("benchcmp: lmpack side: %w", err)
	}
	defer e.Close()
	m := e.Model
	c := m.NewCache(setup.ContextSize)
	logits := make([]float32, e.Desc.VocabSize)
	if err := enc.Encode(Answer{Ready: true, LoadSeconds: time.Since(t0).Seconds()}); err != nil {
		return err
	}
	for sc.Scan() {
		var q Request
		if err := json.Unmarshal(sc.Bytes(), &q); err != nil {
			return fmt.Errorf("benchcmp: lmpack side: request %q: %w", sc.Text(), err)
		}
		var a Answer
		switch q.Op {
		case "quit":
			hwm, err := VmHWMKiB()
			if err != nil {
				return err
			}
			return enc.Encode(Answer{VmHWMKiB: hwm})
		case "prefill":
			if len(q.Tokens) < 2 || len(q.Tokens) > setup.ContextSize {
				return fmt.Errorf("benchcmp: lmpack side: prefill of %d tokens: want 2..%d (context_size)", len(q.Tokens), setup.ContextSize)
			}
			c.Truncate(0)
			w0 := time.Now()
			if err := m.Forward(ctx, q.Tokens, c, logits, false); err != nil {
				return fmt.Errorf("benchcmp: lmpack side: prefill: %w", err)
			}
			s := time.Since(w0).Seconds()
			a = Answer{Op: q.Op, Tokens: len(q.Tokens), Seconds: s, WallSeconds: s}
		case "decode":
			if q.N < 1 || q.N > setup.ContextSize {
				return fmt.Errorf("benchcmp: lmpack side: decode of %d tokens: want 1..%d (context_size)", q.N, setup.ContextSize)
			}
			c.Truncate(0)
			tok := []int{q.Start}
			ids := make([]int, 0, q.N)
			var fwd time.Duration
			w0 := time.Now()
			for k := 0; k < q.N; k++ {
				f0 := time.Now()
				if err := m.Forward(ctx, tok, c, logits, false); err != nil {
					return fmt.Errorf("benchcmp: lmpack side: decode step %d: %w", k, err)
				}
				fwd += time.Since(f0)
				tok[0] = runtime.Argmax(logits)
				ids = append(ids, tok[0])
			}
			a = Answer{Op: q.Op, Tokens: q.N, Seconds: fwd.Seconds(), WallSeconds: time.Since(w0).Seconds(), IDs: ids}
		default:
			return fmt.Errorf("benchcmp: lmpack side: op %q: want prefill, decode or quit", q.Op)
		}
		if err := enc.Encode(a); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return fmt.Errorf("benchcmp: lmpack side: stdin closed before quit")
}
