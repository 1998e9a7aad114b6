package runtime_test

import (
	"fmt"
	"testing"

	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/runtime"
	"github.com/lmpack/lmpack/runtime/kvcache"
)

// TestBreakKVAttenderGQA is TestKVAttenderMatchesRead on GQA shapes that
// take the int8-rounded-query key kernels in decode (kernels.CodeDotsQ8F16x4
// for groups of 4 and 8 query rows per KV head, CodeDotsQ8F16 per row for
// 2, 3 and 6; 16 rows fall back to the block path), head_dims 64–128,
// for the kinds whose KVAttender rounds the query: the logits through
// KVAttender (one and two threads) against Read's, by the runtime's int8
// criterion (CheckQ8Logits).
func TestBreakKVAttenderGQA(t *testing.T) {
	cfgs := []struct{ nh, nkv, hd int }{{8, 2, 64}, {8, 1, 128}, {6, 1, 64}, {4, 2, 80}, {6, 2, 96}, {16, 1, 64}, {8, 8, 32}}
	toks := semTokens(40, 97)
	ran := 0
	for i, g := range cfgs {
		cfg := runtime.With(runtime.BaseConfig("LlamaForCausalLM"), "num_hidden_layers", 2, "hidden_size", 64,
			"num_attention_heads", g.nh, "num_key_value_heads", g.nkv, "head_dim", g.hd)
		dir, d, _ := runtime.SynthCheckpoint(t, cfg, uint64(900+i), safetensors.F32)
		m1, _ := runtime.LoadDir(t, dir, 1)
		m2, _ := runtime.LoadDir(t, dir, 2)
		for _, method := range semMethods(t, d) {
			for _, win := range [][2]int{{0, 0}, {2, 5}} {
				recent := win[1]
				if recent == 0 && (method == "kivi2" || method == "oscars2") {
					recent = 1
				}
				c := semCache(t, method, d, 48, win[0], recent)
				qr, ok := c.(kvcache.QueryRounder)
				if !ok || !qr.RoundsQuery(0, g.nh/g.nkv) {
					continue
				}
				ran++
				name := fmt.Sprintf("gqa%d:%d/hd%d/%s/sink%d-recent%d", g.nh, g.nkv, g.hd, method, win[0], recent)
				refc := readKV{c, c.(runtime.QuantizedKV)}
				var gotAll, wantAll []float32
				V := d.VocabSize
				lf, lf2, lr := make([]float32, V), make([]float32, V), make([]float32, V)
				pos := 0
				for _, n := range []int{13, 4, 1, 1, 1, 1, 1, 1, 1, 1, 1, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1} {
					call := toks[pos : pos+n]
					forwardInto(t, m1, call, c, lf, false)
					c.Truncate(pos)
					forwardInto(t, m2, call, c, lf2, false)
					c.Truncate(pos)
					forwardInto(t, m1, call, refc, lr, false)
					pos += n
					gotAll, wantAll = append(gotAll, lf...), append(wantAll, lr...)
					for i := range lf {
						if lf[i] != lf2[i] {
							t.Fatalf("%s: at position %d logit %d is %v with one thread, %v with two", name, pos, i, lf[i], lf2[i])
						}
					}
				}
				runtime.CheckQ8Logits(t, name, gotAll, wantAll, V)
			}
		}
	}
	if ran == 0 {
		t.Skip("no cache rounds the query on this CPU")
	}
}
