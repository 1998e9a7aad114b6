// Command benchcompare is `make bench-compare`: lmpack's runtime and
// llama.cpp side by side on the same weights (package benchcmp). It is a
// developer tool, not part of the lmpack CLI.
//
// Usage:
//
//	go run ./internal/benchcmp/cmd/benchcompare [-reps 5] [-threads 1,2] [-formats F32,Q8_0,Q4_0,Q4_1] [-json FILE] [-work DIR] [-lmpack-only]
//
// It needs test/llamacpp installed (`npm ci` there) unless -lmpack-only.
// With -worker it is lmpack's side of one (format, threads): the protocol
// of benchcmp.ServeLmpack on stdin and stdout.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"

	"github.com/lmpack/lmpack/internal/benchcmp"
	"github.com/lmpack/lmpack/internal/fsx"
	"github.com/lmpack/lmpack/internal/llamacpp"
)

func main() {
	var (
		reps                        int
		threads, formats, work, out string
		worker, lmpackOnly          bool
	)
	flag.IntVar(&reps, "reps", 5, "A/B pairs per (format, threads, phase), after one warm-up")
	flag.StringVar(&threads, "threads", "1,2", "comma-separated CPU thread counts")
	flag.StringVar(&formats, "formats", strings.Join(benchcmp.Formats, ","), "comma-separated formats: "+strings.Join(benchcmp.Formats, ", "))
	flag.StringVar(&work, "work", "", "folder for the checkpoints and GGUF files (default: a temporary folder, removed at the end)")
	flag.StringVar(&out, "json", "", "also write the per-run figures as JSON to this file")
	flag.BoolVar(&lmpackOnly, "lmpack-only", false, "run lmpack's side alone (no llama.cpp)")
	flag.BoolVar(&worker, "worker", false, "internal: serve lmpack's side on stdin/stdout")
	flag.Parse()
	ctx := context.Background()
	if worker {
		if err := benchcmp.ServeLmpack(ctx, os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	if err := run(ctx, reps, threads, formats, work, out, lmpackOnly); err != nil {
		fmt.Fprintln(os.Stderr, "bench-compare:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, reps int, threads, formats, work, out string, lmpackOnly bool) error {
	opt := benchcmp.Options{Config: benchcmp.Wide, Reps: reps, Work: work, Log: os.Stderr}
	for _, f := range strings.Split(threads, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return fmt.Errorf("-threads %q: want comma-separated integers >= 1", threads)
		}
		opt.Threads = append(opt.Threads, n)
	}
	for _, f := range strings.Split(formats, ",") {
		opt.Formats = append(opt.Formats, strings.TrimSpace(f))
	}
	if !lmpackOnly {
		r, err := llamacpp.Find()
		if err != nil {
			return fmt.Errorf("%v (or pass -lmpack-only)", err)
		}
		opt.Llama = r
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	opt.Lmpack = func() *exec.Cmd { return exec.CommandContext(ctx, self, "-worker") }
	if opt.Work == "" {
		d, err := os.MkdirTemp("", "lmpack-bench-compare-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		opt.Work = d
	}
	res, err := benchcmp.Run(ctx, opt)
	if err != nil {
		return err
	}
	if out != "" {
		b, err := json.MarshalIndent(res, "", " ")
		if err != nil {
			return err
		}
		if err := fsx.WriteBytes(out, append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	return benchcmp.WriteTable(os.Stdout, opt.Config, res)
}
