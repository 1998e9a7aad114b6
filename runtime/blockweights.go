package runtime

import (
	"fmt"

	"github.com/lmpack/lmpack/formats/safetensors"
)

// Weights converted one decoder block at a time (LoadOptions.ConvertPerBlock):
// a block's float linear weights keep their source tensors (linear.parts)
// and are converted to float32 into cpuModel.blockBuf when the block runs;
// linear.f points into blockBuf from convertBlock to releaseBlock.

// blockLinears calls f on every linear weight of decoder block l: q/k/v,
// o, and gate/up and down of its MLP, routed experts and shared expert.
func (l *cpuLayer) blockLinears(f func(*linear)) {
	f(&l.wqkv)
	f(&l.wo)
	mlp := func(x *cpuMLP) {
		if x != nil {
			f(&x.gu)
			f(&x.down)
		}
	}
	mlp(l.mlp)
	if l.moe != nil {
		for j := range l.moe.experts {
			mlp(&l.moe.experts[j])
		}
		mlp(l.moe.shared)
	}
}

// loadBlockLinear returns the float weights names (each [rows[i], cols])
// stacked by rows as a linear converted per block: the source tensors,
// checked for presence, shape and a float dtype (floatTensor); their
// values are checked by checkBlock. Errors are floatTensor's.
func loadBlockLinear(src TensorSource, cols int, names []string, rows []int) (linear, error) {
	parts := make([]*safetensors.Tensor, len(names))
	for i, n := range names {
		t, err := floatTensor(src, n, rows[i], cols)
		if err != nil {
			return linear{}, err
		}
		parts[i] = t
	}
	return linear{parts: parts}, nil
}

// blockFloats returns the float32 elements of block l's weights converted
// per block.
func (l *cpuLayer) blockFloats() int {
	n := 0
	l.blockLinears(func(w *linear) {
		for _, t := range w.parts {
			n += t.NumElements()
		}
	})
	return n
}

// convertBlock converts block l's weights kept per block into m.blockBuf
// (at least l.blockFloats() long) and points their f at them. A no-op for
// a block without such weights.
func (m *cpuModel) convertBlock(l *cpuLayer) {
	off := 0
	l.blockLinears(func(w *linear) {
		if w.parts == nil {
			return
		}
		start := off
		for _, t := range w.parts {
			n := t.NumElements()
			// Shape and dtype were checked by loadBlockLinear, so
			// Float32Into cannot fail.
			if err := t.Float32Into(m.blockBuf[off : off+n]); err != nil {
				panic(fmt.Sprintf("runtime: converting a block weight: %v", err))
			}
			off += n
		}
		w.f = m.blockBuf[start:off:off]
	})
}

// releaseBlock unsets the float32 view of block l's weights kept per block
// (the buffer is the next block's), so that a stale view cannot be used.
func (m *cpuModel) releaseBlock(l *cpuLayer) {
	l.blockLinears(func(w *linear) {
		if w.parts != nil {
			w.f = nil
		}
	})
}

// checkBlock checks at load that block l's weights kept per block are
// finite: it grows m.blockBuf to the block's size, converts them
// (convertBlock) and scans every tensor. Errors wrap ErrBadWeights and
// name the file, the tensor and the element (checkFinite).
func (m *cpuModel) checkBlock(l *cpuLayer) error {
	n := l.blockFloats()
	if n == 0 {
		return nil
	}
	if len(m.blockBuf) < n {
		m.blockBuf = make([]float32, n)
	}
	m.convertBlock(l)
	defer m.releaseBlock(l)
	var err error
	l.blockLinears(func(w *linear) {
		off := 0
		for _, t := range w.parts {
			k := t.NumElements()
			if err == nil {
				err = checkFinite(t.File, t.Name, w.f[off:off+k])
			}
			off += k
		}
	})
	return err
}
