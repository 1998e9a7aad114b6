package prune

import (
	"fmt"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
)

// workState is a checkpoint being width-pruned in memory: a copy of the
// description with the current per-layer sizes, and the float32 values of
// every tensor changed so far (row-major, with their new shapes). It is a
// runtime.TensorSource, so the partly pruned model can be loaded and run.
type workState struct {
	desc    *arch.Description
	ck      *safetensors.Checkpoint
	changed map[string]*safetensors.Tensor
}

func newWorkState(d *arch.Description, ck *safetensors.Checkpoint) *workState {
	nd := *d
	nd.Layers = make([]arch.Layer, len(d.Layers))
	for i, l := range d.Layers {
		nd.Layers[i] = l
		if l.MLP != nil {
			m := *l.MLP
			nd.Layers[i].MLP = &m
		}
	}
	return &workState{desc: &nd, ck: ck, changed: map[string]*safetensors.Tensor{}}
}

// Tensor implements runtime.TensorSource.
func (w *workState) Tensor(name string) (*safetensors.Tensor, error) {
	if t, ok := w.changed[name]; ok {
		return t, nil
	}
	return w.ck.Tensor(name)
}

// f32 returns tensor name as float32 with its shape. Errors: the tensor is
// missing or not a float dtype.
func (w *workState) f32(name string) ([]float32, []int, error) {
	t, err := w.Tensor(name)
	if err != nil {
		return nil, nil, fmt.Errorf("prune: %w", err)
	}
	v, err := t.Float32()
	if err != nil {
		return nil, nil, fmt.Errorf("prune: tensor %q: %w", name, err)
	}
	return v, t.Shape, nil
}

// set replaces tensor name by v with shape.
func (w *workState) set(name string, shape []int, v []float32) {
	w.changed[name] = &safetensors.Tensor{Name: name, File: "(pruned in memory)", DType: safetensors.F32, Shape: shape, Data: safetensors.F32Bytes(v)}
}
