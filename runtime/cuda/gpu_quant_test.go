package cuda

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/internal/shared"
	"github.com/lmpack/lmpack/quantize/kvq"
	"github.com/lmpack/lmpack/quantize/weights"
	"github.com/lmpack/lmpack/runtime"
	"github.com/lmpack/lmpack/runtime/kvcache"
)

// overlaySource serves the tensors of over, then those of base.
type overlaySource struct {
	over mapSource
	base runtime.TensorSource
}

func (s overlaySource) Tensor(name string) (*safetensors.Tensor, error) {
	if t, ok := s.over[name]; ok {
		return t, nil
	}
	return s.base.Tensor(name)
}

// storiesQuant is how quantizeStoriesWith stores one weight: its grid,
// and perm, a key: "" for the natural column order, else the weight gets
// the random act-order permutation of that key in its layer (weights of
// one layer with the same key share it, as GPTQ gives q/k/v the same
// one; their device stack then stays packed).
type storiesQuant struct {
	o    weights.Options
	perm string
}

// quantizeStoriesWith returns stories260K with the weights plan(i) names
// for layer i quantized by RTN in docs/QUANT.md storage; a permuted
// weight is quantized in storage order (storage column j holding input
// column perm[j]), so codes and groups are permuted as GPTQ --act-order
// stores them.
func quantizeStoriesWith(t *testing.T, d *arch.Description, ck runtime.TensorSource, plan func(i int) map[string]storiesQuant) (*arch.Description, runtime.TensorSource) {
	t.Helper()
	qd := *d
	qd.Quant = &arch.Quantization{Format: arch.QuantFormat, Version: arch.QuantVersion, Method: "rtn", Tensors: map[string]arch.TensorQuant{}}
	over := mapSource{}
	r := rand.New(rand.NewPCG(31, 32))
	put := func(name string, o weights.Options, pm []int32) {
		tt, err := ck.Tensor(name)
		if err != nil {
			t.Fatal(err)
		}
		w, err := tt.Float32()
		if err != nil {
			t.Fatal(err)
		}
		rows, cols := tt.Shape[0], tt.Shape[1]
		if pm != nil {
			// Storage column j holds input column pm[j].
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
			t.Fatal(err)
		}
		p := arch.QuantPrefix(name)
		g := cols / q.GroupSize
		u16 := func(v []uint16) []byte {
			b := make([]byte, 2*len(v))
			for i, x := range v {
				binary.LittleEndian.PutUint16(b[2*i:], x)
			}
			return b
		}
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
	for i := range d.Layers {
		pl := plan(i)
		names := make([]string, 0, len(pl))
		for n := range pl {
			names = append(names, n)
		}
		slices.Sort(names) // the permutations drawn do not depend on map order
		perms := map[string][]int32{}
		for _, n := range names {
			sq := pl[n]
			var pm []int32
			if sq.perm != "" {
				if perms[sq.perm] == nil {
					tt, err := ck.Tensor(n)
					if err != nil {
						t.Fatal(err)
					}
					cols := tt.Shape[1]
					perms[sq.perm] = make([]int32, cols)
					for j, v := range r.Perm(cols) {
						perms[sq.perm][j] = int32(v)
					}
				}
				pm = perms[sq.perm]
			}
			put(n, sq.o, pm)
		}
	}
	return &qd, overlaySource{over: over, base: ck}
}

// quantizeStories returns stories260K with its attention and MLP weights
// RTN-quantized in docs/QUANT.md storage: q/k/v/gate/up 4-bit asymmetric
// groups of 32, o_proj 2-bit symmetric groups of 64, down_proj 3-bit per
// channel (172 columns, not a multiple of 8), and layer 0's o_proj with an
// act-order permutation. With wide, every width is 8 bits instead (same
// groups, symmetry and permutation).
func quantizeStories(t *testing.T, d *arch.Description, ck runtime.TensorSource, wide bool) (*arch.Description, runtime.TensorSource) {
	t.Helper()
	b := func(n int) int {
		if wide {
			return 8
		}
		return n
	}
	return quantizeStoriesWith(t, d, ck, func(i int) map[string]storiesQuant {
		l := &d.Layers[i]
		m := map[string]storiesQuant{}
		for _, n := range []string{l.Attn.Q, l.Attn.K, l.Attn.V, l.MLP.Gate, l.MLP.Up} {
			m[n] = storiesQuant{o: weights.Options{Bits: b(4), GroupSize: 32}}
		}
		o := storiesQuant{o: weights.Options{Bits: b(2), GroupSize: 64, Symmetric: true}}
		if i == 0 {
			o.perm = "o"
		}
		m[l.Attn.O] = o
		m[l.MLP.Down] = storiesQuant{o: weights.Options{Bits: b(3), Symmetric: true}}
		return m
	})
}

// quantizeStoriesLowBit returns stories260K with 1-bit and act-order
// weights: q/k/v 1-bit groups of 32 sharing one permutation per layer,
// o_proj 1-bit groups of 64 in natural order, gate/up 4-bit asymmetric
// groups of 32 sharing one permutation, down_proj 1-bit per channel (172
// columns: a tail after the chunks of 8) with its own permutation; in the
// last layer gate and up get different permutations (so their device
// stack cannot share one and takes the host path).
func quantizeStoriesLowBit(t *testing.T, d *arch.Description, ck runtime.TensorSource) (*arch.Description, runtime.TensorSource) {
	t.Helper()
	return quantizeStoriesWith(t, d, ck, func(i int) map[string]storiesQuant {
		l := &d.Layers[i]
		one32 := weights.Options{Bits: 1, GroupSize: 32}
		four := weights.Options{Bits: 4, GroupSize: 32}
		m := map[string]storiesQuant{
			l.Attn.Q:   {one32, "qkv"},
			l.Attn.K:   {one32, "qkv"},
			l.Attn.V:   {one32, "qkv"},
			l.Attn.O:   {weights.Options{Bits: 1, GroupSize: 64}, ""},
			l.MLP.Gate: {four, "gu"},
			l.MLP.Up:   {four, "gu"},
			l.MLP.Down: {weights.Options{Bits: 1}, "down"},
		}
		if i == len(d.Layers)-1 {
			m[l.MLP.Up] = storiesQuant{four, "up"}
		}
		return m
	})
}

// loadStoriesQuant loads stories260K quantized by quant on the CPU
// backend (packed weights, 2 threads) and on the GPU.
func loadStoriesQuant(t *testing.T, quant func(*testing.T, *arch.Description, runtime.TensorSource) (*arch.Description, runtime.TensorSource)) (cpu runtime.Model, gm *Model, desc *arch.Description) {
	t.Helper()
	path := shared.Path(t, "stories260K-hf")
	desc, err := arch.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	ck, err := safetensors.OpenDir(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ck.Close() })
	qd, src := quant(t, desc, ck)
	ctx := context.Background()
	// The device computes with the dequantized weights in float: the CPU
	// reference dequantizes at load too (not its int8-activation kernels),
	// here and in every CPU reference of these tests.
	cpu, err = runtime.NewCPU().Load(ctx, qd, src, runtime.LoadOptions{Threads: 2, DequantizeWeights: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cpu.Close() })
	gpu, err := (Backend{CacheDir: testCacheDir(t)}).Load(ctx, qd, src, runtime.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gpu.Close() })
	return cpu, gpu.(*Model), desc
}

// TestGPUStories260KQuant: a quantized stories260K (quantizeStories) on
// the GPU, every weight packed (gemv_q for decode rows, dequant_q then
// gemm_f16 for the 100-token prefill: more than maxGemvQRows), layer 0's
// act-order o_proj with its permutation on the device, against the CPU
// backend on the same quantized checkpoint over 100 prefilled and 64
// decoded tokens. Tolerances as TestGPUStories260K: both sides
// use the same dequantized weights, the GPU rounds them to binary16 in
// prefill only.
func TestGPUStories260KQuant(t *testing.T) {
	gpuOrSkip(t)
	cpu, gm, desc := loadStoriesQuant(t, func(t *testing.T, d *arch.Description, ck runtime.TensorSource) (*arch.Description, runtime.TensorSource) {
		return quantizeStories(t, d, ck, false)
	})
	l0, l1 := &gm.layers[0], &gm.layers[1]
	if l0.wo.q == nil || l0.wo.q.perm == 0 || l0.wo.q.iperm == 0 || l1.wo.q == nil || l1.wo.q.perm != 0 || l0.wqkv.q == nil || l0.mlp.gu.q == nil || l0.mlp.down.q == nil {
		t.Fatalf("packed weights: layer 0 o_proj %v (want packed with its permutation), layer 1 o_proj %v, qkv %v, gate/up %v, down %v (want packed)",
			l0.wo.q, l1.wo.q, l0.wqkv.q, l0.mlp.gu.q, l0.mlp.down.q)
	}
	toks := storiesTokens(t, 164)
	compareRun(t, "stories260K quantized", cpu, gm, cpu.NewCache(200), gm.NewCache(200), toks, 100, desc.VocabSize, gpuStoriesMaxTol, gpuStoriesMeanTol)
}

// TestGPUStories260KQuant8: TestGPUStories260KQuant with every width 8
// bits (quantizeStories wide: q/k/v/gate/up asymmetric groups of 32,
// o_proj symmetric groups of 64, layer 0's with its act-order
// permutation, down_proj per channel over 172 columns), every weight
// packed at 8 bits on the GPU (gemv_q for the decode rows, dequant_q +
// gemm_f16 for the 100-token prefill), against the CPU backend on the
// same checkpoint dequantized at load, over 100 prefilled and 64 decoded
// tokens. Tolerances as TestGPUStories260KQuant (gpuStoriesMaxTol,
// gpuStoriesMeanTol): decode uses the CPU's Ŵ exactly (qval), prefill
// rounds Ŵ to binary16 and the KV cache is binary16, as for 4 bits.
func TestGPUStories260KQuant8(t *testing.T) {
	gpuOrSkip(t)
	cpu, gm, desc := loadStoriesQuant(t, func(t *testing.T, d *arch.Description, ck runtime.TensorSource) (*arch.Description, runtime.TensorSource) {
		return quantizeStories(t, d, ck, true)
	})
	for i := range gm.layers {
		l := &gm.layers[i]
		for _, w := range []struct {
			name string
			q    *qw
		}{{"qkv", l.wqkv.q}, {"o_proj", l.wo.q}, {"gate/up", l.mlp.gu.q}, {"down", l.mlp.down.q}} {
			if w.q == nil || w.q.bits != 8 {
				t.Fatalf("layer %d %s: packed %+v, want 8 bits on the device", i, w.name, w.q)
			}
		}
	}
	if gm.layers[0].wo.q.perm == 0 {
		t.Fatal("layer 0 o_proj: no act-order permutation on the device")
	}
	toks := storiesTokens(t, 164)
	compareRun(t, "stories260K 8-bit", cpu, gm, cpu.NewCache(200), gm.NewCache(200), toks, 100, desc.VocabSize, gpuStoriesMaxTol, gpuStoriesMeanTol)
}

// TestGPUStories260KQuantLowBit: stories260K with 1-bit and act-order
// weights (quantizeStoriesLowBit: 1-bit q/k/v sharing a permutation,
// 1-bit o_proj, 4-bit permuted gate/up, 1-bit per-channel permuted
// down_proj with a tail) packed on the GPU, except the last layer's
// gate/up whose parts have different permutations (host path), against
// the CPU backend on the same checkpoint over 100 prefilled and 64
// decoded tokens. Tolerances max |Δ| 0.1, mean 0.01, argmax agreement
// 0.97: decode uses the same Ŵ as the CPU (qval is exact), prefill and
// the float tensors round to binary16, and the KV cache is binary16. On
// the CPU, binary16-rounded weights move these logits by max 0.025, mean
// 0.0033, argmax agreement 0.994 (TestQuantizeStoriesLowBitCPU), against
// max 0.016, mean 0.0023, agreement 1 for the float model, whose
// TestGPUStories260K allows 0.05 and 0.005: the tolerances keep about
// the same margin (4× and 3×) over the low-bit model's rounding effect.
func TestGPUStories260KQuantLowBit(t *testing.T) {
	gpuOrSkip(t)
	cpu, gm, desc := loadStoriesQuant(t, quantizeStoriesLowBit)
	last := &gm.layers[len(gm.layers)-1]
	for i := range gm.layers[:len(gm.layers)-1] {
		l := &gm.layers[i]
		for _, c := range []struct {
			name string
			w    dw
			bits int
			perm bool
		}{{"qkv", l.wqkv, 1, true}, {"o_proj", l.wo, 1, false}, {"gate/up", l.mlp.gu, 4, true}, {"down", l.mlp.down, 1, true}} {
			if c.w.q == nil || c.w.q.bits != c.bits || (c.w.q.perm != 0) != c.perm || (c.w.q.iperm != 0) != c.perm {
				t.Fatalf("layer %d %s: packed %+v, want %d bits, permutation %v", i, c.name, c.w.q, c.bits, c.perm)
			}
		}
	}
	if last.mlp.gu.q != nil || last.wqkv.q == nil {
		t.Fatalf("last layer: gate/up packed %v (want the host path: different permutations), qkv packed %v (want packed)", last.mlp.gu.q != nil, last.wqkv.q != nil)
	}
	toks := storiesTokens(t, 164)
	compareRun(t, "stories260K 1-bit/act-order", cpu, gm, cpu.NewCache(200), gm.NewCache(200), toks, 100, desc.VocabSize, 0.1, 0.01) // a prefill of more than maxGemvQRows: dequant_q
}

// TestGPUDequantQ: dequant_q on the GPU equals Quantized.Dequantize
// rounded to binary16 exactly (qval is correctly rounded) for 1, 2, 3, 4
// and 8 bits, groups 32 and per channel (K = 100 and 300: partial blocks
// of 256), with and without an act-order permutation (the kernel given
// its inverse).
func TestGPUDequantQ(t *testing.T) {
	d, k := gpuOrSkip(t)
	r := rand.New(rand.NewPCG(7, 8))
	const N = 37
	for _, bits := range []int{1, 2, 3, 4, 8} {
		for _, tc := range []struct{ K, group int }{{320, 32}, {100, 0}, {300, 0}} {
			for _, perm := range []bool{false, true} {
				w := randVec(r, N*tc.K, 0.05)
				q, err := weights.QuantizeRTN(w, N, tc.K, weights.Options{Bits: bits, GroupSize: tc.group})
				if err != nil {
					t.Fatal(err)
				}
				var ip DevPtr
				if perm {
					var inv []int32
					q.Perm, inv = randPerm(r, tc.K)
					ip = devBuf(t, d, inv)
				}
				deq := make([]float32, N*tc.K)
				q.Dequantize(deq)
				out := devBuf(t, d, make([]uint16, N*tc.K))
				if err := k.Launch("dequant_q", Dim{N, (tc.K + 255) / 256, 1}, Dim{256, 1, 1}, out, devBuf(t, d, q.Codes), devBuf(t, d, q.Scales),
					devBuf(t, d, q.Zeros), ip, N, tc.K, bits, q.GroupSize); err != nil {
					t.Fatal(err)
				}
				got := download[uint16](t, d, out, N*tc.K)
				bad := 0
				for i, h := range got {
					if h != kvq.F16FromFloat32(deq[i]) {
						if bad == 0 {
							t.Errorf("bits %d K %d group %d perm %v: element [%d, %d] %#04x, want %#04x (%v)", bits, tc.K, tc.group, perm, i/tc.K, i%tc.K, h, kvq.F16FromFloat32(deq[i]), deq[i])
						}
						bad++
					}
				}
				if bad > 0 {
					t.Errorf("bits %d K %d group %d perm %v: %d of %d elements differ", bits, tc.K, tc.group, perm, bad, len(got))
				}
			}
		}
	}
}

// TestQuantizeStoriesCPU checks quantizeStories' storage (no GPU): the
// CPU backend loads its 8-bit variant, whose logits stay near the float
// model's (mean |Δ| ≤ 0.05, argmax agreement ≥ 0.9: a mis-packed tensor
// or a wrong permutation gives noise).
func TestQuantizeStoriesCPU(t *testing.T) {
	path := shared.Path(t, "stories260K-hf")
	desc, err := arch.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	ck, err := safetensors.OpenDir(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	qd, src := quantizeStories(t, desc, ck, true)
	ctx := context.Background()
	f, err := runtime.NewCPU().Load(ctx, desc, ck, runtime.LoadOptions{Threads: 1, DequantizeWeights: true})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	q, err := runtime.NewCPU().Load(ctx, qd, src, runtime.LoadOptions{Threads: 1, DequantizeWeights: true})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	toks := storiesTokens(t, 32)
	V := desc.VocabSize
	a, b := make([]float32, len(toks)*V), make([]float32, len(toks)*V)
	if err := f.Forward(ctx, toks, f.NewCache(40), a, true); err != nil {
		t.Fatal(err)
	}
	if err := q.Forward(ctx, toks, q.NewCache(40), b, true); err != nil {
		t.Fatal(err)
	}
	mx, mean, agree := logitDiff(a, b, V)
	t.Logf("quantized vs float stories260K: max |Δ| %.3g, mean %.3g, argmax agreement %.3f", mx, mean, agree)
	if mean > 0.05 || mean == 0 || agree < 0.9 {
		t.Errorf("mean |Δlogit| %.3g, agreement %.3f; want mean in (0, 0.05], agreement ≥ 0.9", mean, agree)
	}
}

// TestQuantizeStoriesLowBitCPU (no GPU) backs TestGPUStories260KQuantLowBit's
// tolerance: on the CPU backend, quantizeStoriesLowBit's checkpoint with
// packed weights against the same checkpoint with every weight
// (dequantized ones included) rounded to binary16, as the GPU's prefill
// and float tensors see them, with an fp16 KV cache, over the same 100
// prefilled and 64 decoded tokens, must stay within half the GPU test's tolerances (max |Δ|
// 0.05, mean 0.005) with argmax agreement ≥ 0.99; and the permutations
// matter:
// the checkpoint with every permutation dropped must be far off (mean
// |Δ| > 0.05).
func TestQuantizeStoriesLowBitCPU(t *testing.T) {
	path := shared.Path(t, "stories260K-hf")
	desc, err := arch.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	ck, err := safetensors.OpenDir(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	qd, src := quantizeStoriesLowBit(t, desc, ck)
	deq := runtime.WithQuant(qd, src)
	rounded := mapSource{}
	for name, shape := range desc.TensorShapes() {
		tt, err := deq.Tensor(name)
		if err != nil {
			t.Fatal(err)
		}
		v, err := tt.Float32()
		if err != nil {
			t.Fatal(err)
		}
		for i, x := range v {
			v[i] = kvq.RoundF16(x)
		}
		rounded[name] = &safetensors.Tensor{Name: name, File: "rounded", DType: safetensors.F32, Shape: shape, Data: safetensors.F32Bytes(v)}
	}
	// The same storage read as if it had no permutation.
	nd := *qd
	nd.Quant = &arch.Quantization{Format: qd.Quant.Format, Version: qd.Quant.Version, Method: qd.Quant.Method, Tensors: map[string]arch.TensorQuant{}}
	for n, tq := range qd.Quant.Tensors {
		tq.Perm = false
		nd.Quant.Tensors[n] = tq
	}
	ctx := context.Background()
	load := func(d *arch.Description, s runtime.TensorSource) runtime.Model {
		m, err := runtime.NewCPU().Load(ctx, d, s, runtime.LoadOptions{Threads: 2, DequantizeWeights: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		return m
	}
	ref, r16, np := load(qd, src), load(desc, rounded), load(&nd, src)
	toks := storiesTokens(t, 164)
	V := desc.VocabSize
	// The GPU test's split: 100 prefilled (dequant_q, binary16 Ŵ), 64
	// decoded; the binary16 side also keeps an fp16 KV cache, as the GPU.
	run := func(m runtime.Model, fp16 bool) []float32 {
		var c runtime.KVCache = m.NewCache(200)
		if fp16 {
			var err error
			if c, err = kvcache.New("fp16", kvcache.LayersOf(desc), 200, kvcache.Options{}); err != nil {
				t.Fatal(err)
			}
		}
		out := make([]float32, 100*V)
		if err := m.Forward(ctx, toks[:100], c, out, true); err != nil {
			t.Fatal(err)
		}
		for _, tok := range toks[100:] {
			y := make([]float32, V)
			if err := m.Forward(ctx, []int{tok}, c, y, false); err != nil {
				t.Fatal(err)
			}
			out = append(out, y...)
		}
		return out
	}
	a := run(ref, false)
	mx, mean, agree := logitDiff(a, run(r16, true), V)
	t.Logf("binary16-rounded weights and fp16 KV: max |Δlogit| %.3g, mean %.3g, argmax agreement %.4f", mx, mean, agree)
	if mx > 0.05 || mean > 0.005 || agree < 0.99 {
		t.Errorf("binary16 rounding moves the logits by max %.3g, mean %.3g, agreement %.4f; want ≤ 0.05, ≤ 0.005, ≥ 0.99", mx, mean, agree)
	}
	mx, mean, agree = logitDiff(a, run(np, false), V)
	t.Logf("permutations dropped: max |Δlogit| %.3g, mean %.3g, argmax agreement %.4f", mx, mean, agree)
	if mean < 0.05 {
		t.Errorf("dropping the permutations moves the logits by mean %.3g only; want > 0.05", mean)
	}
}

// TestPackStackStories (no GPU): the device stacks that Load packs for
// quantizeStories' and quantizeStoriesLowBit's checkpoints (q/k/v,
// o_proj, gate/up, down_proj of every layer, as load stacks them) are
// the expected ones (only the low-bit last layer's gate/up, whose parts
// differ in permutation, falls back to the host), and what would be
// uploaded decodes right: dequant_q's port on the stacked codes with the
// inverse permutation equals, in binary16, the host path's dequantized
// stack (runtime.WithQuant), and gemv_q's port with the permutation
// matches the float64 product with it to 1e-5·Σ|x·ŵ|.
func TestPackStackStories(t *testing.T) {
	path := shared.Path(t, "stories260K-hf")
	desc, err := arch.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	ck, err := safetensors.OpenDir(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	r := rand.New(rand.NewPCG(9, 10))
	for _, v := range []struct {
		name  string
		quant func() (*arch.Description, runtime.TensorSource)
	}{
		{"quantizeStories", func() (*arch.Description, runtime.TensorSource) { return quantizeStories(t, desc, ck, false) }},
		{"quantizeStoriesLowBit", func() (*arch.Description, runtime.TensorSource) { return quantizeStoriesLowBit(t, desc, ck) }},
	} {
		qd, src := v.quant()
		deq := runtime.WithQuant(qd, src)
		H := desc.HiddenSize
		packedPerm := 0
		for i := range desc.Layers {
			l := &desc.Layers[i]
			qdim, kvdim, I := l.QDim(), l.KVDim(), l.MLP.IntermediateSize
			for _, st := range []struct {
				what  string
				names []string
				rows  []int
				cols  int
			}{
				{"qkv", []string{l.Attn.Q, l.Attn.K, l.Attn.V}, []int{qdim, kvdim, kvdim}, H},
				{"o_proj", []string{l.Attn.O}, []int{H}, qdim},
				{"gate/up", []string{l.MLP.Gate, l.MLP.Up}, []int{I, I}, H},
				{"down", []string{l.MLP.Down}, []int{H}, I},
			} {
				what := fmt.Sprintf("%s layer %d %s", v.name, i, st.what)
				h, err := packStack(qd.Quant, src, st.names, st.rows, st.cols)
				if err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				wantHost := v.name == "quantizeStoriesLowBit" && i == len(desc.Layers)-1 && st.what == "gate/up"
				if (h == nil) != wantHost {
					t.Fatalf("%s: packed %v, want %v", what, h != nil, !wantHost)
				}
				if h == nil {
					continue
				}
				if (h.perm != nil) != qd.Quant.Tensors[st.names[0]].Perm || len(h.iperm) != len(h.perm) {
					t.Fatalf("%s: perm %d entries, iperm %d, want the checkpoint's", what, len(h.perm), len(h.iperm))
				}
				if h.perm != nil {
					packedPerm++
				}
				N, K := h.rows, st.cols
				var want []float32
				for _, n := range st.names {
					tt, err := deq.Tensor(n)
					if err != nil {
						t.Fatal(err)
					}
					f, err := tt.Float32()
					if err != nil {
						t.Fatal(err)
					}
					want = append(want, f...)
				}
				if len(want) != N*K {
					t.Fatalf("%s: %d rows stacked, host path has %d elements", what, N, len(want))
				}
				for e, x := range dequantQPort(h.codes, h.scales, h.zeros, h.iperm, N, K, h.bits, h.group) {
					if x != kvq.F16FromFloat32(want[e]) {
						t.Fatalf("%s: dequant_q element [%d, %d] %v, host path %v", what, e/K, e%K, kvq.F16ToFloat32(x), want[e])
					}
				}
				const M = 3
				x := randVec(r, M*K, 1)
				y := make([]float32, M*N)
				gemvQKernelPort(y, N, x, K, h.codes, h.scales, h.zeros, h.perm, M, N, K, h.bits, h.group, 0)
				for m := 0; m < M; m++ {
					for n := 0; n < N; n++ {
						var s, a float64
						for c := 0; c < K; c++ {
							p := float64(x[m*K+c]) * float64(want[n*K+c])
							s += p
							a += math.Abs(p)
						}
						if e := math.Abs(float64(y[m*N+n])-s) / (a + 1e-12); e > 1e-5 {
							t.Fatalf("%s: gemv_q row %d output %d: %v, float64 %v (error %.3g of Σ|x·ŵ|)", what, m, n, y[m*N+n], s, e)
						}
					}
				}
			}
		}
		t.Logf("%s: %d packed stacks with a permutation", v.name, packedPerm)
		if packedPerm == 0 {
			t.Errorf("%s: no packed stack has a permutation", v.name)
		}
	}
}
