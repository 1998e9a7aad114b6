package gemq

import (
	"context"
	"fmt"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/runtime"
)

// LayerInput is what one MoE layer saw during calibration, float32
// row-major, N tokens in window order.
type LayerInput struct {
	// Layer is the decoder layer index.
	Layer int
	// Hidden is H, NumExperts E, TopK K.
	Hidden, NumExperts, TopK int
	// NormTopK tells whether the top-k routing weights are renormalised to
	// sum 1 (arch.MoE.NormTopKProb).
	NormTopK bool
	// N is the number of tokens.
	N int
	// X is the MoE block input (after post_attention_layernorm), [N, H].
	X []float32
	// Logits are the router logits, [N, E].
	Logits []float32
	// Selected are the chosen experts, best first, [N, K].
	Selected []int32
}

// Bytes returns the memory of one layer's capture for n tokens: 4·n·(H +
// E + K) bytes.
func inputBytes(n, H, E, K int) int64 { return 4 * int64(n) * int64(H+E+K) }

// Capture runs m over the windows (each from position 0 in a fresh cache)
// and returns the LayerInput of each requested decoder layer, in the order
// of layers. Memory: 4·N·(H+E+K) bytes per layer for N tokens. Errors: an
// empty window list or window, a layer out of range or not MoE (naming
// it), Forward errors, and a token count mismatch.
func Capture(ctx context.Context, m runtime.Model, windows [][]int, layers []int) ([]LayerInput, error) {
	d := m.Description()
	c := &capturer{byL: map[int]*LayerInput{}}
	out := make([]LayerInput, len(layers))
	T, longest := 0, 0
	for i, w := range windows {
		if len(w) == 0 {
			return nil, fmt.Errorf("gemq: window %d is empty", i)
		}
		T += len(w)
		longest = max(longest, len(w))
	}
	if T == 0 {
		return nil, fmt.Errorf("gemq: no calibration windows")
	}
	for i, l := range layers {
		if l < 0 || l >= len(d.Layers) || d.Layers[l].MoE == nil {
			return nil, fmt.Errorf("gemq: layer %d is not an MoE layer of the model (%d layers)", l, len(d.Layers))
		}
		mo := d.Layers[l].MoE
		out[i] = LayerInput{Layer: l, Hidden: d.HiddenSize, NumExperts: mo.NumExperts, TopK: mo.TopK, NormTopK: mo.NormTopKProb,
			X: make([]float32, 0, T*d.HiddenSize), Logits: make([]float32, 0, T*mo.NumExperts), Selected: make([]int32, 0, T*mo.TopK)}
		c.byL[l] = &out[i]
	}
	defer m.SetObserver(nil)
	m.SetObserver(c)
	cache := m.NewCache(longest)
	logits := make([]float32, d.VocabSize)
	for _, w := range windows {
		cache.Truncate(0)
		if err := m.Forward(ctx, w, cache, logits, false); err != nil {
			return nil, fmt.Errorf("gemq: capture: %w", err)
		}
	}
	for i := range out {
		in := &out[i]
		in.N = len(in.Selected) / max(in.TopK, 1)
		if in.N != T || len(in.X) != T*in.Hidden || len(in.Logits) != T*in.NumExperts {
			return nil, fmt.Errorf("gemq: layer %d: captured %d tokens, want %d", in.Layer, in.N, T)
		}
	}
	return out, nil
}

// capturer is the FFNObserver + RouterObserver behind Capture.
type capturer struct{ byL map[int]*LayerInput }

// FFNInput implements runtime.FFNObserver.
func (c *capturer) FFNInput(layer, pos, n int, x, h []float32) {
	if in, ok := c.byL[layer]; ok {
		in.X = append(in.X, x[:n*in.Hidden]...)
	}
}

// RouterLogits implements runtime.RouterObserver.
func (c *capturer) RouterLogits(layer, pos, n int, logits []float32, sel []int32) {
	if in, ok := c.byL[layer]; ok {
		in.Logits = append(in.Logits, logits[:n*in.NumExperts]...)
		in.Selected = append(in.Selected, sel[:n*in.TopK]...)
	}
}

// Expert is one expert's SwiGLU weights, float32 row-major:
// E(x) = Down · (silu(Gate·x) ⊙ (Up·x)).
type Expert struct {
	// Inter is the intermediate size I.
	Inter int
	// Gate and Up are [I, H]; Down is [H, I].
	Gate, Up, Down []float32
}

// Params returns the number of weights of the expert, 3·H·I.
func (e *Expert) Params() int64 { return int64(len(e.Gate) + len(e.Up) + len(e.Down)) }

// LoadExperts reads the experts of MoE layer layer of d from src (e.g. a
// *safetensors.Checkpoint). Errors:
// a layer that is not MoE, a tensor missing, of the wrong shape or not
// convertible to float32 (naming it).
func LoadExperts(src runtime.TensorSource, d *arch.Description, layer int) ([]Expert, error) {
	if layer < 0 || layer >= len(d.Layers) || d.Layers[layer].MoE == nil {
		return nil, fmt.Errorf("gemq: layer %d is not an MoE layer of the model", layer)
	}
	H := d.HiddenSize
	var out []Expert
	for _, m := range d.Layers[layer].MoE.Experts {
		I := m.IntermediateSize
		x := Expert{Inter: I}
		for _, t := range []struct {
			name       string
			rows, cols int
			dst        *[]float32
		}{{m.Gate, I, H, &x.Gate}, {m.Up, I, H, &x.Up}, {m.Down, H, I, &x.Down}} {
			tt, err := src.Tensor(t.name)
			if err != nil {
				return nil, fmt.Errorf("gemq: %w", err)
			}
			if len(tt.Shape) != 2 || tt.Shape[0] != t.rows || tt.Shape[1] != t.cols {
				return nil, fmt.Errorf("gemq: tensor %q: shape %v, want [%d %d]", t.name, tt.Shape, t.rows, t.cols)
			}
			if *t.dst, err = tt.Float32(); err != nil {
				return nil, fmt.Errorf("gemq: tensor %q: %w", t.name, err)
			}
		}
		out = append(out, x)
	}
	return out, nil
}
