package benchcmp

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
)

// WriteTable prints res as the bench-compare table: one line per (format,
// threads, phase) with each side's median tokens/s, the median and
// [min, max] of the per-pair ratios lmpack / llama.cpp and each side's
// peak RSS in MiB, then the variants' files, how each side was timed, the
// load average and, where the load left fewer idle cores than threads,
// the note that llama.cpp's figures at that thread count are noisy.
func WriteTable(w io.Writer, cfg Config, res *Result) error {
	var b strings.Builder
	fmt.Fprintf(&b, "bench-compare: synthetic Llama (hidden %d, %d layers, %d heads / %d KV heads, FFN %d, vocab 512, tied embeddings); %d interleaved A/B pairs per row after one warm-up of each\n",
		cfg.Hidden, cfg.Layers, cfg.Heads, cfg.KVHeads, cfg.FFN, res.Reps)
	fmt.Fprintf(&b, "machine: %d CPUs; loadavg (1, 5, 15 min) at start %s, at end %s\n\n", res.CPUs, res.LoadStart, res.LoadEnd)
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "format\tthreads\tphase\tlmpack tok/s\tllama.cpp tok/s\tratio\t[min, max]\tlmpack RSS MiB\tllama.cpp RSS MiB\t")
	for _, r := range res.Rows {
		ll, ratio, rng, llRSS := "-", "-", "-", "-"
		if len(r.Llama) > 0 {
			ll = fmt.Sprintf("%.1f", median(r.Llama))
			ratio = fmt.Sprintf("%.2f", median(r.Ratio))
			rng = fmt.Sprintf("[%.2f, %.2f]", slices.Min(r.Ratio), slices.Max(r.Ratio))
			llRSS = fmt.Sprintf("%.0f", float64(r.LlamaRSS)/1024)
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%.1f\t%s\t%s\t%s\t%.0f\t%s\t\n", r.Format, r.Threads, r.Phase, median(r.Lmpack), ll, ratio, rng, float64(r.LmpackRSS)/1024, llRSS)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	b.WriteString("\nweights (lmpack checkpoint -> lmpack's GGUF export of it):\n")
	for _, v := range res.Variants {
		agree := ""
		if n, ok := res.Agree[v.Name]; ok {
			agree = fmt.Sprintf("; greedy decode ids agree for the first %d of %d tokens", n, res.Decode)
		}
		fmt.Fprintf(&b, "  %-5s %s (%.1f MiB safetensors) -> GGUF %s (%.1f MiB): %s%s\n", v.Name, v.Lmpack, float64(v.DirBytes)/(1<<20), v.Name, float64(v.GGUFBytes)/(1<<20), v.Export, agree)
	}
	fmt.Fprintf(&b, `
timing: prefill = %d prompt tokens in one pass from an empty cache (llama-bench pp512 at 512),
decode = %d single-token steps from an empty cache feeding back the greedy token (tg128 at 128);
tok/s = tokens / seconds per run, medians over the runs, ratio = lmpack / llama.cpp per pair.
  lmpack: wall clock (Go time.Now) around runtime.Model.Forward (the sampling argmax excluded),
    CPU backend, float32 KV cache.
  llama.cpp: its own timer (llama_perf_context "prompt eval time" for prefill, "eval time" for
    decode, read via node-llama-cpp's LlamaContext.printTimings; llama_decode only, as
    llama-bench), node-llama-cpp 3.21.1 prebuilt CPU binary, F32 KV cache, no flash attention.
RSS: each side's process peak (VmHWM in /proc/self/status), one process per (format, threads)
holding the model, both phases and all runs.
`, res.Prefill, res.Decode)
	if res.Load1 >= float64(res.CPUs) {
		fmt.Fprintf(&b, "note: the 1-minute load at the start (%.2f) was at or above the %d CPUs: both sides shared the cores with other\nwork; the interleaving exposes them to it alike and the [min, max] ranges show its spread.\n", res.Load1, res.CPUs)
	}
	if len(res.Noisy) > 0 {
		fmt.Fprintf(&b, "note: at the start the load (%s) left fewer idle cores than threads for %v thread(s): llama.cpp's threads\nspin-wait at each graph barrier, so a preempted thread stalls the others; its figures there are noisy.\n",
			res.LoadStart, res.Noisy)
	}
	_, err := io.WriteString(w, b.String())
	return err
}
