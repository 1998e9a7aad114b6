package calibrate

import (
	"errors"
	"testing"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/internal/field"
)

// TestValidate: each bad value is refused by Validate with a *field.Error
// naming its Go field; good options pass.
func TestValidate(t *testing.T) {
	ok := Options{Model: "m", Data: "d.txt", Out: "c.safetensors", Tokens: 64, Ctx: 32}
	for _, o := range []Options{ok, {Data: "d.txt", Out: "c", Tokens: 8}} { // Ctx 0: the model's default
		if err := o.Validate(); err != nil {
			t.Fatalf("valid options %+v: %v", o, err)
		}
	}
	for _, c := range []struct {
		mod   func(*Options)
		field string
	}{
		{func(o *Options) { o.Data = "" }, "Data"},
		{func(o *Options) { o.Out = "" }, "Out"},
		{func(o *Options) { o.Tokens = 0 }, "Tokens"},
		{func(o *Options) { o.Tokens = MaxTokens + 1 }, "Tokens"},
		{func(o *Options) { o.Ctx = 1 }, "Ctx"},
		{func(o *Options) { o.Tokens = 16 }, "Tokens"}, // less than one window of 32
		{func(o *Options) { o.MaxExpertBytes = -1 }, "MaxExpertBytes"},
		{func(o *Options) { o.MinExpertTokens = -1 }, "MinExpertTokens"},
	} {
		o := ok
		c.mod(&o)
		var fe *field.Error
		if err := o.Validate(); !errors.As(err, &fe) || fe.Field != c.field {
			t.Errorf("%+v: Validate = %v, want a field error naming %s", o, err, c.field)
		}
	}
}

// TestValidateModel: Ctx above max_position_embeddings and AllExperts on a
// dense model are refused, naming the field; a model without
// max_position_embeddings takes any Ctx.
func TestValidateModel(t *testing.T) {
	dense := &arch.Description{MaxPositionEmbeddings: 64, Layers: []arch.Layer{{MLP: &arch.MLP{}}}}
	moe := &arch.Description{MaxPositionEmbeddings: 64, Layers: []arch.Layer{{MoE: &arch.MoE{}}}}
	for _, c := range []struct {
		opt   Options
		d     *arch.Description
		field string
	}{
		{Options{Ctx: 64, Tokens: 64}, dense, ""},
		{Options{Ctx: 65, Tokens: 65}, dense, "Ctx"},
		{Options{Ctx: 4096, Tokens: 4096}, &arch.Description{}, ""},
		{Options{Ctx: 32, Tokens: 32, AllExperts: true}, dense, "AllExperts"},
		{Options{Ctx: 32, Tokens: 32, AllExperts: true}, moe, ""},
		// Ctx 0 is min(512, max_position_embeddings): 64 here.
		{Options{Tokens: 64}, dense, ""},
		{Options{Tokens: 63}, dense, "Tokens"},
	} {
		err := c.opt.ValidateModel(c.d)
		got := ""
		var fe *field.Error
		if errors.As(err, &fe) {
			got = fe.Field
		} else if err != nil {
			got = "non-field error " + err.Error()
		}
		if got != c.field {
			t.Errorf("%+v: ValidateModel = %v, want field %q", c.opt, err, c.field)
		}
	}
}
