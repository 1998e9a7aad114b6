// Package benchcmp is the harness of `make bench-compare` (issue 16 item
// 5): it runs lmpack's runtime and llama.cpp (node-llama-cpp 3.21.1's
// prebuilt CPU binary, test/llamacpp/bench.mjs) side by side on the same
// weights, interleaved A/B/A/B, and prints the tokens/s of prefill (512
// tokens from an empty cache, llama-bench pp512) and decode (128 single
// tokens from an empty cache, llama-bench tg128) of each side, their
// ratio and each side's peak RSS.
//
// The weights are a synthetic Llama (Wide: runtime/bench_test.go's
// writeSyntheticLlama, the same config, seed and values) written as an
// F32 checkpoint, quantized by lmpack's own tools (calibrate.Run and
// wquant.Run, RTN) and exported by lmpack's own GGUF writer
// (export.GGUF) into the llama.cpp type that holds the same codes bit for
// bit (docs/EXPORT.md): F32 ↔ F32, 8-bit group 32 symmetric ↔ Q8_0,
// 4-bit group 32 symmetric ↔ Q4_0, 4-bit group 32 asymmetric ↔ Q4_1.
// Prepare refuses a variant whose export is not exact for every block
// weight (except for Q4_1's offset m, rounded to fp16 where fp16 does not
// hold −scale·zero).
//
// Each side runs in its own process per (format, threads), loaded once
// and driven over stdin/stdout with one JSON line per request (see
// Request and Answer), so that each process's VmHWM is that format's peak
// RSS.
package benchcmp

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/lmpack/lmpack/calibrate"
	"github.com/lmpack/lmpack/export"
	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/internal/shared"
	"github.com/lmpack/lmpack/quantize/wquant"
)

// Config is the shape of the synthetic Llama: hidden_size, number of
// decoder blocks, attention heads, KV heads (GQA), intermediate (FFN)
// size. vocab_size is 512, stories260K's tokenizer (which the GGUF export
// and llama.cpp need), embeddings are tied, max_position_embeddings 1024.
type Config struct {
	Hidden, Layers, Heads, KVHeads, FFN int
}

// Wide is the benchmark model: hidden 512, 8 layers, 8 heads and
// 2 KV heads (head_dim 64), FFN 1408, vocabulary 512 (about 22M
// parameters, 88 MB in F32).
var Wide = Config{Hidden: 512, Layers: 8, Heads: 8, KVHeads: 2, FFN: 1408}

// Tiny is a small model for the harness's own test: hidden 64, 2 layers,
// 4 heads and 2 KV heads (head_dim 16), FFN 128 (every block weight has
// columns a multiple of 32, so the 4- and 8-bit group-32 exports are
// exact).
var Tiny = Config{Hidden: 64, Layers: 2, Heads: 4, KVHeads: 2, FFN: 128}

// WriteSynthetic writes the checkpoint of cfg into dir (created): the
// config.json of runtime/bench_test.go's writeSyntheticLlama with cfg's
// sizes, model.safetensors (F32) with its values (tensors in name order,
// norms 1, every other tensor N(0, 1/in_features) from PCG(22, 6)), and
// stories260K-hf's tokenizer.json and tokenizer_config.json from the
// shared data folder (internal/shared; vocabulary 512). Errors: a missing
// shared tokenizer file, write failures.
func WriteSynthetic(dir string, cfg Config) error {
	if cfg.Hidden <= 0 || cfg.Layers <= 0 || cfg.Heads <= 0 || cfg.KVHeads <= 0 || cfg.FFN <= 0 {
		return fmt.Errorf("benchcmp: synthetic config %+v: every size must be > 0", cfg)
	}
	c := map[string]any{
		"architectures": []string{"LlamaForCausalLM"}, "hidden_size": cfg.Hidden, "intermediate_size": cfg.FFN, "num_hidden_layers": cfg.Layers,
		"num_attention_heads": cfg.Heads, "num_key_value_heads": cfg.KVHeads, "vocab_size": 512, "rms_norm_eps": 1e-5,
		"max_position_embeddings": 1024, "rope_theta": 10000.0, "tie_word_embeddings": true, "bos_token_id": 1, "eos_token_id": 2,
	}
	raw, err := json.Marshal(c)
	if err != nil {
		return err
	}
	d, err := arch.Parse(raw)
	if err != nil {
		return fmt.Errorf("benchcmp: synthetic config: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), raw, 0o644); err != nil {
		return err
	}
	for _, f := range []string{"tokenizer.json", "tokenizer_config.json"} {
		src := filepath.Join(shared.Root(), "stories260K-hf", f)
		b, err := os.ReadFile(src)
		if err != nil {
			return fmt.Errorf("benchcmp: the synthetic model takes stories260K's tokenizer (vocabulary 512): %w (set LMPACK_SHARED_DATA to the shared data folder)", err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			return err
		}
	}
	sh := d.TensorShapes()
	names := make([]string, 0, len(sh))
	for n := range sh {
		names = append(names, n)
	}
	slices.Sort(names)
	rng := rand.New(rand.NewPCG(22, 6))
	ws := make([]safetensors.WriteTensor, 0, len(names))
	for _, n := range names {
		s := sh[n]
		size := 1
		for _, x := range s {
			size *= x
		}
		v := make([]float32, size)
		for i := range v {
			if len(s) == 1 {
				v[i] = 1
			} else {
				v[i] = float32(rng.NormFloat64() / math.Sqrt(float64(s[len(s)-1])))
			}
		}
		ws = append(ws, safetensors.FromFloat32(n, s, v))
	}
	return safetensors.WriteFile(filepath.Join(dir, "model.safetensors"), ws, nil)
}

// Variant is one weight format run on both sides.
type Variant struct {
	// Name is the GGUF type of the 2-D block weights ("F32", "Q8_0",
	// "Q4_0", "Q4_1").
	Name string
	// Lmpack describes lmpack's storage ("F32 checkpoint", "rtn 8-bit g32
	// sym").
	Lmpack string
	// Dir is lmpack's checkpoint directory, GGUF the exported file.
	Dir, GGUF string
	// Bytes are the sizes of lmpack's weight files (*.safetensors summed)
	// and of the GGUF file.
	DirBytes, GGUFBytes int64
	// Export says how exact the export was ("all 56 block weights
	// exact", or Q4_1's fp16 rounding of m; see checkExact).
	Export string
}

// quantSpec is a quantized variant: RTN bits, group 32, symmetric or not,
// and the GGUF type its export must be exact in.
type quantSpec struct {
	name string
	bits int
	sym  bool
}

var quantSpecs = []quantSpec{{"Q8_0", 8, true}, {"Q4_0", 4, true}, {"Q4_1", 4, false}}

// Formats are the variant names Prepare knows, in table order.
var Formats = []string{"F32", "Q8_0", "Q4_0", "Q4_1"}

// Prepare writes the synthetic checkpoint of cfg under work/f32, and for
// every name of formats (a subset of Formats) lmpack's checkpoint (the F32
// one, or `lmpack quantize weights --method rtn --bits B --group 32
// [--sym]` of it, calibrated on 256 tokens of the shared TinyStories
// calibration text) and its `lmpack export --format gguf`. Errors: an
// unknown format, a failed stage, and an export in which a block weight is
// not written exactly in the expected GGUF type (the two sides would not
// run the same weights; Q4_1's m may be rounded to fp16, see checkExact).
func Prepare(ctx context.Context, work string, cfg Config, formats []string) ([]Variant, error) {
	f32 := filepath.Join(work, "f32")
	if err := WriteSynthetic(f32, cfg); err != nil {
		return nil, err
	}
	var calib string
	var out []Variant
	for _, name := range formats {
		v := Variant{Name: name}
		switch name {
		case "F32":
			v.Lmpack, v.Dir = "F32 checkpoint", f32
		default:
			i := slices.IndexFunc(quantSpecs, func(q quantSpec) bool { return q.name == name })
			if i < 0 {
				return nil, fmt.Errorf("benchcmp: format %q: want one of %s", name, strings.Join(Formats, ", "))
			}
			q := quantSpecs[i]
			if calib == "" {
				calib = filepath.Join(work, "calib.safetensors")
				if _, err := calibrate.Run(ctx, calibrate.Options{
					Model: f32, Data: filepath.Join(shared.Root(), "tinystories-valid", "calib.txt"),
					Tokens: 256, Ctx: 128, Out: calib, Threads: 1,
				}); err != nil {
					return nil, fmt.Errorf("benchcmp: calibrate %s: %w", f32, err)
				}
			}
			symName := "asym"
			if q.sym {
				symName = "sym"
			}
			v.Lmpack = fmt.Sprintf("rtn %d-bit g32 %s", q.bits, symName)
			v.Dir = filepath.Join(work, fmt.Sprintf("rtn-w%dg32-%s", q.bits, symName))
			if _, err := wquant.Run(ctx, wquant.Options{
				Model: f32, Calib: calib, Out: v.Dir,
				Method: wquant.MethodRTN, Bits: q.bits, GroupSize: 32, Symmetric: q.sym, Threads: 1,
			}); err != nil {
				return nil, fmt.Errorf("benchcmp: quantize %s (%s): %w", f32, v.Lmpack, err)
			}
		}
		v.GGUF = filepath.Join(work, strings.ToLower(name)+".gguf")
		typ := ""
		if name == "F32" {
			typ = "f32"
		}
		rep, err := export.GGUF(ctx, v.Dir, export.GGUFOptions{Out: v.GGUF, Type: typ})
		if err != nil {
			return nil, fmt.Errorf("benchcmp: export %s as GGUF: %w", v.Dir, err)
		}
		if v.Export, err = checkExact(rep, name); err != nil {
			return nil, err
		}
		v.GGUFBytes = rep.Bytes
		m, _ := filepath.Glob(filepath.Join(v.Dir, "*.safetensors"))
		for _, f := range m {
			st, err := os.Stat(f)
			if err != nil {
				return nil, err
			}
			v.DirBytes += st.Size()
		}
		out = append(out, v)
	}
	return out, nil
}

// checkExact checks that every 2-D block weight ("blk.*" with two
// dimensions) of rep was written as typ, exactly, and returns a note on
// the exception it allows: Q4_1's m = −scale·zero, which fp16 does not
// always hold (docs/EXPORT.md), so those tensors are "requantized" with
// the same codes and scales and m rounded; the note counts them and gives
// the first one's reason. Errors: any other type or mode.
func checkExact(rep *export.Report, typ string) (string, error) {
	n, rounded := 0, 0
	first := ""
	for _, t := range rep.Tensors {
		if !strings.HasPrefix(t.Name, "blk.") || len(t.Shape) != 2 {
			continue
		}
		n++
		if t.To == typ && t.Mode == export.ModeRequantized && typ == "Q4_1" {
			if rounded == 0 {
				first = t.Reason
			}
			rounded++
			continue
		}
		if t.Mode != export.ModeExact || t.To != typ {
			return "", fmt.Errorf("benchcmp: export %s: tensor %s (%s) became %s %s (%s); want exact %s, so that both sides run the same weights",
				rep.Out, t.Name, t.From, t.Mode, t.To, t.Reason, typ)
		}
	}
	if n == 0 {
		return "", fmt.Errorf("benchcmp: export %s holds no 2-D block weight", rep.Out)
	}
	if rounded == 0 {
		return fmt.Sprintf("all %d block weights exact", n), nil
	}
	return fmt.Sprintf("%d of %d block weights with m rounded to fp16, codes and scales exact: %s", rounded, n, first), nil
}
