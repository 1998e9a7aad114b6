package runtime_test

import (
	"fmt"
	"testing"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/runtime"
	"github.com/lmpack/lmpack/runtime/kvcache"
)

// TestKVAttenderMatchesRead: Forward through a cache's KVAttender (the
// history attended in its packed form) gives the logits of Forward
// through Read (dequantize, then attend; readKV hides the ability) for
// every cache kind, on a GQA 6:2 model of head_dim 8 (head_dim 32 for
// q8_0/q4_0) and a Mistral with sliding_window 5, without windows and
// with sink 2 and recent 5, over a prompt of 13 tokens, a chunk of 4 and
// 9 single-token steps.
//
// Both paths attend the same stored history: every call runs on one
// cache, through KVAttender with one thread and with two, then through
// Read, the cache truncated back to the call's start in between (the
// history a call sees, Read of positions [0, pos) after its Write, is
// checked bit-identical across the three). Separate caches per path are
// no parity test: the paths' hidden states differ in the last float32
// bits, a K/V row written into the fp16 window can round one binary16
// ulp apart, and the quantizer (min/max, binary16 scale and zero, codes)
// turns that into a different stored row (seen: a 4-bit key 1.6e-3
// apart, logits 3.4e-4 apart with oscar-mixed).
//
// Bound: max|Δlogit| ≤ 1e-4·max|logit| (float32 sums in another order;
// the kernels' own bounds against float64 are kvcache's
// TestAttendMatchesRead). A cache whose KVAttender rounds the query to
// int8 for its key scores (kvcache.QueryRounder; AVX-512 VNNI, 2- and
// 4-bit keys) has its per-score bound, (max|x|/254)·‖x̂_j‖₁, checked in
// kvcache's TestAttendCodePaths and kernels' TestCodeDotsQ8; through
// softmax and the layers that bound gives no useful logit bound, so its
// logits (every call's last position) meet the runtime's criterion for
// int8 rounding instead, chosen before these kernels existed
// (q8logits_test.go: mean KL ≤ 1e-3 nats, top-1 flips only at near ties). One thread and two give bit-identical logits
// (determinism: the per-head work does not depend on the split).
func TestKVAttenderMatchesRead(t *testing.T) {
	type model struct {
		name   string
		d      *arch.Description
		m1, m2 runtime.Model
	}
	var models []model
	for i, cfg := range []map[string]any{
		runtime.With(runtime.BaseConfig("LlamaForCausalLM"), "num_hidden_layers", 2),
		runtime.With(runtime.BaseConfig("LlamaForCausalLM"), "num_hidden_layers", 2, "head_dim", 32),
		runtime.With(runtime.BaseConfig("MistralForCausalLM"), "num_hidden_layers", 2, "sliding_window", 5),
	} {
		dir, d, _ := runtime.SynthCheckpoint(t, cfg, uint64(700+i), safetensors.F32)
		m1, _ := runtime.LoadDir(t, dir, 1)
		m2, _ := runtime.LoadDir(t, dir, 2)
		models = append(models, model{fmt.Sprintf("model%d", i), d, m1, m2})
	}
	toks := semTokens(26, 97)
	covered := 0
	for _, md := range models {
		for _, method := range semMethods(t, md.d) {
			if method == "fp32" {
				continue
			}
			for _, win := range [][2]int{{0, 0}, {2, 5}} {
				recent := win[1]
				if recent == 0 && (method == "kivi2" || method == "oscars2") {
					recent = 1
				}
				name := fmt.Sprintf("%s/%s/sink%d-recent%d", md.name, method, win[0], recent)
				c := semCache(t, method, md.d, 32, win[0], recent)
				refc := readKV{c, c.(runtime.QuantizedKV)}
				ka := c.(runtime.KVAttender)
				if ka.AttendsKV(0) {
					covered++
				}
				const tol = 1e-4
				rounds := false
				if qr, ok := c.(kvcache.QueryRounder); ok {
					for li := range md.d.Layers {
						rounds = rounds || qr.RoundsQuery(li, 1)
					}
				}
				var gotAll, wantAll []float32
				V := md.d.VocabSize
				lf, lf2, lr := make([]float32, V), make([]float32, V), make([]float32, V)
				pos := 0
				for _, n := range []int{13, 4, 1, 1, 1, 1, 1, 1, 1, 1, 1} {
					call := toks[pos : pos+n]
					forwardInto(t, md.m1, call, c, lf, false)
					hf := readHistory(c, md.d, pos)
					c.Truncate(pos)
					forwardInto(t, md.m2, call, c, lf2, false)
					hf2 := readHistory(c, md.d, pos)
					c.Truncate(pos)
					forwardInto(t, md.m1, call, refc, lr, false)
					hr := readHistory(c, md.d, pos)
					for i := range hr {
						if hf[i] != hr[i] || hf2[i] != hr[i] {
							t.Fatalf("%s: call at %d: stored history element %d is %v, %v, %v in the three runs (the parity needs one history)", name, pos, i, hf[i], hf2[i], hr[i])
						}
					}
					pos += n
					if rounds {
						gotAll, wantAll = append(gotAll, lf...), append(wantAll, lr...)
					} else if d := relDiff(lf, lr); !(d <= tol) {
						t.Fatalf("%s: at position %d the logits through KVAttender differ from Read's by %.3g of max|logit| (bound %g)", name, pos, d, tol)
					}
					for i := range lf {
						if lf[i] != lf2[i] {
							t.Fatalf("%s: at position %d logit %d is %v with one thread, %v with two", name, pos, i, lf[i], lf2[i])
						}
					}
				}
				if rounds {
					runtime.CheckQ8Logits(t, name+" (int8-rounded query)", gotAll, wantAll, V)
				}
			}
		}
	}
	if covered == 0 {
		t.Fatal("no cache kind served attention through KVAttender")
	}
}

// readHistory returns Read's keys and values of positions [0, n) of every
// layer and kv head of c, concatenated (layer, head, K then V).
func readHistory(c runtime.KVCache, d *arch.Description, n int) []float32 {
	var out []float32
	for li, l := range kvcache.LayersOf(d) {
		for h := 0; h < l.NumKVHeads; h++ {
			k, v := make([]float32, n*l.HeadDim), make([]float32, n*l.HeadDim)
			c.Read(li, h, n, k, v)
			out = append(append(out, k...), v...)
		}
	}
	return out
}
