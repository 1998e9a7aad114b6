package wquant

import (
	"errors"
	"math"
	"testing"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/internal/field"
	"github.com/lmpack/lmpack/quantize/gemq"
)

// TestValidate: each bad value is refused by Validate with a *field.Error
// naming its Go field; the good options pass.
func TestValidate(t *testing.T) {
	ok := Options{Model: "m", Calib: "c", Out: "o", Method: MethodGPTQ, Bits: 4, GroupSize: 128}
	moe := ok
	moe.MoEBudget = 2.5
	for _, o := range []Options{ok, moe, {Model: "m", Calib: "c", Out: "o", Method: MethodRTN, TargetBPW: 3}} {
		if err := o.Validate(); err != nil {
			t.Fatalf("%+v: %v", o, err)
		}
	}
	for _, c := range []struct {
		base  Options
		mod   func(*Options)
		field string
	}{
		{ok, func(o *Options) { o.Model = "" }, "Model"},
		{ok, func(o *Options) { o.Calib = "" }, "Calib"},
		{ok, func(o *Options) { o.Out = "" }, "Out"},
		{ok, func(o *Options) { o.Method = "awq" }, "Method"},
		{ok, func(o *Options) { o.Method, o.ActOrder = MethodRTN, true }, "ActOrder"},
		{ok, func(o *Options) { o.Method, o.TrueSequential = MethodRTN, true }, "TrueSequential"},
		{ok, func(o *Options) { o.Bits = 5 }, "Bits"},
		{ok, func(o *Options) { o.Bits = 0 }, "Bits"},
		{ok, func(o *Options) { o.TargetBPW = 3 }, "Bits"},
		{ok, func(o *Options) { o.Bits, o.GroupSize, o.TargetBPW = 0, 0, 33 }, "TargetBPW"},
		{ok, func(o *Options) { o.Bits, o.GroupSize, o.TargetBPW = 0, 0, -1 }, "TargetBPW"},
		{ok, func(o *Options) { o.Bits, o.TargetBPW = 0, 3 }, "GroupSize"},
		{ok, func(o *Options) { o.GroupSize = 48 }, "GroupSize"},
		{ok, func(o *Options) { o.MoEBudget = -1 }, "MoEBudget"},
		{ok, func(o *Options) { o.MoEBudget = math.NaN() }, "MoEBudget"},
		{ok, func(o *Options) { o.MoEWeighting = gemq.WeightSoft }, "MoEWeighting"},
		{ok, func(o *Options) { o.MoERule = true }, "MoERule"},
		{ok, func(o *Options) { o.MoESolver = gemq.SolverLagrangian }, "MoESolver"},
		{ok, func(o *Options) { o.MoEGroup = 32 }, "MoEGroup"},
		{ok, func(o *Options) { o.MoEMinTokens = 4 }, "MoEMinTokens"},
		{moe, func(o *Options) { o.MoEGroup = 48 }, "MoEGroup"},
		{moe, func(o *Options) { o.MoEWeighting = "grad" }, "MoEWeighting"},
		{moe, func(o *Options) { o.MoESolver = "ilp" }, "MoESolver"},
		{moe, func(o *Options) { o.MoEMinTokens = -1 }, "MoEMinTokens"},
		{ok, func(o *Options) { o.Damp = -0.1 }, "Damp"},
		{ok, func(o *Options) { o.MeasureTokens = -1 }, "MeasureTokens"},
		{ok, func(o *Options) { o.Choices = []Choice{{5, 32}} }, "Choices"},
	} {
		o := c.base
		c.mod(&o)
		var fe *field.Error
		if err := o.Validate(); !errors.As(err, &fe) || fe.Field != c.field {
			t.Errorf("%+v: Validate = %v, want a field error naming %s", o, err, c.field)
		}
	}
}

// TestValidateModel: MoEBudget on a dense model and TargetBPW on an MoE
// model are refused, naming the field.
func TestValidateModel(t *testing.T) {
	dense := &arch.Description{Layers: []arch.Layer{{MLP: &arch.MLP{}}}}
	moe := &arch.Description{Layers: []arch.Layer{{MoE: &arch.MoE{}}}}
	for _, c := range []struct {
		opt   Options
		d     *arch.Description
		field string
	}{
		{Options{Bits: 4}, dense, ""},
		{Options{Bits: 4, MoEBudget: 2}, dense, "MoEBudget"},
		{Options{Bits: 4, MoEBudget: 2}, moe, ""},
		{Options{TargetBPW: 3}, moe, "TargetBPW"},
		{Options{TargetBPW: 3}, dense, ""},
	} {
		got := ""
		var fe *field.Error
		err := c.opt.ValidateModel(c.d)
		if errors.As(err, &fe) {
			got = fe.Field
		} else if err != nil {
			got = err.Error()
		}
		if got != c.field {
			t.Errorf("%+v: ValidateModel = %v, want field %q", c.opt, err, c.field)
		}
	}
}
