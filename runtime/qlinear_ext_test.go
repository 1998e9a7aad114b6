package runtime_test

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"testing"

	"github.com/lmpack/lmpack/calibrate"
	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/internal/shared"
	"github.com/lmpack/lmpack/quantize/weights"
	"github.com/lmpack/lmpack/quantize/wquant"
	"github.com/lmpack/lmpack/runtime"
)

// quantizeShared quantizes the shared model name with wquant into a temp
// dir and returns the dir. calib is a calibration file of that model.
func quantizeShared(t *testing.T, name, calib string, opt wquant.Options) string {
	t.Helper()
	opt.Model, opt.Calib, opt.Threads = shared.Path(t, name), calib, 1
	opt.Out = filepath.Join(t.TempDir(), "q")
	if _, err := wquant.Run(context.Background(), opt); err != nil {
		t.Fatal(err)
	}
	return opt.Out
}

func calibFor(t *testing.T, name string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "calib.safetensors")
	_, err := calibrate.Run(context.Background(), calibrate.Options{Model: shared.Path(t, name), Data: shared.Path(t, "tinystories-valid", "calib.txt"),
		Tokens: 1024, Ctx: 256, Out: out, Threads: 1, Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// loadQ loads the checkpoint dir on the CPU backend, packed or
// dequantized at load.
func loadQ(t *testing.T, dir string, threads int, dequant bool) runtime.Model {
	t.Helper()
	d, err := arch.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	ck, err := safetensors.OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close() // packed codes are copied out of the mapping
	m, err := runtime.NewCPU().Load(context.Background(), d, ck, runtime.LoadOptions{Threads: threads, DequantizeWeights: dequant})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// runLogits returns the logits of a prefill of ids[:n0] (all rows) then
// decode steps of the remaining ids one at a time (one row each).
func runLogits(t *testing.T, m runtime.Model, ids []int, n0 int) []float32 {
	t.Helper()
	V := m.Description().VocabSize
	out := make([]float32, len(ids)*V)
	c := m.NewCache(len(ids))
	ctx := context.Background()
	if err := m.Forward(ctx, ids[:n0], c, out, true); err != nil {
		t.Fatal(err)
	}
	for i := n0; i < len(ids); i++ {
		if err := m.Forward(ctx, ids[i:i+1], c, out[i*V:], false); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// q8LogitTol bounds, relative to max|logit|, how far decode logits on
// int8 activations (kernels.DotQ8Rows) may lie from the float path's.
// Each such matmul rounds x to int8 per block, an error of at most
// max|x_block|/254 per element (kernels.QuantizeActQ8), which the layers
// propagate. Measured on stories260K: 0.57% (RTN 4-bit g32, 0.107 on
// max|logit| 18.7), 0.75% (GPTQ act-order 4-bit g32, 0.139 on 18.5),
// 0.78% (the MoE at 1-4 bits, 0.12 on 15.4); 1.0% on the shared-expert
// Qwen2-MoE (0.041 on 4.05); 2% leaves a margin of at least 2.
const q8LogitTol = 2e-2

// q8LowBitLogitTol is q8LogitTol for models whose every weight has 1 or
// 2 bits: their logits react more to the same activation rounding
// (measured 1.9% for RTN 1-bit g32, 0.292 on 15.1, and 2.6% for RTN 2-bit
// per channel, 0.44 on 17.2); 5% leaves a margin of 1.9.
const q8LowBitLogitTol = 5e-2

// q8Tol returns tol when bits-bit weights decode on int8 activations
// (runtime.Q8Width), else 1e-5.
func q8Tol(bits int, tol float64) float64 {
	if runtime.Q8Width(bits) {
		return tol
	}
	return 1e-5
}

// comparePackedDequant checks that the packed model's logits equal the
// dequantize-at-load model's within decodeTol·max|logit| (prefill and
// decode, 1 and 3 threads) and that the packed linear weights take less
// than a quarter of the float32 bytes. decodeTol is 1e-5 for a model on
// the tile path, whose prefill logits must also be bit for bit equal when
// prefillExact is set (the same kernels in the same summation order as
// the float weights); q8LogitTol or q8LowBitLogitTol when some weight runs
// on int8 activations (kernels.DotQ8Matrix; q8Widths), for prefill and
// decode alike.
func comparePackedDequant(t *testing.T, label, dir string, prefillExact bool, decodeTol float64) {
	t.Helper()
	ids := make([]int, 40)
	for i := range ids {
		ids[i] = (i*37 + 1) % 512
	}
	for _, th := range []int{1, 3} {
		pm, dm := loadQ(t, dir, th, false), loadQ(t, dir, th, true)
		a, b := runLogits(t, pm, ids, 33), runLogits(t, dm, ids, 33)
		var diff, mx, prefillDiff float64
		identical, prefillIdentical := true, true
		V := pm.Description().VocabSize
		for i := range a {
			diff = math.Max(diff, math.Abs(float64(a[i]-b[i])))
			if i < 33*V {
				prefillDiff = diff
			}
			mx = math.Max(mx, math.Abs(float64(b[i])))
			identical = identical && a[i] == b[i]
			if i < 33*V {
				prefillIdentical = prefillIdentical && a[i] == b[i]
			}
		}
		pb, db := runtime.LinearWeightBytes(pm), runtime.LinearWeightBytes(dm)
		t.Logf("%s threads %d: max|logit diff| %.3g (max|logit| %.3g, bit-identical %v, prefill %v); linear weights %d bytes packed, %d dequantized",
			label, th, diff, mx, identical, prefillIdentical, pb, db)
		// A weight runs on one path for every number of rows (qlinear.go):
		// on int8 activations (decodeTol > 1e-5) prefill and decode share
		// the bound; on the tiles both are within 1e-5 and prefill is bit
		// for bit the dequantized model's.
		tol := decodeTol
		onTiles := decodeTol <= 1e-5
		if !(mx > 0) || prefillDiff > tol*mx || diff > tol*mx {
			t.Errorf("%s threads %d: packed logits differ from dequantized by %g in prefill, %g overall (bound %g)", label, th, prefillDiff, diff, tol*mx)
		}
		if th == 1 && prefillExact && onTiles && !prefillIdentical {
			t.Errorf("%s: one thread: packed prefill logits are not bit-identical to dequantized", label)
		}
		if pb <= 0 || pb >= db/4 {
			t.Errorf("%s: packed linear weights %d bytes, want > 0 and < a quarter of %d", label, pb, db)
		}
	}
}

// Packed quantized weights give the logits of the dequantize-at-load path
// for RTN at 4/3/2/1 bits (grouped, symmetric, per-channel) and GPTQ
// act-order.
func TestPackedLogitsMatchDequantized(t *testing.T) {
	const name = "stories260K-hf"
	calib := calibFor(t, name)
	d, err := arch.Load(shared.Path(t, name))
	if err != nil {
		t.Fatal(err)
	}
	targets, err := wquant.Targets(d)
	if err != nil {
		t.Fatal(err)
	}
	oneBit := map[string]weights.Options{}
	for _, tg := range targets {
		oneBit[tg.Name] = weights.Options{Bits: 1, GroupSize: 32}
	}
	for _, tc := range []struct {
		label string
		opt   wquant.Options
		tol   float64 // decode logits, relative to max|logit|
	}{
		{"rtn 4-bit g32", wquant.Options{Method: wquant.MethodRTN, Bits: 4, GroupSize: 32}, q8Tol(4, q8LogitTol)},
		{"rtn 3-bit g64 sym", wquant.Options{Method: wquant.MethodRTN, Bits: 3, GroupSize: 64, Symmetric: true}, q8Tol(3, q8LogitTol)},
		{"rtn 2-bit per-channel", wquant.Options{Method: wquant.MethodRTN, Bits: 2, GroupSize: 0}, q8Tol(2, q8LowBitLogitTol)},
		{"rtn 1-bit g32", wquant.Options{Method: wquant.MethodRTN, Bits: 4, GroupSize: 32, PerTensor: oneBit}, q8Tol(1, q8LowBitLogitTol)},
		{"gptq act-order 4-bit g32", wquant.Options{Method: wquant.MethodGPTQ, Bits: 4, GroupSize: 32, ActOrder: true}, q8Tol(4, q8LogitTol)},
	} {
		t.Run(tc.label, func(t *testing.T) {
			dir := quantizeShared(t, name, calib, tc.opt)
			if tc.opt.ActOrder {
				qd, err := arch.Load(dir)
				if err != nil {
					t.Fatal(err)
				}
				perms := 0
				for _, tq := range qd.Quant.Tensors {
					if tq.Perm {
						perms++
					}
				}
				if perms == 0 {
					t.Fatal("GPTQ act-order checkpoint has no permuted tensor: the test would not cover perm")
				}
			}
			comparePackedDequant(t, tc.label, dir, true, tc.tol)
		})
	}
}

// The MoE model with experts at mixed widths (1-4 bits) and 4-bit
// attention: packed experts match the dequantized ones.
func TestPackedMoEMatchesDequantized(t *testing.T) {
	const name = "stories260K-moe-hf"
	d, err := arch.Load(shared.Path(t, name))
	if err != nil {
		t.Fatal(err)
	}
	per := map[string]weights.Options{}
	for li := range d.Layers {
		mo := d.Layers[li].MoE
		if mo == nil {
			continue
		}
		for e, x := range mo.Experts {
			b := 1 + (e+li)%4
			per[x.Gate] = weights.Options{Bits: b, GroupSize: 32}
			per[x.Up] = weights.Options{Bits: b, GroupSize: 0, Symmetric: b > 1}
			per[x.Down] = weights.Options{Bits: 1 + (b % 4), GroupSize: 32}
		}
	}
	if len(per) == 0 {
		t.Fatal("no MoE layer")
	}
	dir := quantizeShared(t, name, calibFor(t, name), wquant.Options{Method: wquant.MethodRTN, Bits: 4, GroupSize: 32, PerTensor: per})
	// A third of the experts have 1- or 2-bit weights: the low-bit bound.
	tol := 1e-5
	for b := 1; b <= 4; b++ {
		tol = max(tol, q8Tol(b, q8LowBitLogitTol))
	}
	comparePackedDequant(t, fmt.Sprintf("moe, %d expert weights at 1-4 bits", len(per)), dir, false, tol)
}

// A steady-state decode step of a packed model allocates nothing.
func TestPackedDecodeAllocs(t *testing.T) {
	const name = "stories260K-moe-hf"
	dir := quantizeShared(t, name, calibFor(t, name), wquant.Options{Method: wquant.MethodRTN, Bits: 4, GroupSize: 32})
	m := loadQ(t, dir, 2, false)
	if b := runtime.LinearWeightBytes(m); b <= 0 {
		t.Fatalf("LinearWeightBytes %d", b)
	}
	c := m.NewCache(200)
	logits := make([]float32, m.Description().VocabSize)
	ctx := context.Background()
	if err := m.Forward(ctx, []int{1, 403, 407}, c, logits, false); err != nil {
		t.Fatal(err)
	}
	tok := []int{261}
	allocs := testing.AllocsPerRun(50, func() {
		if err := m.Forward(ctx, tok, c, logits, false); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("%.1f allocations per packed decode step, want 0", allocs)
	}
}
