package cuda

import (
	"fmt"
	"unsafe"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/quantize/weights"
	"github.com/lmpack/lmpack/runtime"
)

// moeTabStride is the int64 count of one segment's entry in moe_gemv_q's
// table: codes byte offset, scales offset, zeros offset (−1: symmetric),
// perm offset (−1: none), bits + 256·group.
const moeTabStride = 5

// moeHost is the host image of a moeQW: the segments' storage
// concatenated in segment order and their table (moeTabStride int64 per
// segment, see moe_gemv_q in kernels/moe.cu).
type moeHost struct {
	codes  []byte
	scales []uint16
	zeros  []uint16
	perm   []int32
	tab    []int64
}

// moePack concatenates the quantized weights qs (segment s = expert·parts
// + part, each [rows, cols] with its own bits, group size, symmetry and
// permutation) into moe_gemv_q's buffers and table.
func moePack(qs []*weights.Quantized) moeHost {
	var h moeHost
	for _, q := range qs {
		zo, po := int64(-1), int64(-1)
		if !q.Symmetric {
			zo = int64(len(h.zeros))
		}
		if q.Perm != nil {
			po = int64(len(h.perm))
		}
		h.tab = append(h.tab, int64(len(h.codes)), int64(len(h.scales)), zo, po, int64(q.Bits)+256*int64(q.GroupSize))
		h.codes = append(h.codes, q.Codes...)
		h.scales = append(h.scales, q.Scales...)
		if !q.Symmetric {
			h.zeros = append(h.zeros, q.Zeros...)
		}
		h.perm = append(h.perm, q.Perm...)
	}
	return h
}

// moePackable reports whether the expert weights names can stay packed
// for moe_gemv_q: every one is quantized (in q.Tensors) at 1, 2, 3, 4 or
// 8 bits with a positive group size. Widths, groups, symmetry and
// act-order permutations may differ between them.
func moePackable(q *arch.Quantization, names []string) bool {
	if q == nil || len(names) == 0 {
		return false
	}
	for _, n := range names {
		tq, ok := q.Tensors[n]
		if !ok || tq.GroupSize <= 0 {
			return false
		}
		switch tq.Bits {
		case 1, 2, 3, 4, 8:
		default:
			return false
		}
	}
	return true
}

// moeStack loads the expert weights names (segment order: expert·parts +
// part, each [rows, cols]) packed when moePackable, else returns nil (the
// caller takes the host-dequantized binary16 path). Errors: those of
// runtime.ReadQuantized (wrapping runtime.ErrBadWeights, naming the
// tensor), a quantized shape other than [rows, cols], device errors.
func (m *Model) moeStack(raw runtime.TensorSource, names []string, rows, cols, parts int) (*moeQW, error) {
	if !moePackable(m.d.Quant, names) {
		return nil, nil
	}
	qs := make([]*weights.Quantized, len(names))
	for i, n := range names {
		q, file, err := runtime.ReadQuantized(raw, n, m.d.Quant.Tensors[n])
		if err != nil {
			return nil, fmt.Errorf("cuda: %w", err)
		}
		if q.Rows != rows || q.Cols != cols {
			return nil, fmt.Errorf("cuda: %w: %s: quantized weight %q: shape [%d, %d], want [%d, %d]", runtime.ErrBadWeights, file, n, q.Rows, q.Cols, rows, cols)
		}
		qs[i] = q
	}
	h := moePack(qs)
	w := &moeQW{parts: parts}
	if err := allocUpload(m, &w.codes, h.codes); err != nil {
		return nil, err
	}
	if err := allocUpload(m, &w.scales, h.scales); err != nil {
		return nil, err
	}
	if err := allocUpload(m, &w.zeros, h.zeros); err != nil {
		return nil, err
	}
	if err := allocUpload(m, &w.perm, h.perm); err != nil {
		return nil, err
	}
	if err := allocUpload(m, &w.tab, h.tab); err != nil {
		return nil, err
	}
	return w, nil
}

// allocUpload allocates device memory for v (owned by m, freed by Close),
// copies v there and sets *p; an empty v leaves *p = 0.
func allocUpload[T any](m *Model, p *DevPtr, v []T) error {
	if len(v) == 0 {
		return nil
	}
	var z T
	q, err := m.dev.Alloc(int64(len(v)) * int64(unsafe.Sizeof(z)))
	if err != nil {
		return err
	}
	m.allocs = append(m.allocs, q)
	*p = q
	return Upload(m.dev, q, v)
}
