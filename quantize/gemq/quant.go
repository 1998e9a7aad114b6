package gemq

import (
	"fmt"
	"math"

	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/quantize/weights"
)

// Quantizer returns the dequantized copy of w, a [rows, cols] float32
// row-major Linear weight [out, in], quantized to bits bits per weight.
// It must not modify w.
type Quantizer func(w []float32, rows, cols, bits int) ([]float32, error)

// RTN returns the Quantizer of docs/METHODS.md §4 step 2: round-to-nearest on an
// asymmetric grid with fp16 scale and zero-point per group of group input
// columns (0: one group per output channel), via weights.QuantizeRTN: a
// min-max grid for bits 2, 3, 4 and 8, and at 1 bit the two levels μ ± α
// of each group (mean and mean absolute deviation, weights' 1-bit grid,
// the storage format quantize/wquant writes). Errors: those of
// weights.QuantizeRTN (bits, group size, non-finite weights, range).
func RTN(group int) Quantizer { return RTNOptions(group, false) }

// RTNOptions is RTN with weights.Options.MSEClip set to mseClip: each
// group's range clipped to the least squared rounding error (bits >= 2).
func RTNOptions(group int, mseClip bool) Quantizer {
	return func(w []float32, rows, cols, bits int) ([]float32, error) {
		q, err := weights.QuantizeRTN(w, rows, cols, weights.Options{Bits: bits, GroupSize: group, MSEClip: mseClip})
		if err != nil {
			return nil, err
		}
		out := make([]float32, rows*cols)
		q.Dequantize(out)
		return out, nil
	}
}

// Binarize returns the 1-bit dequantized copy of w [rows, cols]: in each
// group of group consecutive columns of a row (group <= 0 or >= cols: the
// whole row), ŵ = μ + α·sign(w − μ) with μ the group mean and α the mean
// of |w − μ| (the least-squares scale for fixed signs; XNOR-Net,
// Rastegari et al. 2016, §3.1, with a per-group offset). μ and α are
// rounded to float16 separately (weights' 1-bit grid, which RTN uses,
// stores them as a scale 2α and a fractional zero-point instead, so the
// two differ by float16 rounding). The squared error of a group is at most its variance (plus fp16
// rounding). Errors: a shape mismatch or a group that does not divide
// cols (weights.ErrShape, weights.ErrOptions); a non-finite weight
// (weights.ErrNonFinite) naming the element; a mean or scale beyond the
// float16 range (weights.ErrRange).
func Binarize(w []float32, rows, cols, group int) ([]float32, error) {
	if rows <= 0 || cols <= 0 || len(w) != rows*cols {
		return nil, fmt.Errorf("%w: weight has %d elements, want rows×cols = %d×%d", weights.ErrShape, len(w), rows, cols)
	}
	if group <= 0 || group > cols {
		group = cols
	}
	if cols%group != 0 {
		return nil, fmt.Errorf("%w: cols %d not divisible by group size %d", weights.ErrOptions, cols, group)
	}
	out := make([]float32, len(w))
	for r := 0; r < rows; r++ {
		for g0 := 0; g0 < cols; g0 += group {
			seg := w[r*cols+g0 : r*cols+g0+group]
			var mu float64
			for j, v := range seg {
				if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
					return nil, fmt.Errorf("%w: weight [%d, %d] is %v", weights.ErrNonFinite, r, g0+j, v)
				}
				mu += float64(v)
			}
			mu /= float64(group)
			var a float64
			for _, v := range seg {
				a += math.Abs(float64(v) - mu)
			}
			a /= float64(group)
			mq := float64(safetensors.F16ToFloat32(safetensors.F16FromFloat32(float32(mu))))
			aq := float64(safetensors.F16ToFloat32(safetensors.F16FromFloat32(float32(a))))
			if math.IsInf(mq, 0) || math.IsInf(aq, 0) {
				return nil, fmt.Errorf("%w: row %d group %d: mean %g or scale %g", weights.ErrRange, r, g0/group, mu, a)
			}
			dst := out[r*cols+g0 : r*cols+g0+group]
			for j, v := range seg {
				if float64(v) >= mu {
					dst[j] = float32(mq + aq)
				} else {
					dst[j] = float32(mq - aq)
				}
			}
		}
	}
	return out, nil
}

// FakeQuantize returns a copy of x whose gate, up and down_proj are
// quantized at bits with q and dequantized back to float32 (for measuring
// an allocation's quality through a float checkpoint). Errors: those of
// q, naming the projection and width.
func FakeQuantize(x *Expert, bits int, q Quantizer) (Expert, error) {
	H := 0
	if x.Inter > 0 {
		H = len(x.Gate) / x.Inter
	}
	out := Expert{Inter: x.Inter}
	for _, t := range []struct {
		name       string
		w          []float32
		rows, cols int
		dst        *[]float32
	}{{"gate_proj", x.Gate, x.Inter, H, &out.Gate}, {"up_proj", x.Up, x.Inter, H, &out.Up}, {"down_proj", x.Down, H, x.Inter, &out.Down}} {
		v, err := q(t.w, t.rows, t.cols, bits)
		if err != nil {
			return Expert{}, fmt.Errorf("gemq: %s at %d bits: %w", t.name, bits, err)
		}
		*t.dst = v
	}
	return out, nil
}

// GPTQExpert returns a copy of x quantized at bits with GPTQ (docs/METHODS.md §4
// step 4 and §7; weights.QuantizeGPTQ, asymmetric, groups of group input
// columns, 0 per output channel, default damping) and dequantized back to
// float32 (at 1 bit with weights' 1-bit grid): gate_proj and up_proj with
// the input Hessian hIn [H, H],
// down_proj with hDown [I, I], both float64 row-major (e.g.
// calibrate.ExpertLayer.Hessians, whose fallback for sparse experts is the
// layer's pooled Hessian and the identity). Errors: those of weights.NewHessianFromMatrix and
// weights.QuantizeGPTQ, naming the projection and width.
func GPTQExpert(x *Expert, bits, group int, hIn, hDown []float64) (Expert, error) {
	H := 0
	if x.Inter > 0 {
		H = len(x.Gate) / x.Inter
	}
	hi, err := weights.NewHessianFromMatrix(H, hIn)
	if err != nil {
		return Expert{}, fmt.Errorf("gemq: gate/up_proj input Hessian: %w", err)
	}
	hd, err := weights.NewHessianFromMatrix(x.Inter, hDown)
	if err != nil {
		return Expert{}, fmt.Errorf("gemq: down_proj input Hessian: %w", err)
	}
	out := Expert{Inter: x.Inter}
	for _, t := range []struct {
		name       string
		w          []float32
		rows, cols int
		h          *weights.Hessian
		dst        *[]float32
	}{{"gate_proj", x.Gate, x.Inter, H, hi, &out.Gate}, {"up_proj", x.Up, x.Inter, H, hi, &out.Up}, {"down_proj", x.Down, H, x.Inter, hd, &out.Down}} {
		q, err := weights.QuantizeGPTQ(t.w, t.rows, t.cols, t.h, weights.GPTQOptions{Options: weights.Options{Bits: bits, GroupSize: group}})
		if err != nil {
			return Expert{}, fmt.Errorf("gemq: %s at %d bits: %w", t.name, bits, err)
		}
		v := make([]float32, t.rows*t.cols)
		q.Dequantize(v)
		*t.dst = v
	}
	return out, nil
}
