package runtime

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/quantize/weights"
)

// Quantized checkpoints (docs/QUANT.md): WithQuant serves quantized weights
// dequantized to float32. The CPU backend uses it for the weights it does
// not keep packed (all of them under LoadOptions.DequantizeWeights, else
// only those outside the attention, MLP and lm_head matmuls; qlinear.go).

// quantSource serves the quantized weights of d.Quant as dequantized F32
// tensors under their original names; every other name goes to src.
type quantSource struct {
	src TensorSource
	q   *arch.Quantization
}

// WithQuant wraps src when d has a quantization block (docs/QUANT.md),
// else returns src: the wrapper serves every quantized weight NAME.weight
// as a dequantized F32 tensor [rows, cols] built from NAME.qweight,
// NAME.scales, NAME.qzeros and NAME.perm, and passes every other name to
// src. Backends call it in Load. Errors (from Tensor): ErrBadWeights
// naming the storage tensor that is missing or corrupt.
func WithQuant(d *arch.Description, src TensorSource) TensorSource {
	if d.Quant == nil || len(d.Quant.Tensors) == 0 {
		return src
	}
	return &quantSource{src: src, q: d.Quant}
}

// Tensor implements TensorSource.
func (s *quantSource) Tensor(name string) (*safetensors.Tensor, error) {
	tq, ok := s.q.Tensors[name]
	if !ok {
		return s.src.Tensor(name)
	}
	qt, file, err := ReadQuantized(s.src, name, tq)
	if err != nil {
		return nil, err
	}
	w := make([]float32, qt.Rows*qt.Cols)
	qt.Dequantize(w)
	return &safetensors.Tensor{Name: name, File: file, DType: safetensors.F32, Shape: []int{qt.Rows, qt.Cols}, Data: safetensors.F32Bytes(w)}, nil
}

// ReadQuantized reads the storage tensors of the quantized weight name
// (NAME.qweight, NAME.scales, NAME.qzeros, NAME.perm; docs/QUANT.md) from
// src and returns them as a weights.Quantized of shape [rows, cols], with
// cols inferred from the scales and group size, and the path of the
// qweight's file. The qweight's row bytes must equal
// weights.RowBytes(cols, bits) exactly.
//
// Errors wrap ErrBadWeights and name the tensor: a missing storage tensor,
// a wrong dtype or shape, a scale that is not finite and > 0, a zero-point
// that is not an integer in [0, 2^bits−1] (at 1 bit: not finite), a permutation that is not one of [0, cols), stray bits
// set past the last code of a row.
func ReadQuantized(src TensorSource, name string, tq arch.TensorQuant) (*weights.Quantized, string, error) {
	p := arch.QuantPrefix(name)
	get := func(suffix string, dt safetensors.DType, rank int) (*safetensors.Tensor, error) {
		n := p + suffix
		t, err := src.Tensor(n)
		if err != nil {
			if errors.Is(err, safetensors.ErrMissingTensor) {
				return nil, fmt.Errorf("runtime: %w: quantized weight %q: tensor %q is missing (%v)", ErrBadWeights, name, n, err)
			}
			return nil, fmt.Errorf("runtime: quantized weight %q: tensor %q: %w", name, n, err)
		}
		if t.DType != dt || len(t.Shape) != rank {
			return nil, fmt.Errorf("runtime: %w: %s: tensor %q: dtype %s shape %v, want dtype %s with %d dims", ErrBadWeights, t.File, n, t.DType, t.Shape, dt, rank)
		}
		if len(t.Data) != t.NumElements()*dt.Size() {
			return nil, fmt.Errorf("runtime: %w: %s: tensor %q: %d bytes, want %d", ErrBadWeights, t.File, n, len(t.Data), t.NumElements()*dt.Size())
		}
		return t, nil
	}
	if tq.GroupSize <= 0 {
		return nil, "", fmt.Errorf("runtime: %w: quantized weight %q: group_size %d", ErrBadWeights, name, tq.GroupSize)
	}
	qw, err := get(arch.SuffixQWeight, safetensors.U8, 2)
	if err != nil {
		return nil, "", err
	}
	sc, err := get(arch.SuffixScales, safetensors.F16, 2)
	if err != nil {
		return nil, "", err
	}
	rows, groups := sc.Shape[0], sc.Shape[1]
	cols := groups * tq.GroupSize
	if qw.Shape[0] != rows || qw.Shape[1] != weights.RowBytes(cols, tq.Bits) {
		return nil, "", fmt.Errorf("runtime: %w: %s: tensor %q: shape %v, want [%d, %d] (%d columns of %d bits, from %q %v and group_size %d)",
			ErrBadWeights, qw.File, p+arch.SuffixQWeight, qw.Shape, rows, weights.RowBytes(cols, tq.Bits), cols, tq.Bits, p+arch.SuffixScales, sc.Shape, tq.GroupSize)
	}
	q := &weights.Quantized{Rows: rows, Cols: cols, Bits: tq.Bits, GroupSize: tq.GroupSize, Symmetric: tq.Symmetric,
		Codes: qw.Data, Scales: make([]uint16, rows*groups)}
	rb := weights.RowBytes(cols, tq.Bits)
	if tail := uint(rb*8 - cols*tq.Bits); tail > 0 {
		for r := 0; r < rows; r++ {
			if qw.Data[(r+1)*rb-1]>>(8-tail) != 0 {
				return nil, "", fmt.Errorf("runtime: %w: %s: tensor %q: row %d has bits set past its last code (corrupt packing)", ErrBadWeights, qw.File, p+arch.SuffixQWeight, r)
			}
		}
	}
	for i := range q.Scales {
		h := binary.LittleEndian.Uint16(sc.Data[2*i:])
		v := safetensors.F16ToFloat32(h)
		if !(v > 0) || math.IsInf(float64(v), 0) {
			return nil, "", fmt.Errorf("runtime: %w: %s: tensor %q: scale [%d, %d] is %v, want finite and > 0", ErrBadWeights, sc.File, p+arch.SuffixScales, i/groups, i%groups, v)
		}
		q.Scales[i] = h
	}
	if !tq.Symmetric {
		z, err := get(arch.SuffixQZeros, safetensors.F16, 2)
		if err != nil {
			return nil, "", err
		}
		if !slices.Equal(z.Shape, sc.Shape) {
			return nil, "", fmt.Errorf("runtime: %w: %s: tensor %q: shape %v, want %v like %q", ErrBadWeights, z.File, p+arch.SuffixQZeros, z.Shape, sc.Shape, p+arch.SuffixScales)
		}
		maxq := float32(int(1)<<uint(tq.Bits) - 1)
		q.Zeros = make([]uint16, rows*groups)
		for i := range q.Zeros {
			h := binary.LittleEndian.Uint16(z.Data[2*i:])
			v := safetensors.F16ToFloat32(h)
			if tq.Bits == 1 { // the fractional zero-point of the 1-bit grid (weights.binaryGrid)
				if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
					return nil, "", fmt.Errorf("runtime: %w: %s: tensor %q: zero-point [%d, %d] is %v, want finite", ErrBadWeights, z.File, p+arch.SuffixQZeros, i/groups, i%groups, v)
				}
			} else if !(v >= 0 && v <= maxq) || v != float32(math.Round(float64(v))) {
				return nil, "", fmt.Errorf("runtime: %w: %s: tensor %q: zero-point [%d, %d] is %v, want an integer in [0, %v]", ErrBadWeights, z.File, p+arch.SuffixQZeros, i/groups, i%groups, v, maxq)
			}
			q.Zeros[i] = h
		}
	}
	if tq.Perm {
		pt, err := get(arch.SuffixPerm, safetensors.I32, 1)
		if err != nil {
			return nil, "", err
		}
		if pt.Shape[0] != cols {
			return nil, "", fmt.Errorf("runtime: %w: %s: tensor %q: shape %v, want [%d]", ErrBadWeights, pt.File, p+arch.SuffixPerm, pt.Shape, cols)
		}
		seen := make([]bool, cols)
		q.Perm = make([]int32, cols)
		for j := range q.Perm {
			v := int32(binary.LittleEndian.Uint32(pt.Data[4*j:]))
			if v < 0 || int(v) >= cols || seen[v] {
				return nil, "", fmt.Errorf("runtime: %w: %s: tensor %q: entry %d is %d, want a permutation of [0, %d)", ErrBadWeights, pt.File, p+arch.SuffixPerm, j, v, cols)
			}
			seen[v] = true
			q.Perm[j] = v
		}
	}
	return q, qw.File, nil
}
