package oscar

import (
	"errors"
	"math"
	"testing"

	"github.com/lmpack/lmpack/internal/field"
)

// TestValidate: each bad value is refused by Validate with a *field.Error
// naming its Go field.
func TestValidate(t *testing.T) {
	ok := KVOptions{Model: "m", Calib: "c", Out: "o", ClipK: DefaultClipK, ClipV: DefaultClipV}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		mod   func(*KVOptions)
		field string
	}{
		{func(o *KVOptions) { o.Method = "quarot" }, "Method"},
		{func(o *KVOptions) { o.ClipK = 0 }, "ClipK"},
		{func(o *KVOptions) { o.ClipK = math.NaN() }, "ClipK"},
		{func(o *KVOptions) { o.ClipV = 1.5 }, "ClipV"},
		{func(o *KVOptions) { o.ClipK4 = -0.1 }, "ClipK4"},
		{func(o *KVOptions) { o.ClipV8 = 1.01 }, "ClipV8"},
		{func(o *KVOptions) { o.KVBits = 1.5 }, "KVBits"},
		{func(o *KVOptions) { o.KVBits = math.NaN() }, "KVBits"},
		{func(o *KVOptions) { o.ServingCtx = -1 }, "ServingCtx"},
		{func(o *KVOptions) { o.Sink, o.Recent, o.ServingCtx = 16, 64, 80 }, "ServingCtx"},
		{func(o *KVOptions) { o.Recent = -2 }, "Recent"},
		{func(o *KVOptions) { o.SearchTokens = -1 }, "SearchTokens"},
		{func(o *KVOptions) { o.Calib = "" }, "Calib"},
		{func(o *KVOptions) { o.Out = "" }, "Out"},
	} {
		o := ok
		c.mod(&o)
		var fe *field.Error
		if err := o.Validate(); !errors.As(err, &fe) || fe.Field != c.field {
			t.Errorf("%+v: Validate = %v, want a field error naming %s", o, err, c.field)
		}
	}
}
