package gguf

import (
	"errors"
	"fmt"
	"math"

	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/quantize/weights"
)

// ErrNotExact: a weights.Quantized has no counterpart among the GGUF block
// types that holds its values (the caller requantises from the dequantised
// weights instead). The wrapping error says why.
var ErrNotExact = errors.New("gguf: no exact GGUF block type")

// Conversion says what FromQuantized made of a weights.Quantized.
type Conversion struct {
	// Type is the GGUF type of the blocks.
	Type Type
	// Exact: every element decodes (Dequantize) to the float32 that
	// weights.Quantized.Dequantize gives, bit for bit.
	Exact bool
	// MaxAbsErr is max |GGUF value − lmpack value| over the tensor, in the
	// weights' units; 0 when Exact. Only Q4_1 can be inexact: its offset
	// m = −scale·zero rounded to fp16 (see Q4_1FromZeros).
	MaxAbsErr float64
	// Reason is a one-line account for the export report, e.g.
	// "symmetric 4-bit group 32 → Q4_0: d = scale, nibble = code".
	Reason string
}

// FromQuantized writes q, a quantized [Rows, Cols] weight (lmpack's grid
// ŵ = s·(c − z), docs/QUANT.md), as GGUF blocks without requantising,
// choosing the smallest type that holds it:
//
//   - 8 bits → Q8_0 with d = s and qs = c − z (exact; needs every c − z in
//     [−128, 127], which the symmetric grid, z = 128, always satisfies);
//   - 1–4 bits → Q4_0 with d = s and nibble = c − z + 8 when every block's
//     nibbles fall in [0, 15] (exact: always for symmetric grids and for
//     2- and 3-bit asymmetric ones), else Q4_1 with d = s and
//     m = −s·(z + k) rounded to fp16 (Q4_1FromZeros; exact only where fp16
//     holds m, Conversion.MaxAbsErr says by how much otherwise).
//
// Blocks are 32 consecutive columns in the original column order, so the
// group size must be a multiple of 32 (per-channel groups included) and
// Cols a multiple of 32. An act-order permutation (q.Perm) is undone first;
// that is exact only when every block of 32 original columns comes from a
// single group. The result is Rows·RowBytes(Cols) bytes, row-major.
//
// Errors: ErrNotExact (wrapped, with the reason) when no type fits;
// ErrValue for malformed codes or scales.
func FromQuantized(q *weights.Quantized) ([]byte, Conversion, error) {
	var cands []Type
	switch {
	case q.Bits == 8:
		cands = []Type{TypeQ8_0}
	case q.Bits >= 1 && q.Bits <= 4:
		cands = []Type{TypeQ4_0, TypeQ4_1}
	default:
		return nil, Conversion{}, fmt.Errorf("%w: %d-bit codes", ErrNotExact, q.Bits)
	}
	var firstErr error
	for _, t := range cands {
		b, c, err := FromQuantizedAs(q, t)
		if err == nil {
			return b, c, nil
		}
		if !errors.Is(err, ErrNotExact) {
			return nil, Conversion{}, err
		}
		if firstErr == nil {
			firstErr = err
		}
	}
	return nil, Conversion{}, firstErr
}

// FromQuantizedAs is FromQuantized with the target type fixed: Q8_0
// (exact when every c − z lies in [−128, 127]: any grid of at most 7 bits,
// and 8-bit grids with z = 128), Q4_0 (exact when every c − z + 8 lies in
// [0, 15]) or Q4_1 (any grid whose blocks span at most 16 codes; m rounded
// to fp16). Errors: ErrType for another t; ErrNotExact when t cannot hold
// q's codes; ErrValue for malformed codes or scales.
func FromQuantizedAs(q *weights.Quantized, t Type) ([]byte, Conversion, error) {
	desc := describe(q)
	if t != TypeQ8_0 && t != TypeQ4_0 && t != TypeQ4_1 {
		return nil, Conversion{}, fmt.Errorf("%w: %v from %s (want Q8_0, Q4_0 or Q4_1)", ErrType, t, desc)
	}
	if err := checkQuantized(q); err != nil {
		return nil, Conversion{}, err
	}
	if q.Cols%qk != 0 || q.GroupSize%qk != 0 {
		return nil, Conversion{}, fmt.Errorf("%w: %s: %v blocks of %d columns need cols (%d) and group size (%d) multiples of %d", ErrNotExact, desc, t, qk, q.Cols, q.GroupSize, qk)
	}
	cols := q.Cols
	ng := cols / q.GroupSize
	// grp[c] is the storage group of original column c; src[c] its storage
	// column.
	grp := make([]int, cols)
	src := make([]int, cols)
	for j := 0; j < cols; j++ {
		c := j
		if q.Perm != nil {
			c = int(q.Perm[j])
		}
		grp[c], src[c] = j/q.GroupSize, j
	}
	for b := 0; b < cols/qk; b++ {
		for c := b * qk; c < (b+1)*qk; c++ {
			if grp[c] != grp[b*qk] {
				return nil, Conversion{}, fmt.Errorf("%w: %s: the act-order permutation puts original columns %d and %d of block %d in different groups (%d, %d); requantise", ErrNotExact, desc, b*qk, c, b, grp[b*qk], grp[c])
			}
		}
	}
	nb := q.Rows * cols / qk
	codes := make([]uint8, q.Rows*cols) // original column order
	scales := make([]uint16, nb)
	zeros := make([]uint16, nb)
	rb := weights.RowBytes(cols, q.Bits)
	row := make([]uint8, cols)
	zsym := safetensors.F16FromFloat32(float32(int(1) << uint(q.Bits-1)))
	for r := 0; r < q.Rows; r++ {
		weights.UnpackRow(row, q.Codes[r*rb:(r+1)*rb], q.Bits)
		for c := 0; c < cols; c++ {
			codes[r*cols+c] = row[src[c]]
		}
		for b := 0; b < cols/qk; b++ {
			g := r*ng + grp[b*qk]
			scales[r*cols/qk+b] = q.Scales[g]
			if q.Symmetric {
				zeros[r*cols/qk+b] = zsym
			} else {
				zeros[r*cols/qk+b] = q.Zeros[g]
			}
		}
	}
	var out []byte
	var err error
	conv := Conversion{Type: t}
	switch t {
	case TypeQ8_0, TypeQ4_0:
		off, lo, hi := 0, -128, 127
		if t == TypeQ4_0 {
			off, lo, hi = 8, 0, 15
		}
		sc := make([]int8, len(codes))
		nib := make([]uint8, len(codes))
		for i, c := range codes {
			zf := safetensors.F16ToFloat32(zeros[i/qk])
			z := int(zf)
			if float32(z) != zf {
				return nil, Conversion{}, fmt.Errorf("%w: %s: zero-point %g of block %d is not an integer; %v needs d·(c − z) with integer c − z", ErrNotExact, desc, zf, i/qk, t)
			}
			v := int(c) - z + off
			if v < lo || v > hi {
				return nil, Conversion{}, fmt.Errorf("%w: %s: block %d has code %d with zero-point %d, outside %v's range [%d, %d] for c − z + %d", ErrNotExact, desc, i/qk, c, z, t, lo, hi, off)
			}
			sc[i], nib[i] = int8(v), uint8(v)
		}
		if t == TypeQ8_0 {
			out, err = Q8_0FromCodes(sc, scales)
			conv.Reason = fmt.Sprintf("%s → Q8_0: d = scale, qs = code − zero", desc)
		} else {
			out, err = Q4_0FromCodes(nib, scales)
			conv.Reason = fmt.Sprintf("%s → Q4_0: d = scale, nibble = code − zero + 8", desc)
		}
	case TypeQ4_1:
		for b := 0; b < nb; b++ {
			lo, hi := uint8(255), uint8(0)
			for _, c := range codes[b*qk : (b+1)*qk] {
				lo, hi = min(lo, c), max(hi, c)
			}
			if hi-lo > 15 {
				return nil, Conversion{}, fmt.Errorf("%w: %s: block %d spans codes %d..%d, more than Q4_1's 16 levels", ErrNotExact, desc, b, lo, hi)
			}
			if hi > 15 {
				for j := b * qk; j < (b+1)*qk; j++ {
					codes[j] -= lo
				}
				// ŵ = s·(c − z) = s·((c − lo) − (z − lo))
				zeros[b] = safetensors.F16FromFloat32(safetensors.F16ToFloat32(zeros[b]) - float32(lo))
			}
		}
		out, _, err = Q4_1FromZeros(codes, scales, zeros)
		conv.Reason = fmt.Sprintf("%s → Q4_1: d = scale, m = −scale·zero rounded to fp16", desc)
	}
	if err != nil {
		return nil, Conversion{}, fmt.Errorf("gguf: %s: %w", desc, err)
	}
	// Measure what the blocks decode to against lmpack's own values.
	got, err := Dequantize(t, out, cols)
	if err != nil {
		return nil, Conversion{}, err
	}
	want := make([]float32, q.Rows*cols)
	q.Dequantize(want)
	conv.Exact = true
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			conv.Exact = false
			conv.MaxAbsErr = max(conv.MaxAbsErr, math.Abs(float64(got[i])-float64(want[i])))
		}
	}
	if !conv.Exact {
		conv.Reason += fmt.Sprintf(" (not exact: max |err| %.3g)", conv.MaxAbsErr)
	}
	return out, conv, nil
}

func describe(q *weights.Quantized) string {
	kind := "asymmetric"
	if q.Symmetric {
		kind = "symmetric"
	}
	g := fmt.Sprintf("group %d", q.GroupSize)
	if q.GroupSize == q.Cols {
		g = "per-channel"
	}
	s := fmt.Sprintf("%s %d-bit %s", kind, q.Bits, g)
	if q.Perm != nil {
		s += " act-order"
	}
	return s
}

// checkQuantized validates q's slice lengths against its shape.
func checkQuantized(q *weights.Quantized) error {
	if q.Rows <= 0 || q.Cols <= 0 || q.GroupSize <= 0 || q.Cols%q.GroupSize != 0 {
		return fmt.Errorf("%w: quantized weight [%d, %d] with group size %d", ErrShape, q.Rows, q.Cols, q.GroupSize)
	}
	switch q.Bits {
	case 1, 2, 3, 4, 8:
	default:
		return fmt.Errorf("%w: quantized weight with %d-bit codes", ErrValue, q.Bits)
	}
	ng := q.Rows * (q.Cols / q.GroupSize)
	if len(q.Codes) != q.Rows*weights.RowBytes(q.Cols, q.Bits) || len(q.Scales) != ng ||
		(!q.Symmetric && len(q.Zeros) != ng) || (q.Perm != nil && len(q.Perm) != q.Cols) {
		return fmt.Errorf("%w: quantized weight [%d, %d] %d-bit group %d: codes %d, scales %d, zeros %d, perm %d do not match the shape",
			ErrShape, q.Rows, q.Cols, q.Bits, q.GroupSize, len(q.Codes), len(q.Scales), len(q.Zeros), len(q.Perm))
	}
	if q.Perm != nil {
		seen := make([]bool, q.Cols)
		for j, p := range q.Perm {
			if p < 0 || int(p) >= q.Cols || seen[p] {
				return fmt.Errorf("%w: perm[%d] = %d is not part of a permutation of [0, %d)", ErrValue, j, p, q.Cols)
			}
			seen[p] = true
		}
	}
	return nil
}
