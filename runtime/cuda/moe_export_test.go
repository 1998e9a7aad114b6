package cuda

// Hooks for the external tests of gpu_moe_test.go (package cuda_test,
// which may import quantize/wquant: that imports this package through
// internal/engine).

import (
	"math/rand/v2"
	"testing"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/quantize/weights"
	"github.com/lmpack/lmpack/runtime"
)

// CompareRun is compareRun (gpu_test.go) for the external tests.
var CompareRun = compareRun

// RunLogits is runLogits (gpu_test.go) for the external tests.
var RunLogits = runLogits

// LogitDiff is logitDiff for the external tests.
var LogitDiff = logitDiff

// StoriesTokens is storiesTokens (gpu_helpers_test.go).
var StoriesTokens = storiesTokens

// MoEStacks counts the MoE expert stacks (gate/up and down of each MoE
// layer) of a model loaded by this backend, and those kept packed for
// moe_gemv_q; shared counts the layers with a shared expert, gated those
// with its sigmoid gate.
func MoEStacks(m runtime.Model) (packed, total, shared, gated int) {
	for _, l := range m.(*Model).layers {
		e := l.moe
		if e == nil {
			continue
		}
		total += 2
		if e.guQ != nil {
			packed++
		}
		if e.downQ != nil {
			packed++
		}
		if e.shared != nil {
			shared++
		}
		if e.sharedGate != 0 {
			gated++
		}
	}
	return
}

// CheckMoEStacksPort reads the quantized experts of every MoE layer of d
// from src as moeStack does (runtime.ReadQuantized), packs them with
// moePack and runs checkMoEGemvQ (the moe_gemv_q port against
// Quantized.Dequantize) on gate/up (P = 2) and down (P = 1) with random
// routing of 3 tokens. It returns the widths met (bits → segments).
func CheckMoEStacksPort(t *testing.T, d *arch.Description, src runtime.TensorSource) map[int]int {
	t.Helper()
	r := rand.New(rand.NewPCG(81, 82))
	widths := map[int]int{}
	for li, l := range d.Layers {
		mo := l.MoE
		if mo == nil {
			continue
		}
		var gu, down []string
		for _, x := range mo.Experts {
			gu = append(gu, x.Gate, x.Up)
			down = append(down, x.Down)
		}
		I, H := mo.Experts[0].IntermediateSize, d.HiddenSize
		for _, st := range []struct {
			names    []string
			P, N, Kd int
			xsel     int
		}{{gu, 2, 2 * I, H, 0}, {down, 1, H, I, 1}} {
			if !moePackable(d.Quant, st.names) {
				t.Fatalf("layer %d: experts %v not packable", li, st.names[:2])
			}
			var qs []*weights.Quantized
			for _, n := range st.names {
				q, _, err := runtime.ReadQuantized(src, n, d.Quant.Tensors[n])
				if err != nil {
					t.Fatal(err)
				}
				widths[q.Bits]++
				qs = append(qs, q)
			}
			checkMoEGemvQ(t, st.names[0], r, qs, mo.NumExperts, st.P, st.N, st.Kd, 3, mo.TopK, st.xsel)
		}
	}
	return widths
}
