package cuda_test

import (
	"context"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/calibrate"
	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/internal/shared"
	"github.com/lmpack/lmpack/quantize/weights"
	"github.com/lmpack/lmpack/quantize/wquant"
	"github.com/lmpack/lmpack/runtime"
	"github.com/lmpack/lmpack/runtime/cuda"
	"github.com/lmpack/lmpack/runtime/kvcache"
)

// quantizeMoE quantizes stories260K-moe-hf (Mixtral, 5 layers of 4
// experts [172, 64] and [64, 172], top 2) with quantize/wquant into a
// temporary directory and returns its description and tensors: RTN,
// attention 4-bit groups of 32, the experts' widths chosen by GEMQ under
// a 2.5-bit budget (1–4 bits per expert, per channel, asymmetric), then
// overridden for a few tensors so that every storage variant meets the
// packed path: layer 0 expert 0's gate at 8 bits groups of 32 and its up
// at 2 bits per channel (gate and up of one expert differing), layer 1
// expert 2's gate/up 3-bit symmetric groups of 32, layer 4 expert 3's
// down 8-bit per channel. Calibration: 1024 tokens of
// tinystories-valid/calib.txt in windows of 256.
func quantizeMoE(t *testing.T) (*arch.Description, runtime.TensorSource) {
	t.Helper()
	ctx := context.Background()
	model := shared.Path(t, "stories260K-moe-hf")
	dir := t.TempDir()
	cal := filepath.Join(dir, "calib.safetensors")
	if _, err := calibrate.Run(ctx, calibrate.Options{Model: model, Data: shared.Path(t, "tinystories-valid", "calib.txt"),
		Tokens: 1024, Ctx: 256, Out: cal, Threads: 2, Version: "test"}); err != nil {
		t.Fatal(err)
	}
	e := func(l, x int, w string) string {
		return fmt.Sprintf("model.layers.%d.block_sparse_moe.experts.%d.%s.weight", l, x, w)
	}
	per := map[string]weights.Options{
		e(0, 0, "w1"): {Bits: 8, GroupSize: 32},
		e(0, 0, "w3"): {Bits: 2},
		e(1, 2, "w1"): {Bits: 3, GroupSize: 32, Symmetric: true},
		e(1, 2, "w3"): {Bits: 3, GroupSize: 32, Symmetric: true},
		e(4, 3, "w2"): {Bits: 8},
	}
	out := filepath.Join(dir, "q")
	if _, err := wquant.Run(ctx, wquant.Options{Model: model, Calib: cal, Out: out, Method: wquant.MethodRTN, Bits: 4, GroupSize: 32,
		MoEBudget: 2.5, PerTensor: per, Threads: 2, Version: "test"}); err != nil {
		t.Fatal(err)
	}
	d, err := arch.Load(out)
	if err != nil {
		t.Fatal(err)
	}
	for n := range per {
		if _, ok := d.Quant.Tensors[n]; !ok {
			t.Fatalf("%s is not quantized in the written checkpoint (expert tensor names changed?)", n)
		}
	}
	ck, err := safetensors.OpenDir(out)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ck.Close() })
	return d, ck
}

// TestMoEQuantPackCPU checks quantizeMoE's checkpoint without a GPU: its
// experts have at least three widths, including 1 bit, and every MoE
// layer's experts, read and packed as the CUDA backend packs them
// (moePack's offset tables), give through the Go port of moe_gemv_q the
// products of Quantized.Dequantize (cuda.CheckMoEStacksPort); the CPU
// backend runs it (finite logits).
func TestMoEQuantPackCPU(t *testing.T) {
	d, src := quantizeMoE(t)
	widths := cuda.CheckMoEStacksPort(t, d, src)
	var ws []int
	for b := range widths {
		ws = append(ws, b)
	}
	sort.Ints(ws)
	t.Logf("expert segments by width: %v", widths)
	if len(ws) < 3 || widths[1] == 0 || widths[8] == 0 {
		t.Errorf("expert widths %v, want at least three, 1 and 8 bits among them", widths)
	}
	// The CPU half of TestGPUMoEQuant: the checkpoint loads and runs.
	m, err := runtime.NewCPU().Load(context.Background(), d, src, runtime.LoadOptions{Threads: 1, DequantizeWeights: true})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	toks := cuda.StoriesTokens(t, 16)
	out := make([]float32, len(toks)*d.VocabSize)
	if err := m.Forward(context.Background(), toks, m.NewCache(16), out, true); err != nil {
		t.Fatal(err)
	}
	for i, v := range out {
		if v-v != 0 {
			t.Fatalf("logit %d is %v", i, v)
		}
	}
}

// TestGPUMoEQuant: quantizeMoE's checkpoint on the GPU, every expert stack
// packed (moe_gemv_q for prefill and decode; attention packed too), against
// the CPU backend on the same checkpoint with the GPU's storage (its float
// matrices rounded to binary16: binary16Floats; an fp16 KV cache) over 32
// prefilled and 64 decoded tokens, so that what remains is float32
// summation order. Tolerances max |Δ| 0.1, mean 0.01, argmax agreement ≥
// 0.97: float32-ulp noise on equal storage moves this chaotic 1-bit-expert
// model by max 0.026, mean 0.0013 (TestMoEQuantToleranceCPU); against the
// float32 CPU with a float32 cache it moved by max 0.113, beyond them.
func TestGPUMoEQuant(t *testing.T) {
	if err := cuda.Probe(0); err != nil {
		if os.Getenv("LMPACK_REQUIRE_GPU") == "1" {
			t.Fatalf("no CUDA GPU: %v", err)
		}
		t.Skipf("no CUDA GPU: %v", err)
	}
	d, src := quantizeMoE(t)
	ctx := context.Background()
	cpu, err := runtime.NewCPU().Load(ctx, d, binary16Floats{src}, runtime.LoadOptions{Threads: 2, DequantizeWeights: true})
	if err != nil {
		t.Fatal(err)
	}
	defer cpu.Close()
	cc, err := kvcache.New("fp16", kvcache.LayersOf(d), 128, kvcache.Options{})
	if err != nil {
		t.Fatal(err)
	}
	gpu, err := (cuda.Backend{CacheDir: cacheDir(t)}).Load(ctx, d, src, runtime.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer gpu.Close()
	if packed, total, _, _ := cuda.MoEStacks(gpu); packed != total || total != 10 {
		t.Fatalf("%d of %d expert stacks packed, want 10 of 10", packed, total)
	}
	toks := cuda.StoriesTokens(t, 96)
	cuda.CompareRun(t, "stories260K-moe quantized (mixed expert widths)", cpu, gpu, cc, gpu.NewCache(128), toks, 32, d.VocabSize, 0.1, 0.01)
}

// binary16Floats serves a checkpoint with its float32 matrices rounded to
// binary16, as the CUDA backend stores them (quantized storage, vectors
// and other dtypes unchanged).
type binary16Floats struct{ runtime.TensorSource }

// Tensor implements runtime.TensorSource.
func (b binary16Floats) Tensor(name string) (*safetensors.Tensor, error) {
	t, err := b.TensorSource.Tensor(name)
	if err != nil || len(t.Shape) != 2 || t.DType != safetensors.F32 {
		return t, err
	}
	v, err := t.Float32()
	if err != nil {
		return nil, err
	}
	return &safetensors.Tensor{Name: name, File: t.File, DType: safetensors.F16, Shape: t.Shape, Data: safetensors.F16Bytes(v)}, nil
}

// TestMoEQuantToleranceCPU backs TestGPUMoEQuant's tolerances on the CPU:
// quantizeMoE's checkpoint with binary16 float matrices and an fp16 KV
// cache against itself with those matrices as float32 moved by up to 2
// ulps (seeded, 6 seeds), the stand-in for float32 rounding in another
// order, over the GPU test's tokens; the worst must stay within half of
// the tolerances (0.1, 0.01) with argmax agreement ≥ 0.98.
func TestMoEQuantToleranceCPU(t *testing.T) {
	d, src := quantizeMoE(t)
	ctx := context.Background()
	toks := cuda.StoriesTokens(t, 96)
	run := func(s runtime.TensorSource) []float32 {
		m, err := runtime.NewCPU().Load(ctx, d, s, runtime.LoadOptions{Threads: 2, DequantizeWeights: true})
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		c, err := kvcache.New("fp16", kvcache.LayersOf(d), 128, kvcache.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return cuda.RunLogits(t, m, c, toks, 32, d.VocabSize)
	}
	base := run(binary16Floats{src})
	mx, mean, agree := 0.0, 0.0, 1.0
	for seed := uint64(1); seed <= 6; seed++ {
		a, b, c := cuda.LogitDiff(base, run(ulpNoisy{binary16Floats{src}, seed}), d.VocabSize)
		mx, mean, agree = max(mx, a), max(mean, b), min(agree, c)
	}
	t.Logf("quantized stories260K-moe, binary16 storage against float32-ulp noise, worst of 6 seeds: max |Δlogit| %.4g, mean %.4g, argmax agreement %.4f (TestGPUMoEQuant allows 0.1, 0.01, 0.97)", mx, mean, agree)
	if mx > 0.05 || mean > 0.005 || agree < 0.98 {
		t.Errorf("float32 rounding noise alone uses more than half of TestGPUMoEQuant's tolerances")
	}
}

// ulpNoisy serves the float matrices of its source (binary16 or float32)
// as float32 moved by up to 2 ulps, seeded by name and seed.
type ulpNoisy struct {
	runtime.TensorSource
	seed uint64
}

// Tensor implements runtime.TensorSource.
func (u ulpNoisy) Tensor(name string) (*safetensors.Tensor, error) {
	t, err := u.TensorSource.Tensor(name)
	// Float matrices only (NAME.weight), not the quantized storage
	// (binary16 scales and zero-points).
	if err != nil || len(t.Shape) != 2 || !strings.HasSuffix(name, ".weight") || (t.DType != safetensors.F16 && t.DType != safetensors.F32) {
		return t, err
	}
	v, err := t.Float32()
	if err != nil {
		return nil, err
	}
	h := fnv.New64a()
	h.Write([]byte(name))
	r := rand.New(rand.NewPCG(u.seed, h.Sum64()))
	for i, x := range v {
		v[i] = x * float32(1+float64(r.IntN(5)-2)*0x1p-23)
	}
	return &safetensors.Tensor{Name: name, File: t.File, DType: safetensors.F32, Shape: t.Shape, Data: safetensors.F32Bytes(v)}, nil
}

// cacheDir is $LMPACK_CUDA_CACHE (shared by scripts/gpu-check.sh's runs),
// else a temporary directory.
func cacheDir(t *testing.T) string {
	if c := os.Getenv("LMPACK_CUDA_CACHE"); c != "" {
		return c
	}
	return t.TempDir()
}
