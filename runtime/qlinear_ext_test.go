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

// tileLogitTol bounds, relative to max|logit|, how far the packed
// model's logits lie from the dequantize-at-load model's when no weight
// runs on int8 activations (the tiles, or 3 bits): the same float32
// arithmetic up to summation order.
const tileLogitTol = 1e-5

// anyQ8 reports whether weights of any of the given widths (groups of 32)
// decode on int8 activations (runtime.Q8Width).
func anyQ8(bits ...int) bool {
	for _, b := range bits {
		if runtime.Q8Width(b) {
			return true
		}
	}
	return false
}

// checkPackedLogits compares the packed model's logits a with the
// dequantize-at-load model's b, both [N, V], the first n0 positions a
// prefill: with the int8-activation criterion (runtime.CheckQ8Logits)
// when q8, some weight running on int8 activations; else within
// tileLogitTol·max|logit| in prefill and decode. It returns whether
// the prefill and all logits are bit for bit equal.
func checkPackedLogits(t *testing.T, label string, a, b []float32, V, n0 int, q8 bool) (prefillIdentical, identical bool) {
	t.Helper()
	var diff, mx, prefillDiff float64
	identical, prefillIdentical = true, true
	for i := range a {
		diff = math.Max(diff, math.Abs(float64(a[i]-b[i])))
		mx = math.Max(mx, math.Abs(float64(b[i])))
		identical = identical && a[i] == b[i]
		if i < n0*V {
			prefillDiff = diff
			prefillIdentical = identical
		}
	}
	t.Logf("%s: max|logit diff| %.3g (max|logit| %.3g, bit-identical %v, prefill %v)", label, diff, mx, identical, prefillIdentical)
	if !(mx > 0) {
		t.Errorf("%s: max|logit| %g of the dequantized model", label, mx)
	}
	if q8 {
		// A weight runs on one path for every number of rows
		// (qlinear.go): prefill and decode share the criterion.
		runtime.CheckQ8Logits(t, label, a, b, V)
		return prefillIdentical, identical
	}
	if tol := tileLogitTol * mx; prefillDiff > tol || diff > tol {
		t.Errorf("%s: packed logits differ from dequantized by %g in prefill, %g overall (bound %g)", label, prefillDiff, diff, tol)
	}
	return prefillIdentical, identical
}

// comparePackedDequant checks that the packed model's logits follow the
// dequantize-at-load model's (checkPackedLogits; prefill of 33 tokens
// then 7 decode steps, 1 and 3 threads) and that the packed linear
// weights take less than (maxBits + 4)/32 of the float32 bytes (maxBits
// the widest stored width; fp16 scale and zero per group of 32 add 1 bit
// per weight, per-channel less): a quarter up to 4 bits. q8 says that
// some weight runs on int8 activations (kernels.DotQ8Matrix;
// q8Widths); otherwise the prefill logits must also be bit for bit equal
// when prefillExact is set (the same kernels in the same summation order
// as the float weights).
func comparePackedDequant(t *testing.T, label, dir string, maxBits int, prefillExact, q8 bool) {
	t.Helper()
	ids := make([]int, 40)
	for i := range ids {
		ids[i] = (i*37 + 1) % 512
	}
	for _, th := range []int{1, 3} {
		pm, dm := loadQ(t, dir, th, false), loadQ(t, dir, th, true)
		a, b := runLogits(t, pm, ids, 33), runLogits(t, dm, ids, 33)
		V := pm.Description().VocabSize
		prefillIdentical, _ := checkPackedLogits(t, fmt.Sprintf("%s threads %d", label, th), a, b, V, 33, q8)
		pb, db := runtime.LinearWeightBytes(pm), runtime.LinearWeightBytes(dm)
		t.Logf("%s threads %d: linear weights %d bytes packed, %d dequantized", label, th, pb, db)
		if th == 1 && prefillExact && !q8 && !prefillIdentical {
			t.Errorf("%s: one thread: packed prefill logits are not bit-identical to dequantized", label)
		}
		if lim := db * int64(maxBits+4) / 32; pb <= 0 || pb >= lim {
			t.Errorf("%s: packed linear weights %d bytes, want > 0 and < %d = (%d+4)/32 of %d", label, pb, lim, maxBits, db)
		}
	}
}

// Packed quantized weights give the logits of the dequantize-at-load path
// for RTN at 8/4/3/2/1 bits (grouped, symmetric, per-channel) and GPTQ
// act-order (stories260K's down_proj has 172 columns: group 32 falls back
// to per channel there).
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
		q8    bool // some weight decodes on int8 activations
	}{
		{"rtn 4-bit g32", wquant.Options{Method: wquant.MethodRTN, Bits: 4, GroupSize: 32}, anyQ8(4)},
		{"rtn 8-bit g32", wquant.Options{Method: wquant.MethodRTN, Bits: 8, GroupSize: 32}, anyQ8(8)},
		{"rtn 3-bit g64 sym", wquant.Options{Method: wquant.MethodRTN, Bits: 3, GroupSize: 64, Symmetric: true}, anyQ8(3)},
		{"rtn 2-bit per-channel", wquant.Options{Method: wquant.MethodRTN, Bits: 2, GroupSize: 0}, false}, // per-channel 2-bit stays on the tiles (qlinear.go q8)
		{"rtn 1-bit g32", wquant.Options{Method: wquant.MethodRTN, Bits: 4, GroupSize: 32, PerTensor: oneBit}, anyQ8(1)},
		{"gptq act-order 4-bit g32", wquant.Options{Method: wquant.MethodGPTQ, Bits: 4, GroupSize: 32, ActOrder: true}, anyQ8(4)},
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
			comparePackedDequant(t, tc.label, dir, tc.opt.Bits, true, tc.q8)
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
	comparePackedDequant(t, fmt.Sprintf("moe, %d expert weights at 1-4 bits", len(per)), dir, 4, false, anyQ8(1, 2, 3, 4))
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
