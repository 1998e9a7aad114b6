package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/lmpack/lmpack/compress"
	"github.com/lmpack/lmpack/eval"
	"github.com/lmpack/lmpack/model"
	"github.com/lmpack/lmpack/prune"
	"github.com/spf13/cobra"
)

func newCompressCmd(g *globalFlags) *cobra.Command {
	var (
		opt        compress.Options
		recipePath string
		asJSON     bool
	)
	cmd := &cobra.Command{
		Use:   "compress MODEL --recipe RECIPE.yaml -o OUT.lmpk [--work-dir DIR] [--data FILE] [--eval-data FILE] [--json]",
		Short: "Run a compression recipe (calibrate, prune, quantize weights and KV, pack, eval) and write one artifact",
		Long: `compress runs the stages of RECIPE.yaml over MODEL: calibrate, prune layers,
prune width (head groups and FFN units, on a calibration of the
layer-pruned model), quantize weights (RTN or GPTQ), quantize the KV cache
(on the quantized model), pack and eval, and writes OUT.lmpk when the eval gate
passes (ΔPPL in percent of the source model's perplexity within the
recipe's max_delta_ppl_pct, and KL within max_kl). A failed
gate exits with status 3 and writes no OUT.

Stage outputs are cached in --work-dir (default OUT.lmpk.work) under keys
that fingerprint the model, the data files, the lmpack version and the
recipe up to that stage: an interrupted run resumes at the stage it was in,
and a changed recipe section recomputes that stage and the later ones only.
Data paths in the recipe are relative to the recipe file; --data and
--eval-data override them. MODEL and the data files are never modified.
Prints the eval table, or with --json the full report (sizes, bits per
weight, KV bits per element at the eval and the serving context, PPL and KL
deltas, seconds per stage).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if recipePath == "" {
				return fmt.Errorf("--recipe RECIPE.yaml is required")
			}
			if opt.Out == "" {
				return fmt.Errorf("-o OUT.lmpk is required")
			}
			if err := checkOutput("-o", opt.Out, args[0], recipePath, opt.Data, opt.EvalData); err != nil {
				return err
			}
			if _, err := os.Stat(opt.Out); err == nil {
				if !model.IsArtifact(opt.Out) {
					return fmt.Errorf("-o %s: exists and is not an lmpack artifact; refusing to overwrite it", opt.Out)
				}
			}
			if err := checkThreads(opt.Threads); err != nil {
				return err
			}
			r, err := compress.LoadRecipe(recipePath)
			if err != nil {
				return err
			}
			opt.Model, opt.Recipe, opt.RecipePath, opt.Version, opt.Logger = args[0], r, recipePath, version, g.logger
			type bar struct {
				report func(done, total int)
				finish func()
			}
			bars := map[string]*bar{}
			var last *bar
			opt.Progress = func(stage string, done, total int) {
				b := bars[stage]
				if b == nil {
					if last != nil {
						last.finish()
					}
					b = &bar{}
					// Calibration stages count tokens forwarded over all
					// their passes (calibrate, prune-width:calibrate,
					// quantize-weights:calibrate); quantize-kv tokens.
					unit := "forwarded_tokens"
					switch stage {
					case "eval":
						unit = "windows"
					case "quantize-weights", "prune-width":
						unit = "steps"
					case "quantize-kv":
						unit = "tokens"
					}
					b.report, b.finish = newProgress(cmd, g, stage, stage+" progress", unit)
					bars[stage] = b
					last = b
				}
				b.report(done, total)
			}
			rep, err := compress.Run(cmd.Context(), opt)
			if last != nil {
				last.finish()
			}
			if rep != nil {
				if asJSON {
					if jerr := json.NewEncoder(cmd.OutOrStdout()).Encode(rep); jerr != nil {
						return errors.Join(err, jerr)
					}
				} else if werr := writeCompressTable(cmd, rep); werr != nil {
					return errors.Join(err, werr)
				}
			}
			if errors.Is(err, compress.ErrGate) {
				return &exitError{code: exitGate, err: err}
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&recipePath, "recipe", "", "recipe file (YAML; see recipes/)")
	f.StringVarP(&opt.Out, "output", "o", "", "artifact file to write (.lmpk)")
	f.StringVar(&opt.WorkDir, "work-dir", "", "stage cache directory (default OUT.lmpk.work: the output path with .work added)")
	f.StringVar(&opt.Data, "data", "", "calibration text file (overrides calibrate.data)")
	f.StringVar(&opt.EvalData, "eval-data", "", "evaluation text file (overrides eval.data)")
	f.IntVar(&opt.Threads, "threads", 0, "worker threads (default: all cores)")
	f.BoolVar(&asJSON, "json", false, "print the report as one JSON object")
	return cmd
}

// exitGate is the exit status of a failed eval gate (compress.ErrGate).
const exitGate = 3

// exitError carries a specific exit status out of a command.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// writeCompressTable prints the stages, sizes, gate verdict and output,
// then the eval table (perplexity, ΔPPL, KL, top-1 agreement, KV bits
// per element at the eval context and at the serving context).
func writeCompressTable(cmd *cobra.Command, r *compress.Report) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%-16s %-7s %9s\n", "stage", "cached", "seconds")
	for _, s := range r.Stages {
		fmt.Fprintf(&b, "%-16s %-7v %9.2f\n", s.Name, s.Cached, s.Seconds)
	}
	for _, s := range r.Stages {
		if s.Name != "prune-layers" {
			continue
		}
		// The depth plan as prune's report gives it: which blocks went,
		// and the rule that chose them when LoRP's clustering was
		// degenerate (prune.Report.Fallback).
		var pr prune.Report
		if json.Unmarshal(s.Result, &pr) == nil {
			layers := make([]string, len(pr.Removed))
			for i, l := range pr.Removed {
				layers[i] = strconv.Itoa(l.Layer)
			}
			fmt.Fprintf(&b, "prune-layers: %s removed layers [%s]\n", pr.Method, strings.Join(layers, " "))
			if pr.Fallback != "" {
				fmt.Fprintf(&b, "prune-layers: fallback %s: %s\n", pr.Fallback, pr.FallbackReason)
			}
		}
	}
	z := r.Sizes
	fmt.Fprintf(&b, "size %d -> %d bytes (%.2fx), %d -> %d params, %.2f bits/param (whole file), lz4 saved %d bytes, kv cache %s\n",
		z.SourceTensorBytes, z.ArtifactBytes, z.Ratio, z.SourceParams, z.Params, z.BitsPerWeight, z.LZ4SavedBytes, r.KVCache)
	if r.WeightsMethod != "" {
		fmt.Fprintf(&b, "weights %s, %.3f bits per quantized weight (codes, scales, zero-points)", r.WeightsMethod, r.WeightsBitsPerWeight)
		if r.ExpertBitsPerWeight > 0 {
			fmt.Fprintf(&b, ", routed experts %.3f", r.ExpertBitsPerWeight)
		}
		b.WriteString("\n")
	}
	if g := r.Gate; g != nil {
		if g.Passed {
			// Only the bounds the recipe sets (0: no bound; "max_kl 0"
			// would read as a bound).
			var bounds []string
			if g.MaxDeltaPPLPct > 0 {
				bounds = append(bounds, fmt.Sprintf("max_delta_ppl_pct %g", g.MaxDeltaPPLPct))
			}
			if g.MaxKL > 0 {
				bounds = append(bounds, fmt.Sprintf("max_kl %g", g.MaxKL))
			}
			if len(bounds) == 0 {
				bounds = append(bounds, "no bound set: eval.max_delta_ppl_pct and eval.max_kl are unset")
			}
			kl := ""
			if r.Eval != nil {
				kl = fmt.Sprintf(", KL %.5f", r.Eval.KL)
			}
			fmt.Fprintf(&b, "gate passed (ΔPPL %s%% of the source perplexity%s; %s)\n", eval.Signed(g.DeltaPPLPct, 2), kl, strings.Join(bounds, ", "))
		} else {
			fmt.Fprintf(&b, "gate FAILED: %s\n", strings.Join(g.Failures, "; "))
		}
	}
	if r.Written {
		fmt.Fprintf(&b, "wrote %s: %d bytes, sha256 %s\n", r.Out, z.ArtifactBytes, r.SHA256)
	}
	if e := r.Eval; e != nil {
		// kv_bits at the eval context (e.Ctx tokens cached, measured) and
		// at the serving context (as eval --kv's bits@N column).
		serving := fmt.Sprintf("kv_bits@%d", e.ServingCtx)
		w := max(8, len(serving))
		fmt.Fprintf(&b, "\n%-10s %10s %10s %9s %9s %8s %8s %*s\n", "model", "perplexity", "delta_ppl", "kl", "top1", "kv", "kv_bits", w, serving)
		fmt.Fprintf(&b, "%-10s %10.4f %10s %9s %9s %8s %8.2f %*.2f\n", "source", e.SourcePerplexity, "", "", "", "fp32", 32.0, w, 32.0)
		fmt.Fprintf(&b, "%-10s %10.4f %10s %9.5f %9.4f %8s %8.2f %*.2f\n", "artifact", e.Perplexity, eval.Signed(e.DeltaPPL, 4), e.KL, e.Top1Agreement, e.KVCache, e.KVBitsPerElement, w, e.KVBitsPerElementServing)
	}
	_, err := fmt.Fprint(cmd.OutOrStdout(), b.String())
	return err
}
