// Package kveval is the entry point of "lmpack eval --kv": it opens the
// rotation file for the model, builds each KV cache method and runs
// eval.CompareKV over a text file. It sits apart from internal/engine
// because it needs calibrate (model fingerprints), which itself uses
// engine.
package kveval

import (
	"context"
	"fmt"
	"strings"

	"github.com/lmpack/lmpack/eval"
	"github.com/lmpack/lmpack/internal/engine"
	"github.com/lmpack/lmpack/model"
	"github.com/lmpack/lmpack/quantize/oscar"
	"github.com/lmpack/lmpack/runtime"
	"github.com/lmpack/lmpack/runtime/kvcache"
)

// Options configures Run.
type Options struct {
	Ctx, MaxWindows int
	// Methods are kvcache method names (kvcache.Methods()).
	Methods []string
	// Rotations is an OSCAR rotation file (lmpack quantize kv), required
	// by oscar2 and oscar4.
	Rotations string
	// Sink and Recent, when Windows is set, add a second row per method
	// with fp16 windows of that many first and newest tokens (the default
	// rows quantize every token).
	Windows      bool
	Sink, Recent int
	// Layers adds per-layer attention-logit and output errors measured on
	// the first window (eval.KVLayerErrors).
	Layers   bool
	Progress func(done, total int)
}

// windowed reports whether a method takes Options.Sink/Recent windows.
func windowed(name string) bool {
	switch name {
	case "fp32", "fp16":
		return false
	}
	return true
}

// Run tokenizes the text file as engine.EvalFile does and compares the KV
// cache methods side by side against the float32 cache in one run
// (eval.CompareKV), each window pushed through each cache in one call and
// read through kvcache.NewFakeQuant (KVQuant's fake-quantization
// protocol: every position reads every token of the window, its own
// included, as stored, with the fp16 windows counted back from the
// window's end). Errors: invalid options (Validate: a *field.Error),
// a rotation file for another model, a bad data file.
func Run(ctx context.Context, e *engine.Engine, path string, opt Options) (*eval.KVReport, error) {
	if err := opt.Validate(); err != nil {
		return nil, fmt.Errorf("kveval: %w", err)
	}
	ids, err := e.EvalIDs(path, opt.Ctx)
	if err != nil {
		return nil, err
	}
	var rot *kvcache.Rotations
	for _, name := range opt.Methods {
		if kvcache.NeedsRotations(name) && rot == nil {
			fp, err := model.Fingerprint(e.Dir, e.Checkpoint)
			if err != nil {
				return nil, err
			}
			r, _, err := oscar.ReadFile(opt.Rotations, model.Expect{ModelFingerprint: fp, Desc: e.Desc})
			if err != nil {
				return nil, err
			}
			kr := kvcache.Rotations(*r)
			rot = &kr
		}
	}
	layers := kvcache.LayersOf(e.Desc)
	var methods []eval.KVMethod
	add := func(label, name string, o kvcache.Options) error {
		if _, err := kvcache.New(name, layers, 1, o); err != nil {
			return fmt.Errorf("kveval: --kv %s: %w", name, err)
		}
		// Each window goes through the cache in one Forward call; read
		// through the fake-quantization protocol, so that every position
		// reads every token (its own included) as stored. The runtime
		// alone would attend a call's tokens through their fresh float32
		// K/V and report the fp32-KV logits for every method.
		methods = append(methods, eval.KVMethod{Name: label, New: func(n int) (runtime.KVCache, error) {
			return kvcache.NewFakeQuant(name, layers, n, o)
		}})
		return nil
	}
	for _, name := range opt.Methods {
		name = strings.TrimSpace(name)
		if err := add(name, name, kvcache.Options{Rotations: rot}); err != nil {
			return nil, err
		}
		if opt.Windows && windowed(name) {
			label := fmt.Sprintf("%s+w%d,%d", name, opt.Sink, opt.Recent)
			if err := add(label, name, kvcache.Options{Rotations: rot, Sink: opt.Sink, Recent: opt.Recent}); err != nil {
				return nil, err
			}
		}
	}
	rep, err := eval.CompareKV(ctx, e.Model, ids, methods, eval.KVCompareOptions{Ctx: opt.Ctx, MaxWindows: opt.MaxWindows, Progress: opt.Progress})
	if err != nil || !opt.Layers {
		return rep, err
	}
	if rep.Layers, err = eval.KVLayerErrors(ctx, e.Model, ids, methods, opt.Ctx); err != nil {
		return nil, err
	}
	return rep, nil
}
