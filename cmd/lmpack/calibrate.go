package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/lmpack/lmpack/calibrate"
	"github.com/lmpack/lmpack/internal/field"
	"github.com/spf13/cobra"
)

// calibrateFlags names calibrate.Options' fields as flags (field.Rename
// of Validate's errors).
var calibrateFlags = map[string]string{
	"Model": "MODEL", "Data": "--data", "Out": "-o", "Tokens": "--tokens", "Ctx": "--ctx", "Threads": "--threads",
	"AllExperts": "--calibrate-all-experts", "MinExpertTokens": "--min-expert-tokens", "MaxExpertBytes": "--max-expert-memory",
}

func newCalibrateCmd(g *globalFlags) *cobra.Command {
	var (
		opt    calibrate.Options
		asJSON bool
		device string
	)
	cmd := &cobra.Command{
		Use:   "calibrate MODEL --data FILE -o CALIB",
		Short: "Run the model over calibration text and write the statistics compression needs (a calibration file)",
		Long: `calibrate runs MODEL over the first --tokens tokens of a UTF-8 text file and
writes a calibration file (safetensors, float64 statistics, tied to the
model and the data by sha256 fingerprints).

The file is tokenized as one string with BOS prepended and split into
consecutive windows of --ctx tokens, each run from position 0 (as eval does;
--tokens must cover at least one whole window, and the last window may be
shorter). Statistics collected: the OSCAR key and
value covariances C_Q and C_S per layer (two passes over the data), which
"lmpack quantize kv" turns into KV-cache rotations; and the cosine
similarity of every pair of block inputs (lorp.similarity), which
"lmpack prune" uses to choose layers; the mean squared attention output of
every (layer, KV group) (heads.layers.N.proxy, the --head-method proxy
score); and the token ids (calibration.tokens), which prune reruns for
Putri's masked-perplexity head scores and FFN statistics. Memory does not grow with --tokens; the weights stay mapped in the checkpoint's dtype and are converted to float32 one decoder block at a time.

For a mixture-of-experts model it also collects per-expert routing counts
and gate/up and down_proj input Hessians (experts.layers.N.*), one more pass
per group of consecutive MoE layers whose statistics fit --max-expert-memory
bytes (per layer 8·((E+1)·H² + Σ I_e² + 2·Σ I_e·H) bytes: the Hessians and
float64 copies of the gate/up weights; about 8.1e9 for Qwen3-30B-A3B).
Each group is written to a temporary file beside -o and the file is
assembled at the end; the output does not depend on the grouping.
--max-expert-memory 0 collects every layer in one pass in memory. The
report prints the tokens routed to each expert, one row per MoE layer.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if opt.Data == "" {
				return fmt.Errorf("--data FILE is required")
			}
			if opt.Out == "" {
				return fmt.Errorf("-o CALIB is required (the calibration file to write)")
			}
			// 0 means "the model's default" in calibrate.Options; an
			// explicit --ctx 0 is a mistake, not a request for it.
			if err := zeroFlags(cmd, map[string]string{"ctx": ">= 2"}); err != nil {
				return err
			}
			if err := opt.Validate(); err != nil {
				return field.Rename(err, calibrateFlags)
			}
			if err := checkOutput("-o", opt.Out, args[0], opt.Data); err != nil {
				return err
			}
			if err := checkThreads(opt.Threads); err != nil {
				return err
			}
			if err := checkDevice(device); err != nil {
				return err
			}
			// Calibration records activations through the CPU backend's
			// observer hooks.
			if _, err := cpuOnly(device, "calibrate", g.logger); err != nil {
				return err
			}
			opt.Model, opt.Version, opt.Logger = args[0], version, g.logger
			var finish func()
			opt.Progress, finish = newProgress(cmd, g, "calibrate", "calibrate progress (tokens forwarded, all passes)", "forwarded_tokens")
			s, err := calibrate.Run(cmd.Context(), opt)
			finish()
			if err != nil {
				return field.Rename(err, calibrateFlags)
			}
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(s)
			}
			if _, err = fmt.Fprintf(cmd.OutOrStdout(), "wrote %s: %d tokens in %d windows of %d, %.1f tokens/s\n",
				s.Path, s.Tokens, s.Windows, s.Ctx, s.TokensPerSecond); err != nil {
				return err
			}
			if s.ExpertLayers > 0 {
				passes := "passes"
				if s.ExpertPasses == 1 {
					passes = "pass"
				}
				if _, err = fmt.Fprintf(cmd.OutOrStdout(), "expert statistics for %d MoE layers in %d %s; %d experts routed fewer than %d tokens\n",
					s.ExpertLayers, s.ExpertPasses, passes, len(s.SparseExperts), cmp.Or(opt.MinExpertTokens, calibrate.DefaultMinExpertTokens)); err != nil {
					return err
				}
				for _, x := range s.SparseExperts {
					if _, err = fmt.Fprintf(cmd.OutOrStdout(), "  layer %d expert %d: %d tokens\n", x.Layer, x.Expert, x.Routed); err != nil {
						return err
					}
				}
				if err = printRouting(cmd.OutOrStdout(), s.Routing); err != nil {
					return err
				}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&opt.Data, "data", "", "UTF-8 calibration text file")
	f.IntVar(&opt.Tokens, "tokens", 16384, "calibration tokens")
	f.IntVar(&opt.Ctx, "ctx", 0, "window length in tokens (default min(512, max_position_embeddings))")
	f.IntVar(&opt.Threads, "threads", 0, "worker threads (default: all cores)")
	addCPUDeviceFlag(cmd, &device, "calibrate")
	f.StringVarP(&opt.Out, "output", "o", "", "calibration file to write")
	f.BoolVar(&opt.AllExperts, "calibrate-all-experts", false, "MoE: add every token to every expert's Hessians (statistics only)")
	f.IntVar(&opt.MinExpertTokens, "min-expert-tokens", 0, fmt.Sprintf("MoE: report experts routed fewer tokens than this (0: %d)", calibrate.DefaultMinExpertTokens))
	f.Int64Var(&opt.MaxExpertBytes, "max-expert-memory", calibrate.DefaultMaxExpertBytes, "MoE: memory budget of the expert statistics in bytes, one pass per group of layers that fits (0: no limit, one pass)")
	f.BoolVar(&asJSON, "json", false, "print one JSON object")
	return cmd
}

// printRouting writes the routing counts of every MoE layer as a table:
// a header naming the experts, then one row per layer with the tokens
// routed to each expert and the smallest count over the mean (1 for a
// perfectly balanced router).
func printRouting(w io.Writer, rs []calibrate.ExpertRouting) error {
	if len(rs) == 0 {
		return nil
	}
	E := 0
	for _, r := range rs {
		E = max(E, len(r.Routed))
	}
	var b strings.Builder
	b.WriteString("tokens routed per expert (top-k):\nlayer")
	for e := range E {
		fmt.Fprintf(&b, " %7s", fmt.Sprintf("e%d", e))
	}
	b.WriteString("  min/mean\n")
	for _, r := range rs {
		fmt.Fprintf(&b, "%5d", r.Layer)
		var sum, lo int64
		for e, n := range r.Routed {
			fmt.Fprintf(&b, " %7d", n)
			sum += n
			if e == 0 || n < lo {
				lo = n
			}
		}
		ratio := 0.0
		if sum > 0 {
			ratio = float64(lo) * float64(len(r.Routed)) / float64(sum)
		}
		fmt.Fprintf(&b, "  %8.2f\n", ratio)
	}
	_, err := io.WriteString(w, b.String())
	return err
}
