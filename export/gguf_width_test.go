package export

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/internal/shared"
)

// writeWidthPruned writes a width-pruned stories260K in a temporary
// directory: layer 2 without its last GQA group (q heads 6, 7 and KV head
// 3), layer 3 with the first 100 of its 172 FFN units, sizes in
// config.json layer_configs.
func writeWidthPruned(t *testing.T) string {
	src := shared.Path(t, "stories260K-hf")
	dir := t.TempDir()
	ck, err := safetensors.OpenDir(src)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	rowsOf := func(v []float32, cols, n int) []float32 { return v[:n*cols] }
	colsOf := func(v []float32, rows, cols, n int) []float32 {
		out := make([]float32, 0, rows*n)
		for r := 0; r < rows; r++ {
			out = append(out, v[r*cols:r*cols+n]...)
		}
		return out
	}
	var out []safetensors.WriteTensor
	for _, n := range ck.Names() {
		tt, _ := ck.Tensor(n)
		v, _ := tt.Float32()
		shape := slices.Clone(tt.Shape)
		switch {
		case strings.HasPrefix(n, "model.layers.2.self_attn.q_proj"):
			v, shape[0] = rowsOf(v, 64, 48), 48
		case strings.HasPrefix(n, "model.layers.2.self_attn.k_proj"), strings.HasPrefix(n, "model.layers.2.self_attn.v_proj"):
			v, shape[0] = rowsOf(v, 64, 24), 24
		case strings.HasPrefix(n, "model.layers.2.self_attn.o_proj"):
			v, shape[1] = colsOf(v, 64, 64, 48), 48
		case strings.HasPrefix(n, "model.layers.3.mlp.gate_proj"), strings.HasPrefix(n, "model.layers.3.mlp.up_proj"):
			v, shape[0] = rowsOf(v, 64, 100), 100
		case strings.HasPrefix(n, "model.layers.3.mlp.down_proj"):
			v, shape[1] = colsOf(v, 64, 172, 100), 100
		}
		out = append(out, safetensors.FromFloat32(n, shape, v))
	}
	if err := safetensors.WriteFile(filepath.Join(dir, "model.safetensors"), out, nil); err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	b, _ := os.ReadFile(filepath.Join(src, "config.json"))
	json.Unmarshal(b, &cfg)
	lc := make([]map[string]int, 5)
	for i := range lc {
		lc[i] = map[string]int{"num_attention_heads": 8, "num_key_value_heads": 4, "intermediate_size": 172}
	}
	lc[2]["num_attention_heads"], lc[2]["num_key_value_heads"] = 6, 3
	lc[3]["intermediate_size"] = 100
	cfg["layer_configs"] = lc
	b, _ = json.Marshal(cfg)
	os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644)
	for _, f := range []string{"tokenizer.json", "tokenizer_config.json"} {
		b, _ := os.ReadFile(filepath.Join(src, f))
		os.WriteFile(filepath.Join(dir, f), b, 0o644)
	}
	return dir
}

// TestGGUFWidthPruned: a width-pruned Llama is written as llama.cpp's deci
// architecture with per-layer head counts and FFN sizes, tensors in the
// pruned shapes (q/k permuted with the layer's own head counts); a
// width-pruned Qwen3 is refused with the reason.
func TestGGUFWidthPruned(t *testing.T) {
	dir := writeWidthPruned(t)
	rep, out := exportGGUF(t, dir, GGUFOptions{})
	f := openGGUF(t, out)
	for k, v := range map[string]any{
		"general.architecture":         "deci",
		"deci.attention.head_count":    []int32{8, 8, 6, 8, 8},
		"deci.attention.head_count_kv": []int32{4, 4, 3, 4, 4},
		"deci.feed_forward_length":     []int32{172, 172, 172, 100, 172},
		"deci.attention.key_length":    uint32(8),
	} {
		if got := kv(t, f, k); !reflect.DeepEqual(got, v) {
			t.Errorf("%s = %#v, want %#v", k, got, v)
		}
	}
	for n, dims := range map[string][]uint64{"blk.2.attn_q.weight": {64, 48}, "blk.2.attn_k.weight": {64, 24}, "blk.2.attn_output.weight": {48, 64}, "blk.3.ffn_down.weight": {100, 64}} {
		if ti, _ := f.Tensor(n); ti == nil || !slices.Equal(ti.Dims, dims) {
			t.Errorf("%s: %+v, want dims %v", n, ti, dims)
		}
	}
	if len(rep.Warnings) == 0 || !strings.Contains(rep.Warnings[0], "deci") {
		t.Errorf("warnings %q: want the deci note", rep.Warnings)
	}
	// Qwen3 has no per-layer form in llama.cpp.
	d := &arch.Description{Architecture: "Qwen3ForCausalLM", HiddenSize: 64, Layers: []arch.Layer{
		{NumHeads: 4, NumKVHeads: 2, HeadDim: 16, MLP: &arch.MLP{IntermediateSize: 128}},
		{NumHeads: 2, NumKVHeads: 1, HeadDim: 16, MLP: &arch.MLP{IntermediateSize: 128}},
	}}
	a, _ := archFor(d)
	e := &exporter{src: &source{path: "m", desc: d}, a: a, rep: &Report{}}
	if _, err := e.metadata(); err == nil || !strings.Contains(err.Error(), "width-pruned model") || !strings.Contains(err.Error(), "qwen3") {
		t.Errorf("width-pruned qwen3: %v, want a refusal naming qwen3", err)
	}
}
