package runtime

import (
	"encoding/binary"
	"fmt"
	"unsafe"

	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/runtime/kernels"
)

// BF16 and F16 linear weights in place (CPU backend).
//
// By default (LoadOptions.DequantizeWeights unset) a linear weight whose
// source tensors are all BF16 or F16 is not widened to float32: the
// halfLinear views the tensors' data, the read-only mapping of the
// safetensors file, as 16-bit words, and every matmul runs
// kernels.Pool.MatMulNTHalf on it, which widens w in registers and gives
// every output the bits of kernels.MatMulNTRows on the widened matrix
// (widening is exact). Logits are then bit-identical to the widened path,
// on any number of threads and for any batch, while the weights take 2
// bytes per element (the file's pages) instead of 4 more on the heap. A
// BF16/F16 embedding is used the same way: rows gathered and widened per
// token (embedRow), and a tied lm_head reads it in place.
//
// The tensors' data must stay valid until the model is closed: a
// safetensors.Checkpoint left open (model.Load and internal/engine keep
// it until Close). Data that is not 2-byte aligned, or a big-endian host,
// gets a copy of the 16-bit words instead (still 2 bytes per element).

// halfLinear is W [n, k] of 16-bit floats as row-stacked segments (q, k
// and v, or gate and up, stack their rows).
type halfLinear struct {
	n, k int
	segs []halfSeg
}

// halfSeg is rows [row0, row0+rows) of a halfLinear: w [rows, k] 16-bit
// floats of kind.
type halfSeg struct {
	row0, rows int
	kind       kernels.HalfKind
	w          []uint16
}

// halfKindOf returns the kernels kind of dtype, or 0 for another dtype.
func halfKindOf(dt safetensors.DType) kernels.HalfKind {
	switch dt {
	case safetensors.BF16:
		return kernels.BF16
	case safetensors.F16:
		return kernels.F16
	}
	return 0
}

// littleEndian reports whether the host stores a uint16 as the file does.
var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// halfWords returns data (little-endian 16-bit words) as []uint16: a view
// when aligned on a little-endian host, else a copy.
func halfWords(data []byte) []uint16 {
	n := len(data) / 2
	if n == 0 {
		return nil
	}
	if littleEndian && uintptr(unsafe.Pointer(&data[0]))%2 == 0 {
		return unsafe.Slice((*uint16)(unsafe.Pointer(&data[0])), n)
	}
	w := make([]uint16, n)
	for i := range w {
		w[i] = binary.LittleEndian.Uint16(data[2*i:])
	}
	return w
}

// loadHalfLinear returns the weights names (each [rows[i], cols]) stacked
// by rows as a halfLinear when every one is a BF16 or F16 tensor of src;
// ok is false (and nothing is read further) when one has another dtype.
// Every value is checked finite. Errors wrap ErrBadWeights and name the
// file, the tensor and what was expected (floatTensor), or the element
// that is NaN/Inf.
func loadHalfLinear(src TensorSource, cols int, names []string, rows []int) (w linear, ok bool, err error) {
	ts := make([]*safetensors.Tensor, len(names))
	for i, n := range names {
		t, err := floatTensor(src, n, rows[i], cols)
		if err != nil {
			return linear{}, false, err
		}
		if halfKindOf(t.DType) == 0 {
			return linear{}, false, nil
		}
		ts[i] = t
	}
	h := &halfLinear{k: cols}
	for i, t := range ts {
		if err := checkHalfFinite(t); err != nil {
			return linear{}, false, err
		}
		h.segs = append(h.segs, halfSeg{row0: h.n, rows: rows[i], kind: halfKindOf(t.DType), w: halfWords(t.Data)})
		h.n += rows[i]
	}
	return linear{h: h}, true, nil
}

// checkHalfFinite returns an error wrapping ErrBadWeights, naming the
// file, the tensor and the element, when t holds a NaN or ±Inf.
func checkHalfFinite(t *safetensors.Tensor) error {
	if i, what := safetensors.FirstNonFinite(t.DType, t.Data); i >= 0 {
		return fmt.Errorf("runtime: %w: %s: tensor %q: element %d is %s (checked at load)", ErrBadWeights, t.File, t.Name, i, what)
	}
	return nil
}

// bytes returns the 16-bit words' bytes of h.
func (h *halfLinear) bytes() int64 {
	var b int64
	for _, s := range h.segs {
		b += 2 * int64(len(s.w))
	}
	return b
}

// matMul computes y = x·Wᵀ for x [m, h.k] (leading dimension ldx) into y
// [m, h.n] (leading dimension ldy), one kernels.Pool.MatMulNTHalf per
// segment.
func (h *halfLinear) matMul(p *kernels.Pool, m int, x []float32, ldx int, y []float32, ldy int) {
	for _, s := range h.segs {
		p.MatMulNTHalf(s.kind, m, s.rows, h.k, x, ldx, s.w, h.k, y[s.row0:], ldy)
	}
}

// row writes row r of W, widened to float32, into dst [k].
func (h *halfLinear) row(r int, dst []float32) {
	for _, s := range h.segs {
		if r < s.row0+s.rows {
			lr := r - s.row0
			kernels.WidenHalf(s.kind, dst[:h.k], s.w[lr*h.k:(lr+1)*h.k])
			return
		}
	}
	panic(fmt.Sprintf("runtime: halfLinear row %d of %d", r, h.n))
}

// embedRow writes the embedding of token id into dst [H]: a copy of the
// float32 row, or the 16-bit row widened.
func (m *cpuModel) embedRow(dst []float32, id int) {
	H := m.d.HiddenSize
	if m.embedH != nil {
		m.embedH.row(id, dst[:H])
		return
	}
	copy(dst[:H], m.embed[id*H:(id+1)*H])
}

// loadEmbedding loads the embedding name [V, H]: in place as m.embedH
// (returning nil) when it is BF16 or F16, else as float32 (loadF32).
// Errors are loadHalfLinear's and loadF32's.
func loadEmbedding(m *cpuModel, src TensorSource, name string, V, H int) ([]float32, error) {
	w, ok, err := loadHalfLinear(src, H, []string{name}, []int{V})
	if err != nil {
		return nil, err
	}
	if ok {
		m.embedH = w.h
		return nil, nil
	}
	return loadF32(src, name, V, H)
}
