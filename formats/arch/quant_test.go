package arch

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/internal/shared"
)

// withQuant returns stories260K's config.json with block appended as the
// lmpack_quantization value.
func withQuant(t *testing.T, block string) []byte {
	t.Helper()
	b, err := os.ReadFile(shared.Path(t, "stories260K-hf", "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	s := strings.TrimSpace(string(b))
	return []byte(s[:len(s)-1] + `, "` + QuantKey + `": ` + block + "}")
}

func TestQuantBlock(t *testing.T) {
	d, err := Parse(withQuant(t, `{"format": "lmpack-wq", "version": 1, "method": "gptq", "tensors": {
		"model.layers.1.mlp.down_proj.weight": {"bits": 3, "group_size": 172, "symmetric": true},
		"model.layers.0.self_attn.q_proj.weight": {"bits": 4, "group_size": 32, "symmetric": false, "perm": true}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if d.Quant == nil || len(d.Quant.Tensors) != 2 || d.Quant.Tensors["model.layers.0.self_attn.q_proj.weight"] != (TensorQuant{4, 32, false, true}) {
		t.Fatalf("Quant: %+v", d.Quant)
	}
	s := d.StorageShapes()
	want := map[string][]int{
		"model.layers.0.self_attn.q_proj.qweight": {64, 32}, "model.layers.0.self_attn.q_proj.scales": {64, 2},
		"model.layers.0.self_attn.q_proj.qzeros": {64, 2}, "model.layers.0.self_attn.q_proj.perm": {64},
		"model.layers.1.mlp.down_proj.qweight": {64, 65}, "model.layers.1.mlp.down_proj.scales": {64, 1},
	}
	for n, sh := range want {
		if got := s[n]; len(got) != len(sh) || got[0] != sh[0] || (len(sh) > 1 && got[1] != sh[1]) {
			t.Errorf("%s: shape %v, want %v", n, got, sh)
		}
	}
	for _, n := range []string{"model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.down_proj.weight", "model.layers.1.mlp.down_proj.qzeros"} {
		if _, ok := s[n]; ok {
			t.Errorf("StorageShapes lists %s", n)
		}
	}
	// 47 names, two weights replaced by 4 and 2 storage tensors.
	if len(s) != 47-2+4+2 {
		t.Errorf("StorageShapes: %d tensors, want 51", len(s))
	}
	plain, err := Parse(withQuant(t, "null"))
	if err != nil || plain.Quant != nil {
		t.Fatalf("null block: %v %+v", err, plain.Quant)
	}
}

func TestQuantBlockBad(t *testing.T) {
	q := `"model.layers.0.mlp.up_proj.weight"`
	for _, tc := range []struct{ block, want string }{
		{`{"format": "gptq", "version": 1, "tensors": {}}`, `format "gptq"`},
		{`{"format": "lmpack-wq", "version": 2, "tensors": {}}`, "version 2"},
		{`{"format": "lmpack-wq", "version": 1, "tensors": {}, "extra": 1}`, "unknown field"},
		{`{"format": "lmpack-wq", "version": 1, "tensors": {"nope.weight": {"bits": 4, "group_size": 32}}}`, `"nope.weight" is not a tensor`},
		{`{"format": "lmpack-wq", "version": 1, "tensors": {"model.embed_tokens.weight": {"bits": 4, "group_size": 32}}}`, "cannot be quantized"},
		{`{"format": "lmpack-wq", "version": 1, "tensors": {"model.norm.weight": {"bits": 4, "group_size": 32}}}`, "cannot be quantized"},
		{`{"format": "lmpack-wq", "version": 1, "tensors": {` + q + `: {"bits": 5, "group_size": 32}}}`, "bits 5"},
		{`{"format": "lmpack-wq", "version": 1, "tensors": {` + q + `: {"bits": 4, "group_size": 48}}}`, "group_size 48"},
		{`{"format": "lmpack-wq", "version": 1, "tensors": {` + q + `: {"bits": 4, "group_size": 0}}}`, "group_size 0"},
		{`[1]`, "cannot unmarshal"},
	} {
		_, err := Parse(withQuant(t, tc.block))
		if !errors.Is(err, ErrQuant) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want ErrQuant containing %q", tc.block, err, tc.want)
		}
	}
}
