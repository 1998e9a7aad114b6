package oscar

import (
	"errors"
	"math"
	"strings"
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

// TestValidateWindowsServingCtx: fp16 windows that do not fit the
// serving context of KVBits are blamed on ServingCtx only when it was
// given, else on the window that does not fit the default (Sink when it
// alone reaches it, else Recent), and the error says what fits; without
// KVBits the default context does not bound the windows.
func TestValidateWindowsServingCtx(t *testing.T) {
	ok := KVOptions{Model: "m", Calib: "c", Out: "o", ClipK: DefaultClipK, ClipV: DefaultClipV}
	for _, c := range []struct {
		kvBits                   float64
		servingCtx, sink, recent int
		field, want              string // field "": no error
	}{
		{3, 80, 16, 64, "ServingCtx", "ServingCtx 80: want a context above the fp16 windows' Sink 16 + Recent 64 = 80 tokens (the context at which KVBits counts bits per element)"},
		{0, 80, 16, 64, "ServingCtx", "ServingCtx 80: want a context above"},
		{3, 0, 16, 40000, "Recent", "Recent 40000: want a window below 32752 tokens: the default serving context 32768 (no ServingCtx), at which KVBits counts bits per element, less Sink 16 (or give a longer ServingCtx)"},
		{3, 0, 16, 32752, "Recent", "Recent 32752: want a window below 32752 tokens"},
		{3, 0, 40000, 64, "Sink", "Sink 40000: want a window below the default serving context 32768 (no ServingCtx), at which KVBits counts bits per element (or give a longer ServingCtx)"},
		{3, 0, 32768, 0, "Sink", "Sink 32768: want a window below"},
		{3, 0, 16, 32751, "", ""},
		{3, 65536, 16, 40000, "", ""},
		{0, 0, 16, 40000, "", ""}, // no KVBits: no serving context
	} {
		o := ok
		o.KVBits, o.ServingCtx, o.Sink, o.Recent = c.kvBits, c.servingCtx, c.sink, c.recent
		err := o.Validate()
		var fe *field.Error
		switch {
		case c.field == "" && err != nil:
			t.Errorf("kv_bits %g, serving ctx %d, windows %d,%d: %v, want no error", c.kvBits, c.servingCtx, c.sink, c.recent, err)
		case c.field != "" && (!errors.As(err, &fe) || fe.Field != c.field || !strings.Contains(err.Error(), c.want)):
			t.Errorf("kv_bits %g, serving ctx %d, windows %d,%d: %v, want a field error naming %s with %q", c.kvBits, c.servingCtx, c.sink, c.recent, err, c.field, c.want)
		}
	}
}
