package runtime_test

import (
	"testing"

	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/runtime"
	"github.com/lmpack/lmpack/runtime/kvcache"
)

// TestForwardBatchQuantizedKV: with every cache kind of runtime/kvcache
// (fp32, fp16, int8, int4, int2-naive, kivi2, quarot2, oscar2/4, ...),
// without windows and with a sink and recent window small enough that
// the ragged plan's prefill chunks quantize tokens some of their queries
// still see in fp16 (QuantizedKV), a sequence's logits in a batch equal
// bit for bit those it gets alone with the same call boundaries.
func TestForwardBatchQuantizedKV(t *testing.T) {
	dir, d, _ := runtime.SynthCheckpoint(t, runtime.With(runtime.BaseConfig("LlamaForCausalLM"), "num_hidden_layers", 2), 501, safetensors.F32)
	ma, _ := runtime.LoadDir(t, dir, 1)
	mb, _ := runtime.LoadDir(t, dir, 2)
	for _, method := range kvcache.Methods() {
		for _, win := range [][2]int{{0, 0}, {1, 3}} {
			recent := win[1]
			if recent == 0 && (method == "kivi2" || method == "oscars2") {
				recent = 1 // no 128-token default residual
			}
			newCache := func(runtime.Model) func(int) runtime.KVCache {
				return func(capacity int) runtime.KVCache { return semCache(t, method, d, capacity, win[0], recent) }
			}
			runtime.CheckBatchAlone(t, method, ma, mb, runtime.MixedPlan, newCache)
		}
	}
}
