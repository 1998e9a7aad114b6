package eval

import (
	"errors"
	"testing"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/internal/field"
)

// TestPerplexityOptionsValidate: bad values are refused with a
// *field.Error naming the field.
func TestPerplexityOptionsValidate(t *testing.T) {
	d := &arch.Description{MaxPositionEmbeddings: 256}
	for _, c := range []struct {
		opt   PerplexityOptions
		model bool
		field string
	}{
		{PerplexityOptions{Ctx: 2}, false, ""},
		{PerplexityOptions{Ctx: 1}, false, "Ctx"},
		{PerplexityOptions{Ctx: 64, MaxWindows: -1}, false, "MaxWindows"},
		{PerplexityOptions{Ctx: 256}, true, ""},
		{PerplexityOptions{Ctx: 257}, true, "Ctx"},
	} {
		var err error
		if c.model {
			err = c.opt.ValidateModel(d)
		} else {
			err = c.opt.Validate()
		}
		got := ""
		var fe *field.Error
		if errors.As(err, &fe) {
			got = fe.Field
		} else if err != nil {
			got = err.Error()
		}
		if got != c.field {
			t.Errorf("%+v: %v, want field %q", c.opt, err, c.field)
		}
	}
}
