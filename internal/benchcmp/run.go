package benchcmp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	goruntime "runtime"

	"github.com/lmpack/lmpack/internal/llamacpp"
)

// Prefill and Decode are the run lengths in tokens (llama-bench pp512 and
// tg128); ContextSize is the KV cache both sides allocate.
const (
	Prefill     = 512
	Decode      = 128
	ContextSize = Prefill + Decode
)

// side is one running worker process (lmpack's or llama.cpp's).
type side struct {
	name   string
	cmd    *exec.Cmd
	in     io.WriteCloser
	out    *bufio.Scanner
	stderr bytes.Buffer
}

// startSide starts cmd, sends setup and waits for Ready.
func startSide(name string, cmd *exec.Cmd, setup Setup) (*side, error) {
	s := &side{name: name, cmd: cmd}
	var err error
	if s.in, err = cmd.StdinPipe(); err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = &s.stderr
	s.out = bufio.NewScanner(stdout)
	s.out.Buffer(make([]byte, 1<<20), 1<<24)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("benchcmp: start %s: %w", name, err)
	}
	a, err := s.call(setup)
	if err != nil {
		return nil, err
	}
	if !a.Ready {
		s.kill()
		return nil, fmt.Errorf("benchcmp: %s: no ready answer to the setup (%+v)", name, a)
	}
	return s, nil
}

// call writes one JSON line and reads one answer line.
func (s *side) call(v any) (Answer, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return Answer{}, err
	}
	if _, err := s.in.Write(append(b, '\n')); err != nil {
		s.kill()
		return Answer{}, fmt.Errorf("benchcmp: %s: write request: %w\n%s", s.name, err, s.stderr.String())
	}
	if !s.out.Scan() {
		s.kill()
		return Answer{}, fmt.Errorf("benchcmp: %s: no answer to %s (exit: %v)\n%s", s.name, b[:min(len(b), 80)], s.out.Err(), s.stderr.String())
	}
	var a Answer
	if err := json.Unmarshal(s.out.Bytes(), &a); err != nil {
		s.kill()
		return Answer{}, fmt.Errorf("benchcmp: %s: bad answer %q: %w", s.name, s.out.Text(), err)
	}
	return a, nil
}

// quit asks for the peak RSS and waits for the process to end.
func (s *side) quit() (int64, error) {
	a, err := s.call(Request{Op: "quit"})
	if err != nil {
		return 0, err
	}
	s.in.Close()
	if err := s.cmd.Wait(); err != nil {
		return 0, fmt.Errorf("benchcmp: %s: %w\n%s", s.name, err, s.stderr.String())
	}
	if a.VmHWMKiB <= 0 {
		return 0, fmt.Errorf("benchcmp: %s: no peak RSS in the answer to quit", s.name)
	}
	return a.VmHWMKiB, nil
}

func (s *side) kill() {
	if s.cmd.Process != nil {
		s.cmd.Process.Kill()
		s.cmd.Wait()
	}
}

// Options configures Run.
type Options struct {
	// Config is the synthetic model's shape (Wide for the figures).
	Config Config
	// Formats are the variants to run (names of Formats; nil: all).
	Formats []string
	// Threads are the CPU thread counts (nil: 1 and 2).
	Threads []int
	// Reps is the number of A/B pairs per (format, threads, phase) (>= 1;
	// the issue asks for at least 5), after one untimed warm-up run of
	// each phase on each side.
	Reps int
	// Prefill and Decode are the run lengths (0: the package constants).
	Prefill, Decode int
	// Work is the folder for the checkpoints and GGUF files (created).
	Work string
	// Lmpack returns the command of lmpack's side (a process that runs
	// ServeLmpack on its stdin and stdout).
	Lmpack func() *exec.Cmd
	// Llama is llama.cpp's side (internal/llamacpp.Find); nil runs
	// lmpack's side alone.
	Llama *llamacpp.Runner
	// Log receives a line per finished (format, threads) with its
	// medians (partial results survive an interrupted run); nil: none.
	Log io.Writer
}

// Row is the result of one (format, threads, phase).
type Row struct {
	Format  string `json:"format"`
	Threads int    `json:"threads"`
	Phase   string `json:"phase"` // "prefill" or "decode"
	// Lmpack and Llama are the tokens/s of each run, in run order (Llama
	// empty without llama.cpp); Ratio[i] = Lmpack[i] / Llama[i].
	Lmpack []float64 `json:"lmpack_tokens_per_s"`
	Llama  []float64 `json:"llama_cpp_tokens_per_s,omitempty"`
	Ratio  []float64 `json:"ratio,omitempty"`
	// LmpackRSS and LlamaRSS are the peak RSS (VmHWM, KiB) of each side's
	// process for this (format, threads): both phases and the load.
	LmpackRSS int64 `json:"lmpack_vmhwm_kib"`
	LlamaRSS  int64 `json:"llama_cpp_vmhwm_kib,omitempty"`
}

// Result is a finished comparison.
type Result struct {
	Variants []Variant `json:"variants"`
	Rows     []Row     `json:"rows"`
	// Load are /proc/loadavg's first three fields at the start and at the
	// end; CPUs is runtime.NumCPU.
	LoadStart, LoadEnd string `json:"-"`
	CPUs               int    `json:"cpus"`
	Reps               int    `json:"reps"`
	// Prefill and Decode are the run lengths in tokens.
	Prefill int `json:"prefill_tokens"`
	Decode  int `json:"decode_tokens"`
	// Agree[format] is the number of leading greedy decode ids the two
	// sides share in the first decode run (of Decode).
	Agree map[string]int `json:"greedy_ids_agree"`
	// Load1 is the 1-minute load average at the start.
	Load1 float64 `json:"loadavg_1min_start"`
	// Noisy lists the thread counts >= 2 at which the load at the start
	// left fewer idle cores than threads (llama.cpp's spin-waiting
	// threads then stall on preempted peers).
	Noisy []int `json:"noisy_threads,omitempty"`
}

// LoadAvg returns the first three fields of /proc/loadavg ("" where it
// cannot be read).
func LoadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

// Run prepares the variants (Prepare) and, for every (format, threads),
// starts lmpack's side and llama.cpp's side (test/llamacpp/bench.mjs),
// warms each phase up once on each side, then runs Reps pairs of each
// phase interleaved (lmpack, llama.cpp, lmpack, llama.cpp, ...), both on
// the same prompt (Prefill ids from PCG(1, 2), as runtime's
// BenchmarkPrefill) and decoding greedily from BOS (1). Errors: a bad
// option, a failed preparation, a side that fails or answers out of
// protocol.
func Run(ctx context.Context, opt Options) (*Result, error) {
	if opt.Reps < 1 {
		return nil, fmt.Errorf("benchcmp: reps %d: want >= 1", opt.Reps)
	}
	if opt.Lmpack == nil {
		return nil, fmt.Errorf("benchcmp: Options.Lmpack (the command of lmpack's side) is nil")
	}
	if opt.Formats == nil {
		opt.Formats = Formats
	}
	if opt.Threads == nil {
		opt.Threads = []int{1, 2}
	}
	if opt.Prefill == 0 {
		opt.Prefill = Prefill
	}
	if opt.Decode == 0 {
		opt.Decode = Decode
	}
	ctxSize := opt.Prefill + opt.Decode
	res := &Result{LoadStart: LoadAvg(), CPUs: goruntime.NumCPU(), Reps: opt.Reps, Prefill: opt.Prefill, Decode: opt.Decode, Agree: map[string]int{}}
	var load1 float64
	fmt.Sscan(res.LoadStart, &load1)
	res.Load1 = load1
	for _, th := range opt.Threads {
		if th >= 2 && float64(res.CPUs)-load1 < float64(th) {
			res.Noisy = append(res.Noisy, th)
		}
	}
	vs, err := Prepare(ctx, opt.Work, opt.Config, opt.Formats)
	if err != nil {
		return nil, err
	}
	res.Variants = vs
	rng := rand.New(rand.NewPCG(1, 2))
	prompt := make([]int, opt.Prefill)
	for i := range prompt {
		prompt[i] = rng.IntN(512)
	}
	reqs := map[string]Request{
		"prefill": {Op: "prefill", Tokens: prompt},
		"decode":  {Op: "decode", N: opt.Decode, Start: 1},
	}
	phases := []string{"prefill", "decode"}
	for _, v := range vs {
		for _, th := range opt.Threads {
			rows := map[string]*Row{}
			for _, ph := range phases {
				rows[ph] = &Row{Format: v.Name, Threads: th, Phase: ph}
			}
			var sides []*side
			lm, err := startSide("lmpack", opt.Lmpack(), Setup{Model: v.Dir, Threads: th, ContextSize: ctxSize})
			if err != nil {
				return nil, err
			}
			sides = append(sides, lm)
			if opt.Llama != nil {
				cmd := exec.CommandContext(ctx, opt.Llama.Node, filepath.Join(opt.Llama.Dir, "bench.mjs"))
				cmd.Dir = opt.Llama.Dir
				ll, err := startSide("llama.cpp", cmd, Setup{Model: v.GGUF, Threads: th, ContextSize: ctxSize, BatchSize: opt.Prefill})
				if err != nil {
					lm.kill()
					return nil, err
				}
				sides = append(sides, ll)
			}
			var firstIDs [][]int
			for rep := -1; rep < opt.Reps; rep++ {
				for _, ph := range phases {
					var tps []float64
					for _, s := range sides {
						a, err := s.call(reqs[ph])
						if err != nil {
							for _, s := range sides {
								s.kill()
							}
							return nil, err
						}
						want := len(prompt)
						if ph == "decode" {
							want = opt.Decode
						}
						if a.Op != ph || a.Tokens != want || a.Seconds <= 0 {
							for _, s := range sides {
								s.kill()
							}
							return nil, fmt.Errorf("benchcmp: %s %s threads %d: answer %+v to %s of %d tokens", s.name, v.Name, th, a, ph, want)
						}
						tps = append(tps, float64(a.Tokens)/a.Seconds)
						if rep == -1 && ph == "decode" {
							firstIDs = append(firstIDs, a.IDs)
						}
					}
					if rep < 0 {
						continue // warm-up
					}
					r := rows[ph]
					r.Lmpack = append(r.Lmpack, tps[0])
					if len(tps) == 2 {
						r.Llama = append(r.Llama, tps[1])
						r.Ratio = append(r.Ratio, tps[0]/tps[1])
					}
				}
			}
			if len(firstIDs) == 2 {
				n := 0
				for n < len(firstIDs[0]) && n < len(firstIDs[1]) && firstIDs[0][n] == firstIDs[1][n] {
					n++
				}
				res.Agree[v.Name] = n
			}
			var rss []int64
			for i, s := range sides {
				kib, err := s.quit()
				if err != nil {
					for _, o := range sides[i+1:] {
						o.kill()
					}
					return nil, err
				}
				rss = append(rss, kib)
			}
			for _, ph := range phases {
				r := rows[ph]
				r.LmpackRSS = rss[0]
				if len(rss) == 2 {
					r.LlamaRSS = rss[1]
				}
				res.Rows = append(res.Rows, *r)
			}
			if opt.Log != nil {
				fmt.Fprintf(opt.Log, "%s threads=%d done (%s, loadavg %s):", v.Name, th, time.Now().UTC().Format(time.TimeOnly), LoadAvg())
				for _, ph := range phases {
					r := rows[ph]
					fmt.Fprintf(opt.Log, " %s lmpack %.1f", ph, median(r.Lmpack))
					if len(r.Llama) > 0 {
						fmt.Fprintf(opt.Log, " llama.cpp %.1f ratio %.2f", median(r.Llama), median(r.Ratio))
					}
					fmt.Fprintf(opt.Log, " tok/s;")
				}
				fmt.Fprintf(opt.Log, " peak RSS KiB %v\n", rss)
			}
		}
	}
	res.LoadEnd = LoadAvg()
	return res, nil
}

// median returns the median of x (the mean of the middle two for an even
// count); 0 for none.
func median(x []float64) float64 {
	if len(x) == 0 {
		return 0
	}
	s := slices.Clone(x)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}
