package main

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/lmpack/lmpack/internal/field"
	"github.com/lmpack/lmpack/quantize/oscar"
	"github.com/lmpack/lmpack/quantize/wquant"
	"github.com/spf13/cobra"
)

func newQuantizeCmd(g *globalFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "quantize",
		Short: "Quantize weights, or compute KV-cache transforms, from a calibration file",
	}
	cmd.AddCommand(newQuantizeKVCmd(g), newQuantizeWeightsCmd(g))
	return cmd
}

// kvFlags names oscar.KVOptions' fields as flags of quantize kv
// (field.Rename of Validate's errors).
var kvFlags = map[string]string{"Model": "MODEL", "Calib": "--calib", "Out": "-o", "Method": "--method", "ClipK": "--clip-k", "ClipV": "--clip-v",
	"ClipK4": "--clip-k4", "ClipV4": "--clip-v4", "ClipK8": "--clip-k8", "ClipV8": "--clip-v8", "ClipSearch": "--clip-search",
	"KVBits": "--kv-bits", "ServingCtx": "--kv-serving-ctx", "Sink": "--kv-window sink", "Recent": "--kv-window recent", "SearchTokens": "--search-tokens", "Threads": "--threads"}

func newQuantizeKVCmd(g *globalFlags) *cobra.Command {
	var (
		opt    oscar.KVOptions
		asJSON bool
		window string
	)
	cmd := &cobra.Command{
		Use:   "kv MODEL --calib CALIB -o ROT [--clip-search] [--kv-bits B [--kv-serving-ctx N]] [--kv-window SINK,RECENT] [--search-tokens N]",
		Short: "KV-cache rotations for a 2-bit cache (OSCAR) from a calibration file",
		Long: `kv computes, per layer, the OSCAR rotations of keys and values (eigenvectors of
the calibrated covariances, a Walsh–Hadamard transform, a bit-reversal
permutation) and writes them with the clipping ratios to a rotation file.
CALIB must come from "lmpack calibrate" on the same MODEL.

--clip-k/--clip-v (OSCAR's 0.96/0.92) are INT2 ratios: they apply to 2-bit
sides only; 4- and 8-bit sides clip only with --clip-k4/--clip-v4/
--clip-k8/--clip-v8. --clip-search instead picks every layer's K and V
ratio at 2 and 4 bits from {1, 0.99, 0.98, 0.96, 0.94, 0.92, 0.90, 0.85}
(8 bits: 1) by the KL of MODEL's final logits on CALIB's token ids (the
first --search-tokens) with that one side quantized as served (each query
reading its own token and the --kv-window windows exact, the attention
output recomputed and run through the later layers); a ratio replaces the
default only when it beats it by 2 standard errors over the calibration
windows. The report also lists the attention-output error
||softmax(qK^T)V - softmax(qK'^T)V'||^2 at the kept ratio.

--kv-bits B gives every layer's K and V a width in {2, 4, 8} (cache
"oscar-mixed"), chosen by exact DP on those measured KL errors, so that the
average bits per element at --kv-serving-ctx tokens (fp16 --kv-window
windows amortised) stays <= B. The report lists ratios, errors and widths.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if opt.Calib == "" {
				return fmt.Errorf("--calib CALIB is required (from lmpack calibrate)")
			}
			if opt.Out == "" {
				return fmt.Errorf("-o ROT is required (the rotation file to write)")
			}
			if err := checkOutput("-o", opt.Out, args[0], opt.Calib); err != nil {
				return err
			}
			if window != "" {
				if n, err := fmt.Sscanf(window, "%d,%d", &opt.Sink, &opt.Recent); n != 2 || err != nil || fmt.Sprintf("%d,%d", opt.Sink, opt.Recent) != window {
					return fmt.Errorf("--kv-window %q: want SINK,RECENT (two non-negative token counts, e.g. 16,64)", window)
				}
			}
			// Flags that only the measurement reads would do nothing.
			if !opt.ClipSearch && opt.KVBits == 0 {
				if cmd.Flags().Changed("kv-window") {
					return fmt.Errorf("--kv-window applies to the error measurement of --clip-search or --kv-bits; without either it does nothing (the cache's windows are given to pack, eval or serve)")
				}
				if cmd.Flags().Changed("search-tokens") {
					return fmt.Errorf("--search-tokens applies to the error measurement of --clip-search or --kv-bits; without either it does nothing")
				}
			}
			if opt.KVBits == 0 && cmd.Flags().Changed("kv-serving-ctx") {
				return fmt.Errorf("--kv-serving-ctx is the context at which --kv-bits counts bits per element; without --kv-bits it does nothing")
			}
			if err := checkThreads(opt.Threads); err != nil {
				return err
			}
			if !cmd.Flags().Changed("kv-serving-ctx") {
				// The default (oscar.DefaultServingCtx): Validate then
				// blames windows that do not fit it on --kv-window, not
				// on a flag that was not given.
				opt.ServingCtx = 0
			}
			if err := opt.Validate(); err != nil {
				return field.Rename(err, kvFlags)
			}
			opt.Model, opt.Version, opt.Logger = args[0], version, g.logger
			s, err := oscar.QuantizeKV(cmd.Context(), opt)
			if err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(s)
			}
			return writeKVReport(cmd, opt, s)
		},
	}
	f := cmd.Flags()
	f.StringVar(&opt.Calib, "calib", "", "calibration file from lmpack calibrate")
	f.StringVar(&opt.Method, "method", oscar.Method, "rotation method: oscar")
	f.Float64Var(&opt.ClipK, "clip-k", oscar.DefaultClipK, "key clipping ratio in (0, 1]")
	f.Float64Var(&opt.ClipV, "clip-v", oscar.DefaultClipV, "value clipping ratio in (0, 1]")
	f.Float64Var(&opt.ClipK4, "clip-k4", 0, "4-bit key clipping ratio in (0, 1] (default: none)")
	f.Float64Var(&opt.ClipV4, "clip-v4", 0, "4-bit value clipping ratio in (0, 1] (default: none)")
	f.Float64Var(&opt.ClipK8, "clip-k8", 0, "8-bit key clipping ratio in (0, 1] (default: none)")
	f.Float64Var(&opt.ClipV8, "clip-v8", 0, "8-bit value clipping ratio in (0, 1] (default: none)")
	f.BoolVar(&opt.ClipSearch, "clip-search", false, "pick per-layer K and V ratios at 2 and 4 bits by the KL of the final logits on CALIB (one side quantized as served)")
	f.Float64Var(&opt.KVBits, "kv-bits", 0, "per-layer K and V widths in {2,4,8} (cache oscar-mixed) within this many bits per element")
	f.IntVar(&opt.ServingCtx, "kv-serving-ctx", oscar.DefaultServingCtx, "context in tokens at which --kv-bits counts bits per element")
	f.StringVar(&window, "kv-window", "", "SINK,RECENT fp16 windows the cache will run with (with --clip-search or --kv-bits: read exact when measuring, counted in --kv-bits)")
	f.IntVar(&opt.SearchTokens, "search-tokens", oscar.DefaultSearchTokens, "calibration tokens the error measurement of --clip-search / --kv-bits runs")
	f.IntVar(&opt.Threads, "threads", 0, "worker threads (default: all cores)")
	f.StringVarP(&opt.Out, "output", "o", "", "rotation file to write")
	f.BoolVar(&asJSON, "json", false, "print one JSON object")
	return cmd
}

// weightsFlags names wquant.Options' fields as flags of quantize weights
// (field.Rename of Validate's errors).
var weightsFlags = map[string]string{
	"Model": "MODEL", "Calib": "--calib", "Out": "-o", "Method": "--method", "Bits": "--bits", "GroupSize": "--group",
	"Symmetric": "--sym", "MSEClip": "--mse-clip", "ActOrder": "--act-order", "TrueSequential": "--true-sequential",
	"TargetBPW": "--target-bpw", "MoEBudget": "--moe-budget", "MoEGroup": "--moe-group", "MoEWeighting": "--moe-weighting",
	"MoERule": "--moe-rule", "MoESolver": "--moe-solver", "MoEMinTokens": "--moe-min-tokens", "Threads": "--threads",
}

func newQuantizeWeightsCmd(g *globalFlags) *cobra.Command {
	var (
		opt    wquant.Options
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "weights MODEL --calib CALIB -o OUT (--bits B [--group G] | --target-bpw X | --moe-budget X) [--method rtn|gptq] [--sym] [--act-order]",
		Short: "Quantize a model's Linear weights (RTN or GPTQ, 2-8 bits, an exact bits-per-weight allocation, or GEMQ expert widths for MoE)",
		Long: `weights quantizes the q/k/v/o and gate/up/down weights of every decoder block
of MODEL and writes OUT, a new checkpoint directory (docs/QUANT.md): one
safetensors shard per block with packed codes, fp16 scales and fp16
zero-points, config.json with an lmpack_quantization block, tokenizer files
copied. run and eval execute it (weights stay packed in memory).
Embeddings, norms and lm_head stay float. MODEL is never modified; OUT must
not exist and must not lie inside MODEL.

The calibration tokens of CALIB ("lmpack calibrate" on the same MODEL) are
run block by block: each block's inputs come from the already quantized
blocks before it. --method gptq uses the blocks' input Hessians (damp 0.01,
optional --act-order); rtn rounds to nearest. --bits B with --group G
(32, 64, 128, or 0 per-channel; a group that does not divide a tensor's
columns falls back to per-channel) applies to every tensor; --target-bpw X
instead measures every tensor's output error under bits {2,3,4,8} x groups
{32,64,128,per-channel} and picks one option per tensor, by exact dynamic
programming, minimizing the summed error within X bits per weight
(counting scales and zero-points).

MoE models: --bits B quantizes the attention weights, every routed expert
and the shared experts at B bits. --moe-budget X instead gives every expert a width in
{1,2,3,4} bits chosen by GEMQ: error coefficients per (layer, expert,
width) from the MoE block's output (--moe-weighting routed|soft|kl), then
an exact DP (or --moe-solver lagrangian, with its gap reported) minimizing
their sum within X bits per expert weight as stored, counting the fp16
scale and zero-point of every group (--moe-group, default 0: per output
channel) like --target-bpw. --moe-rule keeps one expert at 4 bits and one
at 3 in every layer. The attention weights use --bits/--group (default
4-bit g128), and so do shared experts (Qwen2-MoE shared_expert gate/up/
down: not in the budget, counted with the non-expert weights; their gate
vector stays float). Routed experts are asymmetric (1 bit: two levels per
group, mean ± mean deviation); with --method gptq
their Hessians are collected while quantizing, on the hidden states of the
already quantized earlier blocks (as the attention weights'), and an
expert routed fewer than --moe-min-tokens calibration tokens falls back
(pooled input Hessian; soft-weighted coefficients) with a warning in the
report. CALIB's expert statistics give the routing counts GEMQ weighs by.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if opt.Calib == "" {
				return fmt.Errorf("--calib CALIB is required (from lmpack calibrate, with token ids)")
			}
			if opt.Out == "" {
				return fmt.Errorf("-o OUT is required (the directory to create)")
			}
			if err := checkThreads(opt.Threads); err != nil {
				return err
			}
			// Flag defaults that apply only without --target-bpw.
			fl := cmd.Flags()
			// 0 is these flags' "not given" inside Options, so a 0 the user
			// typed would silently mean "off": refuse it here.
			for _, name := range []string{"target-bpw", "moe-budget"} {
				if v, _ := fl.GetFloat64(name); fl.Changed(name) && v == 0 {
					return fmt.Errorf("--%s 0: want > 0 bits per weight, or leave the flag out", name)
				}
			}
			if fl.Changed("target-bpw") && !fl.Changed("bits") {
				opt.Bits = 0
			}
			if fl.Changed("target-bpw") && !fl.Changed("group") {
				opt.GroupSize = 0
			}
			opt.Method = strings.ToLower(opt.Method)
			opt.Model = args[0]
			if err := opt.Validate(); err != nil {
				return field.Rename(err, weightsFlags)
			}
			opt.Model, opt.Version, opt.Logger = args[0], version, g.logger
			report, finish := newProgress(cmd, g, "quantizing", "quantizing weights (steps: blocks, plus the bit allocation)", "steps")
			opt.Progress = report
			r, err := wquant.Run(cmd.Context(), opt)
			finish()
			if err != nil {
				return field.Rename(err, weightsFlags)
			}
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(r)
			}
			return writeWeightsReport(cmd, r)
		},
	}
	f := cmd.Flags()
	f.StringVar(&opt.Calib, "calib", "", "calibration file from lmpack calibrate (same MODEL)")
	f.StringVarP(&opt.Out, "output", "o", "", "directory to create for the quantized checkpoint")
	f.StringVar(&opt.Method, "method", wquant.MethodGPTQ, "rtn or gptq")
	f.IntVar(&opt.Bits, "bits", 4, "code width: 2, 3, 4 or 8")
	f.IntVar(&opt.GroupSize, "group", 128, "group size: 32, 64, 128 or 0 (per output channel)")
	f.BoolVar(&opt.Symmetric, "sym", false, "symmetric grid (no zero-points)")
	f.BoolVar(&opt.MSEClip, "mse-clip", false, "clip each group's range to the least squared rounding error (helps at 2-3 bits)")
	f.BoolVar(&opt.ActOrder, "act-order", false, "GPTQ: quantize columns by decreasing Hessian diagonal")
	f.BoolVar(&opt.TrueSequential, "true-sequential", false, "Hessians of o_proj, gate/up and down_proj on the block with the weights before them already quantized (4 passes per block)")
	f.Float64Var(&opt.TargetBPW, "target-bpw", 0, "choose bits and group per tensor for this many bits per weight (scales and zero-points counted)")
	f.Float64Var(&opt.MoEBudget, "moe-budget", 0, "MoE: GEMQ expert widths (1-4 bits) within this many bits per expert weight (scales and zero-points counted)")
	f.IntVar(&opt.MoEGroup, "moe-group", 0, "MoE: experts' group size: 32, 64, 128 or 0 (per output channel)")
	weighting := (*string)(&opt.MoEWeighting)
	f.StringVar(weighting, "moe-weighting", "", "MoE: GEMQ coefficients: routed (block output, top-k routing; the default), soft (softmax-weighted, all tokens) or kl (final logits; small models)")
	f.BoolVar(&opt.MoERule, "moe-rule", false, "MoE: keep one expert at 4 bits and another at 3 in every layer")
	solver := (*string)(&opt.MoESolver)
	f.StringVar(solver, "moe-solver", "", "MoE: allocation solver: dp (exact, the default) or lagrangian (reports its gap)")
	f.IntVar(&opt.MoEMinTokens, "moe-min-tokens", 0, "MoE: experts routed fewer calibration tokens fall back, with a warning (default 16)")
	f.IntVar(&opt.Threads, "threads", 0, "worker threads (default: all cores)")
	f.BoolVar(&asJSON, "json", false, "print the report as one JSON object")
	return cmd
}

func writeWeightsReport(cmd *cobra.Command, r *wquant.Report) error {
	var b strings.Builder
	method := r.Method
	if r.MSEClip {
		method += " (mse clip)"
	}
	fmt.Fprintf(&b, "wrote %s: method %s, %d weights at %.4f bits per weight (scales and zero-points counted)", r.Out, method, r.Params, r.BitsPerWeight)
	if r.TargetBPW > 0 {
		fmt.Fprintf(&b, ", target %g", r.TargetBPW)
	}
	if r.MoEBudget > 0 {
		fmt.Fprintf(&b, ", experts at %.4f bits per weight (moe budget %g", r.ExpertBitsPerWeight, r.MoEBudget)
		if slices.ContainsFunc(r.Tensors, func(t wquant.TensorReport) bool { return t.Shared }) {
			b.WriteString("; shared experts at --bits, outside the budget")
		}
		b.WriteString(")")
	}
	fmt.Fprintf(&b, "\npredicted error %.6g (sum over tensors of mean ||(W-Q)x||^2 on %d calibration tokens)\n", r.PredictedError, r.CalibTokens)
	fmt.Fprintf(&b, "%-6s %8s %12s\n", "layer", "bpw", "error")
	for _, l := range r.Layers {
		fmt.Fprintf(&b, "%-6d %8.4f %12.6g\n", l.Layer, l.BitsPerWeight, l.Error)
	}
	w := len("tensor")
	for _, t := range r.Tensors {
		w = max(w, len(t.Name))
	}
	fmt.Fprintf(&b, "%-*s %4s %6s %8s %12s %10s\n", w, "tensor", "bits", "group", "bpw", "error", "rel_error")
	for _, t := range r.Tensors {
		g := fmt.Sprint(t.GroupSize)
		if t.GroupSize == t.Cols {
			g = "chan"
		}
		fmt.Fprintf(&b, "%-*s %4d %6s %8.4f %12.6g %10.3g\n", w, t.Name, t.Bits, g, t.BitsPerWeight, t.Error, t.RelError)
	}
	fmt.Fprintf(&b, "quantized tensors %d -> %d bytes; checkpoint %d -> %d bytes\n", r.QuantBytesBefore, r.QuantBytesAfter, r.BytesBefore, r.BytesAfter)
	if r.MoE != nil {
		if err := r.MoE.WriteText(&b); err != nil {
			return err
		}
	}
	for _, w := range r.Warnings {
		if r.MoE == nil || !slices.Contains(r.MoE.Warnings, w) {
			fmt.Fprintf(&b, "warning: %s\n", w)
		}
	}
	_, err := fmt.Fprint(cmd.OutOrStdout(), b.String())
	return err
}

// writeKVReport prints quantize kv's summary: the file, and when errors
// were measured a row per layer with the K and V ratio and error at each
// width (and the chosen widths), then the budget and achieved bits.
func writeKVReport(cmd *cobra.Command, opt oscar.KVOptions, s *oscar.KVSummary) error {
	var b strings.Builder
	if s.PerLayer == nil {
		fmt.Fprintf(&b, "wrote %s: %s rotations for %d layers, clip_k %g, clip_v %g\n", s.Path, opt.Method, s.Layers, opt.ClipK, opt.ClipV)
		_, err := fmt.Fprint(cmd.OutOrStdout(), b.String())
		return err
	}
	how := "given ratios"
	if s.ClipSearch {
		how = "clip search"
	}
	fmt.Fprintf(&b, "wrote %s: %s rotations for %d layers; %s, error = KL of the final logits (nats/token, one side quantized) on %d calibration tokens (windows %d,%d exact)\n",
		s.Path, opt.Method, s.Layers, how, s.SearchTokens, opt.Sink, opt.Recent)
	fmt.Fprintf(&b, "%-5s %-4s", "layer", "side")
	for _, w := range oscar.Widths {
		fmt.Fprintf(&b, " %6s %11s", fmt.Sprintf("clip%d", w), fmt.Sprintf("error%d", w))
	}
	if s.KVBits > 0 {
		fmt.Fprintf(&b, " %4s", "bits")
	}
	b.WriteString("\n")
	for _, l := range s.PerLayer {
		for _, sd := range []struct {
			name string
			r    oscar.SideReport
		}{{"k", l.K}, {"v", l.V}} {
			fmt.Fprintf(&b, "%-5d %-4s", l.Layer, sd.name)
			for i := range oscar.Widths {
				fmt.Fprintf(&b, " %6.2f %11.4g", sd.r.Clip[i], sd.r.Error[i])
			}
			if s.KVBits > 0 {
				fmt.Fprintf(&b, " %4d", sd.r.Bits)
			}
			b.WriteString("\n")
		}
	}
	if s.KVBits > 0 {
		fmt.Fprintf(&b, "kv-bits %g at serving context %d (windows %d,%d amortised): %.4f bits/element, predicted error %.4g", s.KVBits, s.ServingCtx, s.Sink, s.Recent, s.BitsPerElement, s.PredictedError)
		for _, w := range oscar.Widths {
			k := fmt.Sprint(w)
			fmt.Fprintf(&b, "; uniform %d-bit %.4f bits/element, error %.4g", w, s.UniformBitsPerElement[k], s.UniformError[k])
		}
		b.WriteString("\n")
	}
	_, err := fmt.Fprint(cmd.OutOrStdout(), b.String())
	return err
}
