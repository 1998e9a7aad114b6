package kveval

import (
	"errors"
	"testing"

	"github.com/lmpack/lmpack/internal/field"
)

// TestValidate: each bad value is refused by Validate with a *field.Error
// naming its Go field.
func TestValidate(t *testing.T) {
	ok := Options{Ctx: 128, Chunk: 1, Methods: []string{"fp16", "kivi2"}}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	// Windows covering the context are allowed (rows marked "nothing
	// quantised"), as are a prompt of Ctx−2 tokens and fake-quant.
	for _, mod := range []func(*Options){
		func(o *Options) { o.Windows, o.Sink, o.Recent = true, 64, 64 },
		func(o *Options) { o.Prompt, o.Chunk = 126, 4 },
		func(o *Options) { o.Protocol = "fake-quant" },
		func(o *Options) { o.Protocol, o.Ctx = "fake-quant", 2 },
	} {
		o := ok
		mod(&o)
		if err := o.Validate(); err != nil {
			t.Errorf("%+v: %v", o, err)
		}
	}
	for _, c := range []struct {
		mod   func(*Options)
		field string
	}{
		{func(o *Options) { o.Ctx = 1 }, "Ctx"},
		{func(o *Options) { o.Ctx = 2 }, "Ctx"}, // decode: position 0 alone is scored, it reads nothing cached
		{func(o *Options) { o.MaxWindows = -1 }, "MaxWindows"},
		{func(o *Options) { o.Methods = nil }, "Methods"},
		{func(o *Options) { o.Methods = []string{"int9"} }, "Methods"},
		{func(o *Options) { o.Methods = []string{"fp16", "fp16"} }, "Methods"},
		{func(o *Options) { o.Methods = []string{"oscar2"} }, "Rotations"},
		{func(o *Options) { o.Methods = []string{"kivi2", "oscar2-g32"} }, "Rotations"},
		{func(o *Options) { o.Rotations = "r.safetensors" }, "Rotations"},
		{func(o *Options) { o.Windows, o.Sink = true, -1 }, "Sink"},
		{func(o *Options) { o.Recent = 8 }, "Sink"},
		{func(o *Options) { o.Protocol = "decoded" }, "Protocol"},
		{func(o *Options) { o.Prompt = -1 }, "Prompt"},
		{func(o *Options) { o.Prompt = 127 }, "Prompt"},
		{func(o *Options) { o.Chunk = 0 }, "Chunk"},
		{func(o *Options) { o.Protocol, o.Prompt = "fake-quant", 8 }, "Prompt"},
		{func(o *Options) { o.Protocol, o.Chunk = "fake-quant", 4 }, "Chunk"},
		{func(o *Options) { o.Protocol, o.Windows, o.Recent = "fake-quant", true, 8 }, "Windows"},
		{func(o *Options) { o.ServingCtx = -1 }, "ServingCtx"},
	} {
		o := ok
		c.mod(&o)
		var fe *field.Error
		if err := o.Validate(); !errors.As(err, &fe) || fe.Field != c.field {
			t.Errorf("%+v: Validate = %v, want a field error naming %s", o, err, c.field)
		}
	}
}
