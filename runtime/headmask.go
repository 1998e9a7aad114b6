package runtime

import "fmt"

// KVGroupMasker is implemented by models that can silence whole GQA groups
// (one key/value head and the num_heads/num_key_value_heads query heads
// that read it): the masked groups' attention output, the o_proj input
// columns [h*head_dim, (h+1)*head_dim) of each of their query heads h, is
// set to zero before o_proj. With o_proj bias-free, the block then computes
// exactly what the model with those groups sliced away computes, which is
// what Putri's masked-perplexity head score measures (docs/METHODS.md §6;
// arXiv 2605.18331) and what the prune tests compare against.
//
// The CPU model implements it; the check costs one nil test per layer and
// Forward call when no mask is set.
type KVGroupMasker interface {
	// MaskKVGroups sets layer's mask: masked[g] true silences group g.
	// masked must have num_key_value_heads entries; nil (or all false)
	// removes the layer's mask. Errors: layer out of range, wrong length.
	MaskKVGroups(layer int, masked []bool) error
}

// AttnOutputObserver sees each layer's attention output at the o_proj
// input, after any KVGroupMasker mask: att is [n, num_heads*head_dim]
// float32 row-major, query head h in columns [h*head_dim, (h+1)*head_dim).
// Install it with Model.SetObserver like the other observers. Unlike the
// other hooks it may also write att: o_proj reads att after the call, so
// an observer can substitute a layer's attention output (quantize/oscar's
// clip search runs a layer's served, quantized attention this way).
type AttnOutputObserver interface {
	AttnOutput(layer, pos, n int, att []float32)
}

var _ KVGroupMasker = (*cpuModel)(nil)

// MaskKVGroups implements KVGroupMasker.
func (m *cpuModel) MaskKVGroups(layer int, masked []bool) error {
	if layer < 0 || layer >= len(m.layers) {
		return fmt.Errorf("runtime: MaskKVGroups: layer %d outside [0, %d)", layer, len(m.layers))
	}
	l := &m.layers[layer]
	if masked != nil && len(masked) != l.nkv {
		return fmt.Errorf("runtime: MaskKVGroups: layer %d: mask has %d entries, want num_key_value_heads %d", layer, len(masked), l.nkv)
	}
	set := false
	for _, b := range masked {
		set = set || b
	}
	if !set {
		if m.groupMask != nil {
			m.groupMask[layer] = nil
			empty := true
			for _, g := range m.groupMask {
				empty = empty && g == nil
			}
			if empty {
				m.groupMask = nil
			}
		}
		return nil
	}
	if m.groupMask == nil {
		m.groupMask = make([][]bool, len(m.layers))
	}
	m.groupMask[layer] = append([]bool(nil), masked...)
	return nil
}

// attnOutputHook applies layer li's group mask to s.att ([T, qdim]) and
// calls the AttnOutputObserver. Forward calls it only when a mask or the
// observer is set.
func (m *cpuModel) attnOutputHook(li int, l *cpuLayer, pos, T int) {
	att := m.s.att[:T*l.qdim]
	if m.groupMask != nil {
		if mask := m.groupMask[li]; mask != nil {
			g := l.nh / l.nkv
			for kv, off := range mask {
				if !off {
					continue
				}
				lo, hi := kv*g*l.hd, (kv+1)*g*l.hd
				for i := 0; i < T; i++ {
					clear(att[i*l.qdim+lo : i*l.qdim+hi])
				}
			}
		}
	}
	if m.obsAttnOut != nil {
		m.obsAttnOut.AttnOutput(li, pos, T, att)
	}
}
