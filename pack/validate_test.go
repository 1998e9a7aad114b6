package pack

import (
	"errors"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/internal/field"
)

// TestFromOptionsValidate: each bad KV scheme is refused by Validate or
// ValidateModel with a *field.Error naming its Go field, and for the
// windows that do not fit the context, saying what fits.
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
		want  string // in the error, when given
	}{
		{FromOptions{KVCache: "kivi2", KVSink: -1}, false, "KVSink", ""},
		{FromOptions{KVCache: "kivi2", KVRecent: -1}, false, "KVRecent", ""},
		{FromOptions{KVSink: 4, KVRecent: 64}, false, "KVSink", ""},
		{FromOptions{KVCache: "oscar7"}, false, "KVCache", ""},
		{FromOptions{KVCache: "oscar2"}, false, "KVCache", ""},
		{FromOptions{KVCache: "kivi2", KVRotations: "r"}, false, "KVRotations", ""},
		{FromOptions{KVCache: "kivi2", KVSink: 8, KVRecent: 600}, true, "KVRecent",
			"KVRecent 600: want at most the model's max_position_embeddings 512 tokens (the fp16 recent window must fit the context)"},
		{FromOptions{KVCache: "kivi2", KVSink: 600, KVRecent: 8}, true, "KVSink",
			"KVSink 600: want at most the model's max_position_embeddings 512 tokens (the fp16 sink window must fit the context)"},
		{FromOptions{KVCache: "kivi2", KVSink: 99999999999999, KVRecent: 1}, true, "KVSink", "KVSink 99999999999999: want at most"},
		{FromOptions{KVCache: "kivi2", KVSink: 600, KVRecent: 600}, true, "KVSink", "KVSink 600: want at most"},
		{FromOptions{KVCache: "kivi2", KVSink: 500, KVRecent: 13}, true, "KVRecent",
			"KVRecent 13: want at most 12 tokens: the model's max_position_embeddings 512 less KVSink 500 (the two fp16 windows must fit the context together)"},
		{FromOptions{KVCache: "kivi2", KVSink: 8, KVRecent: 504}, true, "", ""},
		{FromOptions{KVCache: "kivi2", KVSink: 512}, true, "", ""},
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
		if c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%+v: %v, want %q", c.opt, err, c.want)
		}
	}
}
