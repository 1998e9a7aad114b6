package prune

import (
	"errors"
	"testing"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/internal/field"
	"github.com/lmpack/lmpack/prune/depth"
)

// TestValidate: each bad value is refused by Validate with a *field.Error
// naming its Go field; the good options pass.
func TestValidate(t *testing.T) {
	base := Options{Model: "m", Out: "o", Calib: "c"}
	with := func(f func(*Options)) Options { o := base; f(&o); return o }
	for _, o := range []Options{
		with(func(o *Options) { o.Method, o.Layers = "lorp", 2 }),
		with(func(o *Options) { o.Method, o.LayerRatio = "shortgpt", 0.25 }),
		with(func(o *Options) { o.Method, o.Calib = "list:1,3", "" }),
		with(func(o *Options) { o.HeadGroups, o.HeadMethod, o.HeadStep, o.HeadRefit = 2, HeadProxy, 2, true }),
		with(func(o *Options) { o.FFNRatio, o.NoRefit = 0.25, true }),
		with(func(o *Options) { o.Sparsity = 0.3 }),
	} {
		if err := o.Validate(); err != nil {
			t.Errorf("%+v: %v", o, err)
		}
	}
	for _, c := range []struct {
		opt   Options
		field string
	}{
		{with(func(o *Options) { o.Model, o.Layers, o.Method = "", 1, "lorp" }), "Model"},
		{with(func(o *Options) { o.Out, o.Layers, o.Method = "", 1, "lorp" }), "Out"},
		{base, "Layers"}, // nothing to prune
		{with(func(o *Options) { o.Method = "lorp" }), "Method"},
		{with(func(o *Options) { o.Method, o.Layers = "magic", 1 }), "Method"},
		{with(func(o *Options) { o.Method, o.Layers, o.LayerRatio = "lorp", 1, 0.2 }), "Layers"},
		{with(func(o *Options) { o.Method, o.Layers = "lorp", -1 }), "Layers"},
		{with(func(o *Options) { o.Method, o.LayerRatio = "lorp", 1.5 }), "LayerRatio"},
		{with(func(o *Options) { o.Method, o.Layers, o.Calib = "lorp", 1, "" }), "Calib"},
		{with(func(o *Options) { o.Method = "list:1,x" }), "Method"},
		{with(func(o *Options) { o.Method = "list:1,1" }), "Method"},
		{with(func(o *Options) { o.Method, o.Layers = "list:1,2", 3 }), "Layers"},
		{with(func(o *Options) { o.Method, o.Layers, o.HeadGroups = "lorp", 1, 2 }), "HeadGroups"},
		{with(func(o *Options) { o.Method, o.FFNRatio = "lorp", 0.2 }), "Method"},
		{with(func(o *Options) { o.HeadGroups, o.Calib = 2, "" }), "Calib"},
		{with(func(o *Options) { o.HeadGroups = -1 }), "HeadGroups"},
		{with(func(o *Options) { o.HeadGroups, o.HeadRatio = 1, 0.1 }), "HeadGroups"},
		{with(func(o *Options) { o.HeadRatio = 1 }), "HeadRatio"},
		{with(func(o *Options) { o.FFNRatio = -0.1 }), "FFNRatio"},
		{with(func(o *Options) { o.Sparsity = 1 }), "Sparsity"},
		{with(func(o *Options) { o.Sparsity, o.FFNRatio = 0.2, 0.1 }), "Sparsity"},
		{with(func(o *Options) { o.HeadGroups, o.HeadMethod = 1, "magic" }), "HeadMethod"},
		{with(func(o *Options) { o.HeadGroups, o.HeadStep = 1, -1 }), "HeadStep"},
		{with(func(o *Options) { o.FFNRatio, o.HeadMethod = 0.2, HeadPutri }), "HeadMethod"},
		{with(func(o *Options) { o.FFNRatio, o.HeadStep = 0.2, 2 }), "HeadStep"},
		{with(func(o *Options) { o.FFNRatio, o.HeadRefit = 0.2, true }), "HeadRefit"},
		{with(func(o *Options) { o.HeadGroups, o.NoRefit = 1, true }), "NoRefit"},
	} {
		var fe *field.Error
		if err := c.opt.Validate(); !errors.As(err, &fe) || fe.Field != c.field {
			t.Errorf("%+v: Validate = %v, want a field error naming %s", c.opt, err, c.field)
		}
	}
}

// TestValidateModel: limits that depend on the model (5 layers of 4 KV
// heads, FFN 16 wide; one MoE model) are refused, naming the field; a
// list the model refuses keeps depth's sentinel.
func TestValidateModel(t *testing.T) {
	var d arch.Description
	for range 5 {
		d.Layers = append(d.Layers, arch.Layer{NumKVHeads: 4, MLP: &arch.MLP{IntermediateSize: 16}})
	}
	moe := &arch.Description{Layers: []arch.Layer{{NumKVHeads: 4, MoE: &arch.MoE{}}, {NumKVHeads: 4, MoE: &arch.MoE{}}}}
	for _, c := range []struct {
		opt   Options
		d     *arch.Description
		field string
		is    error
	}{
		{Options{Method: "lorp", Layers: 3}, &d, "", nil},
		{Options{Method: "lorp", Layers: 4}, &d, "Layers", nil},
		{Options{Method: "lorp", LayerRatio: 0.9}, &d, "LayerRatio", nil},
		{Options{Method: "list:0"}, &d, "Method", depth.ErrProtectedLayer},
		{Options{Method: "list:1,9"}, &d, "Method", depth.ErrLayerRange},
		{Options{Method: "list:1,2", LayerRatio: 0.2}, &d, "LayerRatio", nil},
		{Options{HeadGroups: 15}, &d, "", nil},
		{Options{HeadGroups: 16}, &d, "HeadGroups", ErrOptions},
		{Options{HeadRatio: 0.9}, &d, "HeadRatio", ErrOptions},
		{Options{FFNRatio: 0.01}, &d, "FFNRatio", nil},
		{Options{FFNRatio: 0.99}, &d, "FFNRatio", nil},
		{Options{FFNRatio: 0.5}, moe, "FFNRatio", nil},
		{Options{Method: "lorp", Layers: 1}, moe, "Layers", nil}, // 2 layers: none can go
	} {
		err := c.opt.ValidateModel(c.d)
		got := ""
		var fe *field.Error
		if errors.As(err, &fe) {
			got = fe.Field
		} else if err != nil {
			got = err.Error()
		}
		if got != c.field || (c.is != nil && !errors.Is(err, c.is)) {
			t.Errorf("%+v: ValidateModel = %v, want field %q (is %v)", c.opt, err, c.field, c.is)
		}
	}
}
