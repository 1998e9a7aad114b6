package compress

import (
	"context"
	"github.com/lmpack/lmpack/runtime/kvcache"
	"path/filepath"

	"github.com/lmpack/lmpack/calibrate"
	"github.com/lmpack/lmpack/pack"
	"github.com/lmpack/lmpack/quantize/oscar"
)

// kvKeys names oscar.KVOptions' fields as recipe keys (field.Rename of
// its Validate errors).
var kvKeys = map[string]string{
	"ClipK": "quantize.kv.clip_k", "ClipV": "quantize.kv.clip_v",
	"ClipK4": "quantize.kv.clip_k4", "ClipV4": "quantize.kv.clip_v4", "ClipK8": "quantize.kv.clip_k8", "ClipV8": "quantize.kv.clip_v8",
	"ClipSearch": "quantize.kv.clip_search", "KVBits": "quantize.kv.kv_bits", "ServingCtx": "quantize.kv.serving_ctx",
	"SearchTokens": "quantize.kv.search_tokens", "Sink": "quantize.kv.sink", "Recent": "quantize.kv.recent",
}

// packKeys names pack.FromOptions' KV fields as recipe keys (field.Rename
// of its Validate errors).
var packKeys = map[string]string{"KVCache": "quantize.kv.cache", "KVSink": "quantize.kv.sink", "KVRecent": "quantize.kv.recent", "KVRotations": "quantize.kv.cache"}

// packOptions is the KV part of the pack stage's pack.FromOptions: the
// section's cache and windows, with the rotation file rot when the cache
// takes rotations.
func (kv *KVStage) packOptions(rot string) *pack.FromOptions {
	o := &pack.FromOptions{KVCache: kv.Cache, KVSink: kv.Sink, KVRecent: kv.Recent}
	if rotates(kv.Cache) {
		o.KVRotations = rot
	}
	return o
}

// options is the oscar.KVOptions of the section (Model, Calib, Out and
// Version are the pipeline's).
func (kv *KVStage) options() oscar.KVOptions {
	return oscar.KVOptions{
		Method: oscar.Method, ClipK: kv.ClipK, ClipV: kv.ClipV,
		ClipK4: kv.ClipK4, ClipV4: kv.ClipV4, ClipK8: kv.ClipK8, ClipV8: kv.ClipV8,
		ClipSearch: kv.ClipSearch, KVBits: kv.KVBits, ServingCtx: kv.ServingCtx, SearchTokens: kv.SearchTokens,
		Sink: kv.Sink, Recent: kv.Recent,
	}
}

// quantizeKVStage is the quantize-kv stage: its cache key is the
// quantize.kv section.
func (p *pipeline) quantizeKVStage() stage {
	return stage{name: "quantize-kv", params: section(p.r.Quantize.KV), run: p.quantizeKV}
}

// rotates reports whether a kvcache method takes OSCAR rotations, which
// this stage computes (kvcache.NeedsRotations: oscar2, oscar2-g32, oscar4,
// and oscar-mixed, whose per-layer widths come from quantize.kv.kv_bits).
func rotates(cache string) bool { return kvcache.NeedsRotations(cache) }

// kvSummary is the quantize-kv stage's result.
type kvSummary struct {
	Cache  string `json:"cache"`
	Sink   int    `json:"sink,omitempty"`
	Recent int    `json:"recent,omitempty"`
	// Recalibrated says the stage calibrated the (pruned) model itself.
	Recalibrated bool               `json:"recalibrated,omitempty"`
	Rotations    *oscar.KVSummary   `json:"rotations,omitempty"`
	Calibration  *calibrate.Summary `json:"calibration,omitempty"`
}

// quantizeKV records the KV cache scheme and, for oscar caches, computes
// the rotations (calibrating the current model first when an earlier
// stage changed it).
func (p *pipeline) quantizeKV(ctx context.Context, dir string) (outputs, any, error) {
	kv := p.r.Quantize.KV
	o := outputs{KVCache: kv.Cache, KVSink: kv.Sink, KVRecent: kv.Recent}
	s := &kvSummary{Cache: kv.Cache, Sink: kv.Sink, Recent: kv.Recent}
	if !rotates(kv.Cache) {
		return o, s, nil
	}
	calib := p.st.calib
	if calib == "" {
		var err error
		if calib, s.Calibration, err = p.recalibrate(ctx, dir, "quantize-kv"); err != nil {
			return outputs{}, nil, err
		}
		s.Recalibrated = true
	}
	ko := kv.options()
	ko.Model, ko.Calib, ko.Out, ko.Version = p.st.model, calib, filepath.Join(dir, "rot.safetensors"), p.opt.Version
	ko.Threads, ko.Logger = p.opt.Threads, p.opt.Logger
	rs, err := oscar.QuantizeKV(ctx, ko)
	if err != nil {
		return outputs{}, nil, err
	}
	rs.Path = "rot.safetensors"
	s.Rotations = rs
	o.KVRotations = "rot.safetensors"
	return o, s, nil
}
