package cuda

import (
	"context"
	"encoding/binary"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/quantize/weights"
	"github.com/lmpack/lmpack/runtime"
)

// qwenMoESynthetic returns a Qwen2-MoE description — 3 layers, hidden 64,
// 4 query heads of 16 and 2 KV heads (q/k/v biases), vocabulary 128;
// layers 0 and 2 sparse (6 experts of intermediate 48, top 2 without
// renormalisation, a shared expert of intermediate 80 with its sigmoid
// gate), layer 1 a dense MLP of 96 — and random F16 weights: norms
// 1 + N(0, 0.1²), biases N(0, 0.1²), routers N(0, 16/cols), other
// matrices (the shared gate [1, 64] included) N(0, 1/cols).
func qwenMoESynthetic(tb testing.TB, seed uint64) (*arch.Description, mapSource) {
	tb.Helper()
	cfg := `{"architectures":["Qwen2MoeForCausalLM"],"model_type":"qwen2_moe","hidden_size":64,"intermediate_size":96,
"num_hidden_layers":3,"num_attention_heads":4,"num_key_value_heads":2,"vocab_size":128,"max_position_embeddings":4096,
"rms_norm_eps":1e-6,"rope_theta":10000.0,"tie_word_embeddings":false,"num_experts":6,"num_experts_per_tok":2,
"moe_intermediate_size":48,"shared_expert_intermediate_size":80,"norm_topk_prob":false,"decoder_sparse_step":1,"mlp_only_layers":[1]}`
	d, err := arch.Parse([]byte(cfg))
	if err != nil {
		tb.Fatal(err)
	}
	r := rand.New(rand.NewPCG(seed, 9))
	src := mapSource{}
	shapes := d.TensorShapes()
	// Drawn in name order, so the seed fixes the weights.
	for _, name := range slices.Sorted(maps.Keys(shapes)) {
		shape := shapes[name]
		n := 1
		for _, s := range shape {
			n *= s
		}
		v := make([]float32, n)
		for i := range v {
			switch {
			case strings.HasSuffix(name, ".bias"):
				v[i] = float32(0.1 * r.NormFloat64())
			case len(shape) == 1:
				v[i] = float32(1 + 0.1*r.NormFloat64())
			case strings.HasSuffix(name, ".mlp.gate.weight"):
				// A decisive router (logits of standard deviation about
				// 4): near-ties at the top-k boundary, where the two
				// backends' rounding could pick different experts, are
				// rarer.
				v[i] = float32(4 * r.NormFloat64() / math.Sqrt(float64(shape[1])))
			default:
				v[i] = float32(r.NormFloat64() / math.Sqrt(float64(shape[1])))
			}
		}
		src[name] = &safetensors.Tensor{Name: name, File: "synthetic", DType: safetensors.F16, Shape: shape, Data: safetensors.F16Bytes(v)}
	}
	return d, src
}

// quantizeTensors returns d and src with the weights of opts RTN-quantized
// in docs/QUANT.md storage (perm[name]: with a random act-order
// permutation, storage column j holding input column perm[j]).
func quantizeTensors(tb testing.TB, d *arch.Description, src runtime.TensorSource, opts map[string]weights.Options, perm map[string]bool, seed uint64) (*arch.Description, runtime.TensorSource) {
	tb.Helper()
	qd := *d
	qd.Quant = &arch.Quantization{Format: arch.QuantFormat, Version: arch.QuantVersion, Method: "rtn", Tensors: map[string]arch.TensorQuant{}}
	over := mapSource{}
	r := rand.New(rand.NewPCG(seed, 10))
	u16 := func(v []uint16) []byte {
		b := make([]byte, 2*len(v))
		for i, x := range v {
			binary.LittleEndian.PutUint16(b[2*i:], x)
		}
		return b
	}
	for name, o := range opts {
		tt, err := src.Tensor(name)
		if err != nil {
			tb.Fatal(err)
		}
		w, err := tt.Float32()
		if err != nil {
			tb.Fatal(err)
		}
		rows, cols := tt.Shape[0], tt.Shape[1]
		var pm []int32
		if perm[name] {
			pm = make([]int32, cols)
			for j, v := range r.Perm(cols) {
				pm[j] = int32(v)
			}
			pw := make([]float32, len(w))
			for i := 0; i < rows; i++ {
				for j := range cols {
					pw[i*cols+j] = w[i*cols+int(pm[j])]
				}
			}
			w = pw
		}
		q, err := weights.QuantizeRTN(w, rows, cols, o)
		if err != nil {
			tb.Fatalf("%s: %v", name, err)
		}
		p := arch.QuantPrefix(name)
		g := cols / q.GroupSize
		over[p+arch.SuffixQWeight] = &safetensors.Tensor{Name: p + arch.SuffixQWeight, File: "quantized", DType: safetensors.U8, Shape: []int{rows, len(q.Codes) / rows}, Data: q.Codes}
		over[p+arch.SuffixScales] = &safetensors.Tensor{Name: p + arch.SuffixScales, File: "quantized", DType: safetensors.F16, Shape: []int{rows, g}, Data: u16(q.Scales)}
		if !q.Symmetric {
			over[p+arch.SuffixQZeros] = &safetensors.Tensor{Name: p + arch.SuffixQZeros, File: "quantized", DType: safetensors.F16, Shape: []int{rows, g}, Data: u16(q.Zeros)}
		}
		if pm != nil {
			b := make([]byte, 4*cols)
			for j, v := range pm {
				binary.LittleEndian.PutUint32(b[4*j:], uint32(v))
			}
			over[p+arch.SuffixPerm] = &safetensors.Tensor{Name: p + arch.SuffixPerm, File: "quantized", DType: safetensors.I32, Shape: []int{cols}, Data: b}
		}
		qd.Quant.Tensors[name] = arch.TensorQuant{Bits: q.Bits, GroupSize: q.GroupSize, Symmetric: q.Symmetric, Perm: pm != nil}
	}
	return &qd, overlaySource{over: over, base: src}
}

// quantizeQwenMoE quantizes qwenMoESynthetic's experts and shared experts:
// expert e of sparse layer l gets bits {1, 2, 3, 4, 8}[(l+e) mod 5]
// (1 bit asymmetric, the others symmetric when e is odd), groups of 32
// for gate/up (64 columns) and per channel for down (48 columns), except
// expert 1's up weight at 2 bits groups of 64 whatever its gate, and
// act-order permutations on layer 2's expert 3 gate and expert 4 down;
// the shared experts 4-bit, gate/up groups of 32, down per channel (80
// columns). Attention, the dense MLP and the shared gates stay F16.
func quantizeQwenMoE(tb testing.TB, d *arch.Description, src runtime.TensorSource) (*arch.Description, runtime.TensorSource) {
	tb.Helper()
	opts := map[string]weights.Options{}
	perm := map[string]bool{}
	widths := []int{1, 2, 3, 4, 8}
	for l, ly := range d.Layers {
		mo := ly.MoE
		if mo == nil {
			continue
		}
		for e, x := range mo.Experts {
			b := widths[(l+e)%len(widths)]
			sym := b != 1 && e%2 == 1
			opts[x.Gate] = weights.Options{Bits: b, GroupSize: 32, Symmetric: sym}
			opts[x.Up] = weights.Options{Bits: b, GroupSize: 32, Symmetric: sym}
			if e == 1 {
				opts[x.Up] = weights.Options{Bits: 2, GroupSize: 64}
			}
			opts[x.Down] = weights.Options{Bits: b, Symmetric: sym}
			if l == 2 && e == 3 {
				perm[x.Gate] = true
			}
			if l == 2 && e == 4 {
				perm[x.Down] = true
			}
		}
		sh := mo.Shared
		opts[sh.Gate] = weights.Options{Bits: 4, GroupSize: 32}
		opts[sh.Up] = weights.Options{Bits: 4, GroupSize: 32}
		opts[sh.Down] = weights.Options{Bits: 4}
	}
	return quantizeTensors(tb, d, src, opts, perm, 5)
}

// TestQwenMoESyntheticCPU checks the synthetic Qwen2-MoE of the GPU test
// without a GPU: the CPU backend runs it, its shared experts matter (the
// logits move by more than 0.01 when the shared gates are pushed to
// sigmoid ≈ 0), and the quantized variant's experts, packed as the CUDA
// backend packs them (mixed widths, symmetric and not, act-order),
// give through the moe_gemv_q port the products of Quantized.Dequantize.
func TestQwenMoESyntheticCPU(t *testing.T) {
	d, src := qwenMoESynthetic(t, 3)
	ctx := context.Background()
	toks := []int{5, 17, 99, 3, 64, 64, 127, 0, 42, 8}
	V := d.VocabSize
	run := func(s runtime.TensorSource) []float32 {
		m, err := runtime.NewCPU().Load(ctx, d, s, runtime.LoadOptions{Threads: 1})
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		out := make([]float32, len(toks)*V)
		if err := m.Forward(ctx, toks, m.NewCache(16), out, true); err != nil {
			t.Fatal(err)
		}
		return out
	}
	base := run(src)
	off := mapSource{}
	for _, l := range d.Layers {
		if l.MoE != nil {
			v := make([]float32, d.HiddenSize)
			for i := range v {
				v[i] = -1000
			}
			off[l.MoE.SharedGate] = &safetensors.Tensor{Name: l.MoE.SharedGate, File: "off", DType: safetensors.F32, Shape: []int{1, d.HiddenSize}, Data: safetensors.F32Bytes(v)}
		}
	}
	mx, _, _ := logitDiff(base, run(overlaySource{over: off, base: src}), V)
	t.Logf("shared gates off: max |Δlogit| %.3g", mx)
	if mx < 0.01 {
		t.Errorf("shared gates off: max |Δlogit| %.3g, want > 0.01 (the shared experts do not matter)", mx)
	}
	qd, qsrc := quantizeQwenMoE(t, d, src)
	d = qd
	q := run(qsrc)
	qmx, qmean, _ := logitDiff(base, q, V)
	t.Logf("quantized experts vs F16 on the CPU: max |Δlogit| %.3g, mean %.3g", qmx, qmean)
	if !(qmean > 0) || math.IsInf(qmx, 0) || math.IsNaN(qmx) {
		t.Errorf("quantized experts: max |Δlogit| %v, mean %v; want finite and > 0", qmx, qmean)
	}
	widths := CheckMoEStacksPort(t, qd, qsrc)
	if len(widths) != 5 {
		t.Errorf("expert widths %v, want 1, 2, 3, 4 and 8 bits", widths)
	}
}

// TestGPUQwenMoEShared: the synthetic Qwen2-MoE (shared experts with
// sigmoid gates, a dense layer between sparse ones) on the GPU against
// the CPU backend, 40 prefilled (gemm for the shared expert) and 30
// decoded tokens: F16 weights (tolerances max |Δ| 0.05, mean 0.005, as
// TestGPUMoE), then quantizeQwenMoE's checkpoint with every expert stack
// packed (moe_gemv_q with mixed widths and act-order; the shared experts
// through matmulX's packed path), same tolerances.
func TestGPUQwenMoEShared(t *testing.T) {
	gpuOrSkip(t)
	d, src := qwenMoESynthetic(t, 3)
	qd, qsrc := quantizeQwenMoE(t, d, src)
	ctx := context.Background()
	r := rand.New(rand.NewPCG(15, 16))
	toks := make([]int, 70)
	for i := range toks {
		toks[i] = r.IntN(d.VocabSize)
	}
	for _, c := range []struct {
		name   string
		d      *arch.Description
		src    runtime.TensorSource
		packed int
	}{{"F16", d, src, 0}, {"quantized experts", qd, qsrc, 4}} {
		cpu, err := runtime.NewCPU().Load(ctx, c.d, c.src, runtime.LoadOptions{Threads: 2})
		if err != nil {
			t.Fatal(err)
		}
		gpu, err := (Backend{CacheDir: testCacheDir(t)}).Load(ctx, c.d, c.src, runtime.LoadOptions{})
		if err != nil {
			cpu.Close()
			t.Fatal(err)
		}
		packed, total, shared, gated := MoEStacks(gpu)
		if packed != c.packed || total != 4 || shared != 2 || gated != 2 {
			t.Errorf("%s: %d of %d expert stacks packed (want %d), %d shared experts, %d gated (want 2, 2)", c.name, packed, total, c.packed, shared, gated)
		}
		compareRun(t, fmt.Sprintf("synthetic Qwen2-MoE %s", c.name), cpu, gpu, cpu.NewCache(80), gpu.NewCache(80), toks, 40, d.VocabSize, 0.05, 0.005)
		cpu.Close()
		gpu.Close()
	}
}
