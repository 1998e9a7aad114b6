package pack

import (
	"errors"
	"testing"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/internal/field"
)

// TestFromOptionsValidate: each bad KV scheme is refused by Validate or
// ValidateModel with a *field.Error naming its Go field.
func TestFromOptionsValidate(t *testing.T) {
	for _, o := range []FromOptions{{}, {KVCache: "kivi2", KVSink: 4, KVRecent: 64}, {KVRotations: "r"}, {KVCache: "oscar4", KVRotations: "r"}} {
		if err := o.Validate(); err != nil {
			t.Errorf("%+v: %v", o, err)
		}
	}
	d := &arch.Description{MaxPositionEmbeddings: 512}
	for _, c := range []struct {
		opt   FromOptions
		model bool
		field string
	}{
		{FromOptions{KVCache: "kivi2", KVSink: -1}, false, "KVSink"},
		{FromOptions{KVCache: "kivi2", KVRecent: -1}, false, "KVRecent"},
		{FromOptions{KVSink: 4, KVRecent: 64}, false, "KVSink"},
		{FromOptions{KVCache: "oscar7"}, false, "KVCache"},
		{FromOptions{KVCache: "oscar2"}, false, "KVCache"},
		{FromOptions{KVCache: "kivi2", KVRotations: "r"}, false, "KVRotations"},
		{FromOptions{KVCache: "kivi2", KVSink: 8, KVRecent: 600}, true, "KVRecent"},
		{FromOptions{KVCache: "kivi2", KVSink: 8, KVRecent: 504}, true, ""},
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
