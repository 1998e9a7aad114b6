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

// DefaultServingCtx is the serving context of the second bits/element
// figure when none is given: eval --kv-serving-ctx's default and the one
// compress reports (unless the recipe's quantize.kv.serving_ctx names
// another), in tokens.
const DefaultServingCtx = 32768

// ServingBits returns the bits per cached K/V element that a cache of
// method (kvcache.Methods) for layers under o holds once ctx tokens are
// written (kvcache.BitsAt: codes, scales, zero-points and the fp16
// windows amortised over ctx; 32 for fp32): the figure of eval's
// serving-context column (KVRow.BitsServing). Errors: kvcache.BitsAt's.
func ServingBits(method string, layers []kvcache.Layer, o kvcache.Options, ctx int) (float64, error) {
	return kvcache.BitsAt(method, layers, o, ctx)
}

// allF16 reports whether a quantised kind keeps every layer in binary16
// (vLLM's TurboQuant presets leave the first and last two layers
// unquantized: all of a 4-layer model), so that it quantises nothing.
func allF16(name string, layers []kvcache.Layer, o kvcache.Options) bool {
	if name == "fp16" || name == "fp32" {
		return false
	}
	b, err := kvcache.BitsAt(name, layers, o, 1<<20)
	return err == nil && b >= 16
}

// Options configures Run.
type Options struct {
	Ctx, MaxWindows int
	// Methods are kvcache method names (kvcache.Methods()).
	Methods []string
	// Rotations is an OSCAR rotation file (lmpack quantize kv), required
	// by oscar2 and oscar4.
	Rotations string
	// Protocol is eval.ProtocolDecode ("" means it) or
	// eval.ProtocolFakeQuant. Decode: each window's first Prompt tokens
	// in one call (full precision among themselves, not scored), then
	// Chunk tokens per call (1: one token per call), every scored
	// position attending as in generation. Fake-quant (KVQuant's): the
	// whole window in one call, every token read back as stored, the
	// query's own key included, no windows (Prompt 0, Chunk 1, no
	// Windows).
	Protocol      string
	Prompt, Chunk int
	// ServingCtx is the context of the second bits/element column
	// (ServingBits; e.g. DefaultServingCtx); 0: not reported.
	ServingCtx int
	// Windows: Sink and Recent were given (--kv-window). Then every
	// method, kivi2 and oscars2 included, gets exactly those windows (0:
	// none): the method's row has none, and a second row "name+wS,R"
	// has them when either is non-zero. Without Windows, kivi2 and
	// oscars2 keep their published 128-token fp16 residual and the other
	// methods quantise every token.
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
// (eval.CompareKV) under opt.Protocol: decode-faithful (plain kvcache.New
// caches through eval.TeacherForce, the runtime attending as in
// generation: a call's tokens among themselves through fresh float32 K/V,
// earlier calls' tokens as stored, windows counted back from each query)
// or KVQuant's fake quantisation (kvcache.NewFakeQuant, windows 0, each
// window in one call). Each row reports bits/element at the evaluated
// context (measured) and at opt.ServingCtx (kvcache.BitsAt), and is
// marked "nothing quantised" when its windows cover the context
// (kvcache.QuantizedAt). Errors: invalid options (Validate: a
// *field.Error), a rotation file for another model, a bad data file.
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
	fake := opt.Protocol == eval.ProtocolFakeQuant
	layers := kvcache.LayersOf(e.Desc)
	var methods []eval.KVMethod
	add := func(label, name string, o kvcache.Options) error {
		if _, err := kvcache.New(name, layers, 1, o); err != nil {
			return fmt.Errorf("kveval: --kv %s: %w", name, err)
		}
		f16 := allF16(name, layers, o) // once per method, not per scored position
		newCache := kvcache.New
		if fake {
			// Every position reads every token, its own included, as
			// stored; the runtime alone would attend a call's tokens
			// through their fresh float32 K/V.
			newCache = kvcache.NewFakeQuant
		}
		methods = append(methods, eval.KVMethod{Name: label, Method: name,
			New: func(n int) (runtime.KVCache, error) { return newCache(name, layers, n, o) },
			BitsAt: func(ctx int) float64 {
				b, _ := ServingBits(name, layers, o, ctx)
				return b
			},
			Quantized: func(ctx int) int {
				q, _ := kvcache.QuantizedAt(name, o, ctx)
				if f16 {
					q = 0
				}
				return q
			},
			ReadAt: func(capacity, c0, p int) (float64, float64, float64) {
				r, q, b, _ := kvcache.ReadAt(name, layers, o, capacity, c0, p)
				if f16 {
					q = 0
				}
				return r, q, b
			}})
		return nil
	}
	for _, name := range opt.Methods {
		name = strings.TrimSpace(name)
		// Fake-quant has no windows; a given --kv-window makes Recent 0
		// mean none for kivi2 and oscars2 as for every other method.
		base := kvcache.Options{Rotations: rot, ExactWindows: fake || opt.Windows}
		if err := add(name, name, base); err != nil {
			return nil, err
		}
		if opt.Windows && windowed(name) && (opt.Sink > 0 || opt.Recent > 0) {
			label := fmt.Sprintf("%s+w%d,%d", name, opt.Sink, opt.Recent)
			w := base
			w.Sink, w.Recent = opt.Sink, opt.Recent
			if err := add(label, name, w); err != nil {
				return nil, err
			}
		}
	}
	co := eval.KVCompareOptions{Ctx: opt.Ctx, MaxWindows: opt.MaxWindows, Progress: opt.Progress,
		Protocol: eval.ProtocolDecode, Prompt: opt.Prompt, Chunk: opt.Chunk, ServingCtx: opt.ServingCtx}
	if fake {
		co.Protocol, co.Prompt, co.Chunk = eval.ProtocolFakeQuant, 0, opt.Ctx
	}
	rep, err := eval.CompareKV(ctx, e.Model, ids, methods, co)
	if err != nil || !opt.Layers {
		return rep, err
	}
	if rep.Layers, err = eval.KVLayerErrors(ctx, e.Model, ids, methods, opt.Ctx); err != nil {
		return nil, err
	}
	return rep, nil
}
