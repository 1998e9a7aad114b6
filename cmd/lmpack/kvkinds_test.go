package main

import (
	"encoding/json"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/internal/shared"
)

// TestKVServingKindsTiny1M: eval --kv lists the serving-engine kinds
// (vLLM TurboQuant presets and their -all variants, fp8,
// int4_per_token_head; llama.cpp q8_0/q4_0) next to int4/int8 on
// tiny1m-hf (4 layers, head_dim 64, ctx 256). Bits/element are the
// engines' formulas at head_dim 64 (TurboQuant 3-bit: (26+28)·8/128 =
// 3.375; q8_0 34·8/32 = 8.5; ...); vLLM's boundary rule leaves all 4
// layers of this model unquantized, so the TurboQuant presets' rows equal
// the fp16 row; among the others the wider formats lose less.
func TestKVServingKindsTiny1M(t *testing.T) {
	t.Parallel()
	model := shared.Path(t, "tiny1m-hf")
	kinds := []string{"fp16", "int8", "int4", "fp8", "q8_0", "q4_0", "int4_per_token_head",
		"turboquant_k8v4", "turboquant_3bit_nc", "turboquant_k8v4-all", "turboquant_4bit_nc-all", "turboquant_k3v4_nc-all", "turboquant_3bit_nc-all"}
	r := lmpack(t, nil, "eval", model, "--data", shared.Path(t, "tinystories-valid", "heldout.txt"), "--ctx", "256",
		"--max-windows", "2", "--kv", strings.Join(append([]string{"fp32"}, kinds...), ","), "--json")
	wantOK(t, r)
	var raw struct {
		Rows []map[string]any `json:"rows"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &raw); err != nil {
		t.Fatalf("eval --json: %v\n%s", err, r.stdout)
	}
	row := map[string]map[string]any{}
	var names []string
	for _, rw := range raw.Rows {
		names = append(names, rw["kv"].(string))
		row[rw["kv"].(string)] = rw
	}
	if want := append([]string{"fp32"}, kinds...); !slices.Equal(names, want) {
		t.Fatalf("rows %v, want %v", names, want)
	}
	num := func(kv, c string) float64 { return row[kv][c].(float64) }
	for kv, bits := range map[string]float64{"fp8": 8, "q8_0": 8.5, "q4_0": 4.5, "int4_per_token_head": 4.5,
		"turboquant_k8v4": 16, "turboquant_3bit_nc": 16, "turboquant_k8v4-all": 6.25, "turboquant_4bit_nc-all": 4.375,
		"turboquant_k3v4_nc-all": 3.875, "turboquant_3bit_nc-all": 3.375} {
		if got := num(kv, "bits_per_element"); got != bits {
			t.Errorf("%s: %g bits/element, want %g", kv, got, bits)
		}
		// KV bytes = bits/8 × 2 (K and V) × 256 tokens × 4 layers × 128.
		if got, want := num(kv, "kv_bytes"), bits/8*2*256*4*128; got != want {
			t.Errorf("%s: kv_bytes %g, want %g", kv, got, want)
		}
	}
	for _, kv := range []string{"turboquant_k8v4", "turboquant_3bit_nc"} {
		if num(kv, "perplexity") != num("fp16", "perplexity") || num(kv, "kl") != num("fp16", "kl") {
			t.Errorf("%s: perplexity %v KL %v, want fp16's %v %v (boundary layers cover the 4-layer model)",
				kv, num(kv, "perplexity"), num(kv, "kl"), num("fp16", "perplexity"), num("fp16", "kl"))
		}
		if nq, _ := row[kv]["nothing_quantized"].(bool); !nq {
			t.Errorf("%s: row not marked nothing quantised (every layer of the 4-layer model is binary16): %v", kv, row[kv])
		}
	}
	for _, kv := range []string{"int4", "turboquant_3bit_nc-all"} {
		if nq, _ := row[kv]["nothing_quantized"].(bool); nq {
			t.Errorf("%s: row marked nothing quantised", kv)
		}
	}
	for _, pair := range [][2]string{{"q8_0", "q4_0"}, {"fp8", "int4_per_token_head"}, {"turboquant_4bit_nc-all", "turboquant_3bit_nc-all"},
		{"turboquant_4bit_nc-all", "turboquant_k3v4_nc-all"}, {"turboquant_k8v4-all", "turboquant_4bit_nc-all"}} {
		if !(num(pair[0], "kl") < num(pair[1], "kl")) {
			t.Errorf("KL %s %.4g not below %s %.4g", pair[0], num(pair[0], "kl"), pair[1], num(pair[1], "kl"))
		}
	}
	for _, kv := range kinds[1:] {
		if !strings.HasPrefix(kv, "turboquant") || strings.HasSuffix(kv, "-all") {
			if !(num(kv, "kl") > 0) {
				t.Errorf("%s: KL %v, want > 0 (the kind quantizes)", kv, num(kv, "kl"))
			}
		}
		t.Logf("%-24s %6.3f bits  ΔPPL %+.4f  KL %.5f", kv, num(kv, "bits_per_element"), num(kv, "delta_ppl"), num(kv, "kl"))
	}
}

// llama.cpp refuses q8_0/q4_0 KV at a head_dim that is not a multiple of
// 32, and so does eval --kv, naming the kind and the head_dim.
func TestKVServingKindsRefuseHeadDim8(t *testing.T) {
	t.Parallel()
	r := lmpack(t, nil, "eval", modelDir(t), "--data", valText(t), "--ctx", "64", "--max-windows", "1", "--kv", "fp32,q4_0")
	wantError(t, r, "q4_0", "head_dim 8", "multiple of 32")
}

// pack --kv-cache takes a serving-engine kind: the artifact records it and
// eval of the artifact runs with that cache (the log names it), and the
// artifact's perplexity differs from the float32-KV checkpoint's by the
// cache's loss only.
func TestPackServingKind(t *testing.T) {
	t.Parallel()
	model := shared.Path(t, "tiny1m-hf")
	art := filepath.Join(t.TempDir(), "t.lmpk")
	wantOK(t, lmpack(t, nil, "pack", model, "-o", art, "--kv-cache", "turboquant_3bit_nc-all"))
	data := shared.Path(t, "tinystories-valid", "heldout.txt")
	r := lmpack(t, nil, "eval", art, "--data", data, "--ctx", "256", "--max-windows", "1")
	wantOK(t, r)
	if !strings.Contains(r.stderr, "kv_cache=turboquant_3bit_nc-all") {
		t.Fatalf("eval of the artifact does not name its KV cache:\n%v", r)
	}
	ref := lmpack(t, nil, "eval", model, "--data", data, "--ctx", "256", "--max-windows", "1")
	wantOK(t, ref)
	ppl := func(out string) float64 {
		f := strings.Fields(out)
		if len(f) < 2 || f[0] != "perplexity" {
			t.Fatalf("eval output %q", out)
		}
		p, err := strconv.ParseFloat(f[1], 64)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	// A 3-bit cache loses some perplexity, not all of it (tiny1m: ≈3.8).
	if a, c := ppl(r.stdout), ppl(ref.stdout); !(a > c && a < 2*c) {
		t.Errorf("artifact perplexity %v, checkpoint %v: want above it and below twice it", a, c)
	}
	t.Logf("artifact: %s checkpoint: %s", strings.TrimSpace(r.stdout), strings.TrimSpace(ref.stdout))
}
