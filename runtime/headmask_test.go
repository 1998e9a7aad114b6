package runtime

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/lmpack/lmpack/formats/safetensors"
)

// TestHeterogeneousLayers runs a checkpoint whose layers differ in head
// counts and FFN sizes (lmpack's layer_configs) and compares it with the
// naive float64 forward, which builds each layer from its own spec.
func TestHeterogeneousLayers(t *testing.T) {
	for _, fam := range []string{"LlamaForCausalLM", "Qwen3ForCausalLM"} {
		t.Run(fam, func(t *testing.T) {
			cfg := with(baseConfig(fam), "num_attention_heads", 8, "num_key_value_heads", 4, "head_dim", 6, "attention_bias", true,
				"layer_configs", []map[string]int{
					{"num_attention_heads": 8, "num_key_value_heads": 4, "intermediate_size": 80},
					{"num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 17},
					{"num_attention_heads": 6, "num_key_value_heads": 3, "intermediate_size": 40},
				})
			dir, d, w := synthCheckpoint(t, cfg, 77, safetensors.F32)
			for i, want := range [][3]int{{8, 4, 80}, {2, 1, 17}, {6, 3, 40}} {
				l := d.Layers[i]
				if l.NumHeads != want[0] || l.NumKVHeads != want[1] || l.MLP.IntermediateSize != want[2] {
					t.Fatalf("layer %d: heads %d kv %d ffn %d, want %v", i, l.NumHeads, l.NumKVHeads, l.MLP.IntermediateSize, want)
				}
			}
			tokens := []int{1, 5, 90, 33, 33, 7, 64, 2, 0, 96, 12, 45, 45, 45, 3, 80}
			ref, _ := refForward(d, w, tokens)
			want := flatten(ref)
			m, _ := loadDir(t, dir, 2)
			if diff := maxAbsDiff(forwardAll(t, m, tokens), want); diff > 1e-4 {
				t.Errorf("prefill: max abs diff %.3g > 1e-4", diff)
			}
			if diff := maxAbsDiff(forwardSteps(t, m, tokens, 3), want); diff > 1e-4 {
				t.Errorf("decode in chunks of 3: max abs diff %.3g > 1e-4", diff)
			}
		})
	}
}

// attnRecorder keeps the last AttnOutput of each layer.
type attnRecorder struct{ att map[int][]float32 }

func (r *attnRecorder) AttnOutput(layer, pos, n int, att []float32) {
	r.att[layer] = append([]float32(nil), att...)
}

// TestKVGroupMask: the full model with some GQA groups masked gives the
// logits of the checkpoint with those groups sliced out of q/k/v (rows
// and biases) and o_proj (columns), described by layer_configs.
func TestKVGroupMask(t *testing.T) {
	const nh, nkv, hd, H = 8, 4, 6, 48
	cfg := with(baseConfig("Qwen3ForCausalLM"), "num_attention_heads", nh, "num_key_value_heads", nkv, "head_dim", hd)
	dir, d, w := synthCheckpoint(t, cfg, 91, safetensors.F32)
	// Groups removed per layer (3 layers).
	removed := [][]int{{1}, {}, {0, 2, 3}}
	g := nh / nkv
	sliced := t.TempDir()
	var ws []safetensors.WriteTensor
	var lcs []map[string]int
	for name, v := range w {
		f := make([]float32, len(v))
		for i, x := range v {
			f[i] = float32(x)
		}
		ws = append(ws, safetensors.FromFloat32(name, shapes(d)[name], f))
	}
	for li := range d.Layers {
		a := d.Layers[li].Attn
		keep := map[int]bool{}
		for kv := 0; kv < nkv; kv++ {
			keep[kv] = true
		}
		for _, kv := range removed[li] {
			delete(keep, kv)
		}
		var qRows, kvRows []int
		for kv := 0; kv < nkv; kv++ {
			if !keep[kv] {
				continue
			}
			for r := kv * g * hd; r < (kv+1)*g*hd; r++ {
				qRows = append(qRows, r)
			}
			for r := kv * hd; r < (kv+1)*hd; r++ {
				kvRows = append(kvRows, r)
			}
		}
		for i := range ws {
			switch ws[i].Name {
			case a.Q:
				ws[i] = sliceRowsT(ws[i], w[a.Q], H, qRows)
			case a.K:
				ws[i] = sliceRowsT(ws[i], w[a.K], H, kvRows)
			case a.V:
				ws[i] = sliceRowsT(ws[i], w[a.V], H, kvRows)
			case a.O:
				var f []float32
				for r := 0; r < H; r++ {
					for _, c := range qRows {
						f = append(f, float32(w[a.O][r*nh*hd+c]))
					}
				}
				ws[i] = safetensors.FromFloat32(a.O, []int{H, len(qRows)}, f)
			}
		}
		lcs = append(lcs, map[string]int{"num_attention_heads": len(qRows) / hd, "num_key_value_heads": len(kvRows) / hd, "intermediate_size": 80})
	}
	cfg["layer_configs"] = lcs
	raw, _ := json.Marshal(cfg)
	if err := os.WriteFile(filepath.Join(sliced, "config.json"), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := safetensors.WriteFile(filepath.Join(sliced, "model.safetensors"), ws, nil); err != nil {
		t.Fatal(err)
	}

	tokens := []int{1, 5, 90, 33, 33, 7, 64, 2, 0, 96, 12, 45, 45, 45, 3, 80, 11, 19}
	full, _ := loadDir(t, dir, 2)
	small, _ := loadDir(t, sliced, 1)
	unmasked := forwardAll(t, full, tokens)
	mk, ok := full.(KVGroupMasker)
	if !ok {
		t.Fatal("the CPU model does not implement KVGroupMasker")
	}
	for li, rm := range removed {
		mask := make([]bool, nkv)
		for _, kv := range rm {
			mask[kv] = true
		}
		if err := mk.MaskKVGroups(li, mask); err != nil {
			t.Fatal(err)
		}
	}
	rec := &attnRecorder{att: map[int][]float32{}}
	full.SetObserver(rec)
	masked := forwardAll(t, full, tokens)
	want := make([]float64, len(masked))
	for i, v := range masked {
		want[i] = float64(v)
	}
	got := forwardAll(t, small, tokens)
	diff := maxAbsDiff(got, want)
	t.Logf("sliced vs masked: max abs logit diff %.3g", diff)
	if diff > 1e-5 {
		t.Errorf("sliced model vs masked full model: max abs logit diff %.3g > 1e-5", diff)
	}
	if diff := maxAbsDiff(forwardSteps(t, small, tokens, 1), want); diff > 1e-5 {
		t.Errorf("sliced model decode vs masked prefill: %.3g > 1e-5", diff)
	}
	// The observer sees zeros in the masked groups' columns only.
	att := rec.att[2]
	qdim := nh * hd
	for c := 0; c < qdim; c++ {
		kv := c / (g * hd)
		var s float64
		for i := range tokens {
			s += math.Abs(float64(att[i*qdim+c]))
		}
		if (kv != 1) != (s == 0) {
			t.Fatalf("layer 2 column %d (group %d): sum |att| = %g", c, kv, s)
		}
	}
	var change float64
	for i := range unmasked {
		change = math.Max(change, math.Abs(float64(unmasked[i]-masked[i])))
	}
	if change < 1e-3 {
		t.Errorf("masking changed the logits by only %g", change)
	}
	// Clearing every mask restores the unmasked logits exactly.
	full.SetObserver(nil)
	for li := range removed {
		if err := mk.MaskKVGroups(li, nil); err != nil {
			t.Fatal(err)
		}
	}
	again := forwardAll(t, full, tokens)
	for i := range again {
		if again[i] != unmasked[i] {
			t.Fatalf("logit %d after clearing masks: %v, unmasked %v", i, again[i], unmasked[i])
		}
	}
	if err := mk.MaskKVGroups(3, nil); err == nil {
		t.Error("MaskKVGroups(layer 3) of a 3-layer model succeeded")
	}
	if err := mk.MaskKVGroups(0, []bool{true}); err == nil {
		t.Error("MaskKVGroups with 1 entry for 4 KV heads succeeded")
	}
}

func sliceRowsT(old safetensors.WriteTensor, w []float64, cols int, rows []int) safetensors.WriteTensor {
	var f []float32
	for _, r := range rows {
		for c := 0; c < cols; c++ {
			f = append(f, float32(w[r*cols+c]))
		}
	}
	return safetensors.FromFloat32(old.Name, []int{len(rows), cols}, f)
}
