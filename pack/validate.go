package pack

import (
	"slices"
	"strconv"
	"strings"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/internal/field"
	"github.com/lmpack/lmpack/runtime/kvcache"
)

// Validate checks opt's KV scheme without opening anything: KVSink and
// KVRecent >= 0 and only with a KV cache (KVCache, or KVRotations, which
// implies oscar2); KVCache one of kvcache.Methods; KVRotations given
// exactly when the cache takes rotations (kvcache.NeedsRotations: oscar2,
// oscar4, oscar-mixed). Model-dependent
// limits are ValidateModel's.
//
// Errors: a *field.Error naming the Go field (cmd/lmpack and compress
// rename it to their flag or recipe key).
func (opt *FromOptions) Validate() error {
	cache := opt.KVCache
	if cache == "" && opt.KVRotations != "" {
		cache = "oscar2"
	}
	switch {
	case opt.KVSink < 0:
		return field.New("KVSink", opt.KVSink, ">= 0 tokens")
	case opt.KVRecent < 0:
		return field.New("KVRecent", opt.KVRecent, ">= 0 tokens")
	case cache == "" && (opt.KVSink != 0 || opt.KVRecent != 0):
		return field.New("KVSink", nil, "{KVCache} (fp16 windows belong to a quantized KV cache)")
	case cache == "":
		return nil
	case !slices.Contains(kvcache.Methods(), cache):
		return field.New("KVCache", cache, "a known method: "+strings.Join(kvcache.Methods(), ", "))
	}
	takesRot := kvcache.NeedsRotations(cache)
	switch {
	case takesRot && opt.KVRotations == "":
		return field.New("KVCache", cache, "{KVRotations}: it needs a rotation file (lmpack quantize kv)")
	case !takesRot && opt.KVRotations != "":
		return field.New("KVRotations", opt.KVRotations, "none with {KVCache} "+cache+" (it does not use rotations)")
	}
	return nil
}

// ValidateModel checks the KV windows against the model d's context
// (when the config gives max_position_embeddings mp; CheckKVWindows):
// KVSink at most mp, KVRecent at most mp, and KVSink + KVRecent at most mp.
//
// Errors: a *field.Error naming the window that does not fit: KVSink when
// it alone exceeds mp, else KVRecent (alone, or with the sink: then the
// error says KVRecent's room, mp − KVSink).
func (opt *FromOptions) ValidateModel(d *arch.Description) error {
	mp := d.MaxPositionEmbeddings
	ctx := "the model's max_position_embeddings " + strconv.Itoa(mp)
	switch {
	case mp <= 0:
	case opt.KVSink > mp:
		return field.New("KVSink", opt.KVSink, "at most "+ctx+" tokens (the fp16 sink window must fit the context)")
	case opt.KVRecent > mp:
		return field.New("KVRecent", opt.KVRecent, "at most "+ctx+" tokens (the fp16 recent window must fit the context)")
	case opt.KVSink+opt.KVRecent > mp:
		return field.New("KVRecent", opt.KVRecent, "at most "+strconv.Itoa(mp-opt.KVSink)+" tokens: "+ctx+" less {KVSink} "+strconv.Itoa(opt.KVSink)+" (the two fp16 windows must fit the context together)")
	}
	return nil
}
