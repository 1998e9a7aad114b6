package kveval

import (
	"errors"
	"testing"

	"github.com/lmpack/lmpack/internal/field"
)

// TestValidate: each bad value is refused by Validate with a *field.Error
// naming its Go field.
func TestValidate(t *testing.T) {
	ok := Options{Ctx: 128, Methods: []string{"fp16", "kivi2"}}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		mod   func(*Options)
		field string
	}{
		{func(o *Options) { o.Ctx = 1 }, "Ctx"},
		{func(o *Options) { o.MaxWindows = -1 }, "MaxWindows"},
		{func(o *Options) { o.Methods = nil }, "Methods"},
		{func(o *Options) { o.Methods = []string{"int9"} }, "Methods"},
		{func(o *Options) { o.Methods = []string{"fp16", "fp16"} }, "Methods"},
		{func(o *Options) { o.Methods = []string{"oscar2"} }, "Rotations"},
		{func(o *Options) { o.Rotations = "r.safetensors" }, "Rotations"},
		{func(o *Options) { o.Windows, o.Sink = true, -1 }, "Sink"},
		{func(o *Options) { o.Recent = 8 }, "Sink"},
		{func(o *Options) { o.Windows, o.Sink, o.Recent = true, 64, 64 }, "Sink"},
	} {
		o := ok
		c.mod(&o)
		var fe *field.Error
		if err := o.Validate(); !errors.As(err, &fe) || fe.Field != c.field {
			t.Errorf("%+v: Validate = %v, want a field error naming %s", o, err, c.field)
		}
	}
}
