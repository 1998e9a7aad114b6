package main

import (
	"encoding/json"
	"fmt"

	"github.com/lmpack/lmpack/export"
	"github.com/lmpack/lmpack/internal/field"
	"github.com/spf13/cobra"
)

// ggufFlags names export.GGUFOptions' fields as flags of export
// (field.Rename of Validate's errors).
var ggufFlags = map[string]string{"Out": "-o", "Type": "--gguf-type", "AllowRequant": "--allow-requant"}

// ctFlags names export.CTOptions' fields as flags of export.
var ctFlags = map[string]string{"Out": "-o", "KVCalib": "--kv-calib", "DropKV": "--drop-kv", "Threads": "--threads"}

func newExportCmd(g *globalFlags) *cobra.Command {
	var (
		format, out, ggufType, kvCalib string
		allowRequant, dropKV, asJSON   bool
		threads                        int
	)
	cmd := &cobra.Command{
		Use:   "export MODEL|ARTIFACT --format gguf|compressed-tensors -o OUT [--gguf-type auto|q8_0|q4_0|q4_1|q4_k|q6_k|f16|bf16|f32] [--allow-requant] [--json]",
		Short: "Export a model or artifact as GGUF (llama.cpp) or compressed-tensors (vLLM)",
		Long: `export writes MODEL (a checkpoint directory, a quantized checkpoint from
"lmpack quantize weights", or an .lmpk artifact) in another runtime's format.

--format gguf writes one GGUF v3 file for llama.cpp with its architecture
names (llama, qwen2, qwen3, qwen2moe, qwen3moe; Mistral and Mixtral as
llama; a width-pruned Llama as deci), metadata and tokenizer. Float
tensors keep their dtype and quantized ones with an exact GGUF counterpart
are rewritten without requantizing (symmetric 8-bit group 32 → Q8_0,
symmetric 4-bit → Q4_0, asymmetric 4-bit → Q4_1); others are requantized
into the nearest llama.cpp type, or all 2-D weights into --gguf-type.
MoE experts quantized at different widths are refused unless
--allow-requant. A KV-cache scheme of an artifact is not stored: the
report names the llama.cpp --cache-type-k/-v to use instead.

The report lists what each tensor became (exact, requantized, kept) and
why, and the bits per weight of the result. OUT is written atomically and
is byte-identical across runs; an existing OUT is replaced only when it is
a file of the same format.

--format compressed-tensors writes a Hugging Face directory that vLLM's
compressed-tensors loader reads: 4- and 8-bit weights as pack-quantized
(weight_packed, weight_scale, weight_zero_point, weight_shape, weight_g_idx
for act-order) with quantization_config; other widths and width-pruned
models are refused. --kv-calib CALIB adds an FP8 kv_cache_scheme with
per-layer k_scale/v_scale measured on the calibration tokens; an
artifact's own KV scheme has no counterpart and is refused unless
--drop-kv. OUT must not exist.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var rep *export.Report
			var err error
			switch format {
			case "gguf":
				if kvCalib != "" || dropKV {
					return fmt.Errorf("--kv-calib and --drop-kv apply to --format compressed-tensors only")
				}
				opt := export.GGUFOptions{Out: out, Type: ggufType, AllowRequant: allowRequant}
				if verr := opt.Validate(); verr != nil {
					return field.Rename(verr, ggufFlags)
				}
				// The same output rules as pack's: an existing parent
				// directory, not inside the model directory, not an input.
				if cerr := checkOutput("-o", out, args[0], args[0]); cerr != nil {
					return cerr
				}
				rep, err = export.GGUF(cmd.Context(), args[0], opt)
			case "compressed-tensors":
				if ggufType != "" {
					return fmt.Errorf("--gguf-type applies to --format gguf only")
				}
				if allowRequant {
					return fmt.Errorf("--allow-requant applies to --format gguf only (compressed-tensors never requantizes)")
				}
				opt := export.CTOptions{Out: out, KVCalib: kvCalib, DropKV: dropKV, Threads: threads, Logger: g.logger}
				if verr := opt.Validate(); verr != nil {
					return field.Rename(verr, ctFlags)
				}
				rep, err = export.CompressedTensors(cmd.Context(), args[0], opt)
			case "":
				return fmt.Errorf("--format is required: gguf or compressed-tensors")
			default:
				return fmt.Errorf("--format %q: want gguf or compressed-tensors", format)
			}
			if err != nil {
				if rep != nil && !asJSON {
					rep.WriteText(cmd.ErrOrStderr())
				}
				return err
			}
			g.logger.Info("export written", "format", rep.Format, "out", rep.Out, "bytes", rep.Bytes, "bits_per_weight", rep.BitsPerWeight)
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(rep)
			}
			return rep.WriteText(cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringVar(&format, "format", "", "gguf or compressed-tensors")
	f.StringVarP(&out, "output", "o", "", "file (gguf) or directory (compressed-tensors) to write")
	f.StringVar(&ggufType, "gguf-type", "", "tensor type of the 2-D weights: auto (default), q8_0, q4_0, q4_1, q4_k, q6_k, f16, bf16, f32")
	f.BoolVar(&allowRequant, "allow-requant", false, "requantize MoE experts of mixed widths to the widest instead of refusing")
	f.StringVar(&kvCalib, "kv-calib", "", "compressed-tensors: calibration file (lmpack calibrate) for an FP8 kv_cache_scheme with per-layer k_scale/v_scale")
	f.BoolVar(&dropKV, "drop-kv", false, "compressed-tensors: export an artifact's weights without its KV-cache scheme (no counterpart) instead of refusing")
	f.IntVar(&threads, "threads", 0, "CPU workers for the --kv-calib forward passes (default: all cores)")
	f.BoolVar(&asJSON, "json", false, "print the report as one JSON object")
	return cmd
}
