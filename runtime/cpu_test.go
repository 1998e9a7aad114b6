package runtime

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/internal/shared"
)

type logitsRef struct {
	Tokens []int       `json:"tokens"`
	Logits [][]float64 `json:"logits"`
}

func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// TestStories260KLogits checks the runtime against llama2.c's fp32 logits
// for BOS + "Once upon a time, ..." (reference/logits_once_upon_a_time.json),
// in one prefill and token by token, on 1 and 2 threads.
func TestStories260KLogits(t *testing.T) {
	var ref logitsRef
	readJSON(t, shared.Path(t, "stories260K-hf", "reference", "logits_once_upon_a_time.json"), &ref)
	if len(ref.Tokens) != 16 || len(ref.Logits) != 16 {
		t.Fatalf("reference: %d tokens, %d logit rows", len(ref.Tokens), len(ref.Logits))
	}
	want := flatten(ref.Logits)
	for _, threads := range []int{1, 2} {
		m, _ := loadDir(t, shared.Path(t, "stories260K-hf"), threads)
		if d := maxAbsDiff(forwardAll(t, m, ref.Tokens), want); d > 1e-4 {
			t.Errorf("threads %d prefill: max abs diff %.3g > 1e-4", threads, d)
		}
		if d := maxAbsDiff(forwardSteps(t, m, ref.Tokens, 1), want); d > 1e-4 {
			t.Errorf("threads %d decode: max abs diff %.3g > 1e-4", threads, d)
		}
		if d := maxAbsDiff(forwardSteps(t, m, ref.Tokens, 5), want); d > 1e-4 {
			t.Errorf("threads %d chunks of 5: max abs diff %.3g > 1e-4", threads, d)
		}
	}
}

// TestStories260KGreedy decodes 256 tokens greedily from BOS and compares
// the ids with llama2.c's (reference/greedy_from_bos.json).
func TestStories260KGreedy(t *testing.T) {
	var ref struct {
		PromptIDs    []int `json:"prompt_ids"`
		GeneratedIDs []int `json:"generated_ids"`
	}
	readJSON(t, shared.Path(t, "stories260K-hf", "reference", "greedy_from_bos.json"), &ref)
	m, d := loadDir(t, shared.Path(t, "stories260K-hf"), 0)
	c := m.NewCache(len(ref.PromptIDs) + len(ref.GeneratedIDs))
	logits := make([]float32, d.VocabSize)
	if err := m.Forward(context.Background(), ref.PromptIDs, c, logits, false); err != nil {
		t.Fatal(err)
	}
	var got []int
	for i := range ref.GeneratedIDs {
		next := Argmax(logits)
		got = append(got, next)
		if next != ref.GeneratedIDs[i] {
			t.Fatalf("token %d: got %d, want %d (so far %v)", i, next, ref.GeneratedIDs[i], got)
		}
		if err := m.Forward(context.Background(), []int{next}, c, logits, false); err != nil {
			t.Fatal(err)
		}
	}
	if len(got) != 256 {
		t.Fatalf("generated %d tokens", len(got))
	}
}

type routeRecorder struct{ sel [][][]int32 }

func (r *routeRecorder) RouterLogits(layer, pos, n int, logits []float32, selected []int32) {
	k := len(selected) / n
	for t := 0; t < n; t++ {
		r.sel[layer] = append(r.sel[layer], append([]int32(nil), selected[t*k:(t+1)*k]...))
	}
}

// TestStories260KMoE: the upcycled Mixtral's logits equal dense
// stories260K's reference within 1e-4, and its top-2 experts match
// reference/routing_once_upon_a_time.json.
func TestStories260KMoE(t *testing.T) {
	var ref logitsRef
	readJSON(t, shared.Path(t, "stories260K-hf", "reference", "logits_once_upon_a_time.json"), &ref)
	var routing struct {
		Tokens  []int     `json:"tokens"`
		Routing [][][]int `json:"routing"`
	}
	readJSON(t, shared.Path(t, "stories260K-moe-hf", "reference", "routing_once_upon_a_time.json"), &routing)
	m, d := loadDir(t, shared.Path(t, "stories260K-moe-hf"), 0)
	rec := &routeRecorder{sel: make([][][]int32, len(d.Layers))}
	m.SetObserver(rec)
	if diff := maxAbsDiff(forwardAll(t, m, ref.Tokens), flatten(ref.Logits)); diff > 1e-4 {
		t.Errorf("MoE vs dense reference: max abs diff %.3g > 1e-4", diff)
	}
	m.SetObserver(nil)
	if len(routing.Routing) != len(d.Layers) {
		t.Fatalf("routing reference has %d layers", len(routing.Routing))
	}
	for l := range routing.Routing {
		for tk, want := range routing.Routing[l] {
			got := rec.sel[l][tk]
			if int(got[0]) != want[0] || int(got[1]) != want[1] {
				t.Errorf("layer %d token %d: experts %v, want %v", l, tk, got, want)
			}
		}
	}
	if diff := maxAbsDiff(forwardSteps(t, m, ref.Tokens, 1), flatten(ref.Logits)); diff > 1e-4 {
		t.Errorf("MoE decode path: max abs diff %.3g > 1e-4", diff)
	}
}

func baseConfig(arch string) map[string]any {
	return map[string]any{
		"architectures": []string{arch}, "hidden_size": 48, "intermediate_size": 80, "num_hidden_layers": 3,
		"num_attention_heads": 6, "num_key_value_heads": 2, "vocab_size": 97, "rms_norm_eps": 1e-6,
		"max_position_embeddings": 256, "rope_theta": 10000.0, "tie_word_embeddings": false,
	}
}

func with(m map[string]any, kv ...any) map[string]any {
	for i := 0; i < len(kv); i += 2 {
		m[kv[i].(string)] = kv[i+1]
	}
	return m
}

// TestSyntheticFamilies compares the runtime with the naive float64
// forward on tiny random checkpoints of each family, in one prefill and
// token by token.
func TestSyntheticFamilies(t *testing.T) {
	cases := []struct {
		name  string
		cfg   map[string]any
		dtype safetensors.DType
	}{
		{"qwen2-biases", with(baseConfig("Qwen2ForCausalLM"), "tie_word_embeddings", true), safetensors.F32},
		{"qwen3-qknorm", with(baseConfig("Qwen3ForCausalLM"), "head_dim", 16), safetensors.F32},
		{"qwen2moe-shared", with(baseConfig("Qwen2MoeForCausalLM"), "num_experts", 6, "num_experts_per_tok", 2,
			"moe_intermediate_size", 24, "shared_expert_intermediate_size", 40, "decoder_sparse_step", 1, "mlp_only_layers", []int{1}), safetensors.F32},
		{"qwen3moe", with(baseConfig("Qwen3MoeForCausalLM"), "head_dim", 8, "num_experts", 8, "num_experts_per_tok", 3,
			"moe_intermediate_size", 16, "norm_topk_prob", true), safetensors.F32},
		{"mixtral-bf16", with(baseConfig("MixtralForCausalLM"), "num_local_experts", 4, "num_experts_per_tok", 2), safetensors.BF16},
		{"mistral-window", with(baseConfig("MistralForCausalLM"), "sliding_window", 5), safetensors.F16},
		{"llama3-rope", with(baseConfig("LlamaForCausalLM"), "rope_scaling", map[string]any{"rope_type": "llama3", "factor": 8.0,
			"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 16}, "attention_bias", true), safetensors.F32},
		{"llama-linear", with(baseConfig("LlamaForCausalLM"), "rope_scaling", map[string]any{"type": "linear", "factor": 4.0}), safetensors.F32},
	}
	tokens := []int{1, 5, 90, 33, 33, 7, 64, 2, 0, 96, 12, 45, 45, 45, 3, 80, 11, 19, 23, 29}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir, d, w := synthCheckpoint(t, c.cfg, uint64(100+i), c.dtype)
			ref, _ := refForward(d, w, tokens)
			want := flatten(ref)
			var scale float64
			for _, v := range want {
				scale = math.Max(scale, math.Abs(v))
			}
			tol := 2e-5 * math.Max(1, scale)
			for _, threads := range []int{1, 2} {
				m, _ := loadDir(t, dir, threads)
				if diff := maxAbsDiff(forwardAll(t, m, tokens), want); diff > tol {
					t.Errorf("threads %d prefill: max abs diff %.3g > %.3g", threads, diff, tol)
				}
				if diff := maxAbsDiff(forwardSteps(t, m, tokens, 1), want); diff > tol {
					t.Errorf("threads %d decode: max abs diff %.3g > %.3g", threads, diff, tol)
				}
				if diff := maxAbsDiff(forwardSteps(t, m, tokens, 7), want); diff > tol {
					t.Errorf("threads %d chunks: max abs diff %.3g > %.3g", threads, diff, tol)
				}
			}
		})
	}
}

// TestBadWeights: NaN and Inf values, a missing tensor and a wrong shape
// each fail Load with an error naming the tensor, by default and with
// ConvertPerBlock.
func TestBadWeights(t *testing.T) {
	dir, _, _ := synthCheckpoint(t, baseConfig("LlamaForCausalLM"), 1, safetensors.F32)
	ck, err := safetensors.OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var ws []safetensors.WriteTensor
	for _, n := range ck.Names() {
		tt, _ := ck.Tensor(n)
		v, _ := tt.Float32()
		ws = append(ws, safetensors.FromFloat32(n, tt.Shape, v))
	}
	ck.Close()
	rewrite := func(t *testing.T, edit func([]safetensors.WriteTensor) []safetensors.WriteTensor) string {
		d2 := t.TempDir()
		raw, _ := os.ReadFile(filepath.Join(dir, "config.json"))
		os.WriteFile(filepath.Join(d2, "config.json"), raw, 0o644)
		cp := make([]safetensors.WriteTensor, len(ws))
		copy(cp, ws)
		if err := safetensors.WriteFile(filepath.Join(d2, "model.safetensors"), edit(cp), nil); err != nil {
			t.Fatal(err)
		}
		return d2
	}
	const target = "model.layers.1.mlp.up_proj.weight"
	find := func(ws []safetensors.WriteTensor) int {
		for i, w := range ws {
			if w.Name == target {
				return i
			}
		}
		t.Fatalf("no %s", target)
		return -1
	}
	cases := []struct {
		name string
		edit func([]safetensors.WriteTensor) []safetensors.WriteTensor
		want []string
	}{
		{"nan", func(ws []safetensors.WriteTensor) []safetensors.WriteTensor {
			i := find(ws)
			v := make([]float32, 80*48)
			v[17] = float32(math.NaN())
			ws[i] = safetensors.FromFloat32(target, []int{80, 48}, v)
			return ws
		}, []string{target, "element 17 is NaN", "at load"}},
		{"inf", func(ws []safetensors.WriteTensor) []safetensors.WriteTensor {
			i := find(ws)
			v := make([]float32, 80*48)
			v[3] = float32(math.Inf(-1))
			ws[i] = safetensors.FromFloat32(target, []int{80, 48}, v)
			return ws
		}, []string{target, "element 3 is Inf"}},
		{"missing", func(ws []safetensors.WriteTensor) []safetensors.WriteTensor {
			i := find(ws)
			return append(ws[:i], ws[i+1:]...)
		}, []string{target}},
		{"int8", func(ws []safetensors.WriteTensor) []safetensors.WriteTensor {
			i := find(ws)
			ws[i] = safetensors.WriteTensor{Name: target, DType: safetensors.I8, Shape: []int{80, 48}, Data: make([]byte, 80*48)}
			return ws
		}, []string{target, "dtype I8, want a float dtype"}},
		{"shape", func(ws []safetensors.WriteTensor) []safetensors.WriteTensor {
			i := find(ws)
			ws[i] = safetensors.FromFloat32(target, []int{48, 80}, make([]float32, 80*48))
			return ws
		}, []string{target, "[48 80]", "want [80 48]"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d2 := rewrite(t, c.edit)
			ck, err := safetensors.OpenDir(d2)
			if err != nil {
				t.Fatal(err)
			}
			defer ck.Close()
			dd, _ := loadDescription(d2)
			for _, per := range []bool{false, true} {
				_, err = NewCPU().Load(context.Background(), dd, ck, LoadOptions{Threads: 1, ConvertPerBlock: per})
				if err == nil || !errors.Is(err, ErrBadWeights) {
					t.Fatalf("ConvertPerBlock %v: want ErrBadWeights, got %v", per, err)
				}
				for _, s := range c.want {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("ConvertPerBlock %v: error %q does not mention %q", per, err, s)
					}
				}
			}
		})
	}
}

// TestForwardErrors: bad calls return errors, never panic.
func TestForwardErrors(t *testing.T) {
	m, d := loadDir(t, shared.Path(t, "stories260K-hf"), 1)
	logits := make([]float32, d.VocabSize)
	c := m.NewCache(4)
	ctx := context.Background()
	if err := m.Forward(ctx, nil, c, logits, false); err == nil {
		t.Error("empty tokens: no error")
	}
	if err := m.Forward(ctx, []int{512}, c, logits, false); err == nil || !strings.Contains(err.Error(), "out of range") {
		t.Errorf("token 512: %v", err)
	}
	if err := m.Forward(ctx, []int{1, 2, 3, 4, 5}, c, logits, false); err == nil || !strings.Contains(err.Error(), "capacity") {
		t.Errorf("over capacity: %v", err)
	}
	if err := m.Forward(ctx, []int{1, 2}, c, logits, true); err == nil || !strings.Contains(err.Error(), "logits") {
		t.Errorf("short logits: %v", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := m.Forward(cctx, []int{1}, c, logits, false); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}
	if c.Len() != 0 {
		t.Errorf("cache length %d after failed calls, want 0", c.Len())
	}
}

// TestDecodeAllocs: a steady-state decode step allocates nothing.
func TestDecodeAllocs(t *testing.T) {
	for _, name := range []string{"stories260K-hf", "stories260K-moe-hf"} {
		m, d := loadDir(t, shared.Path(t, name), 2)
		c := m.NewCache(200)
		logits := make([]float32, d.VocabSize)
		ctx := context.Background()
		if err := m.Forward(ctx, []int{1, 403, 407}, c, logits, false); err != nil {
			t.Fatal(err)
		}
		tok := []int{261}
		allocs := testing.AllocsPerRun(50, func() {
			if err := m.Forward(ctx, tok, c, logits, false); err != nil {
				t.Fatal(err)
			}
		})
		if allocs != 0 {
			t.Errorf("%s: %.1f allocations per decode step, want 0", name, allocs)
		}
	}
}

func TestInvFreqMatchesReference(t *testing.T) {
	for _, c := range []map[string]any{
		with(baseConfig("LlamaForCausalLM"), "rope_scaling", map[string]any{"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
		with(baseConfig("LlamaForCausalLM"), "rope_scaling", map[string]any{"type": "linear", "factor": 2.0}),
	} {
		raw, _ := json.Marshal(c)
		d, err := loadDescriptionBytes(raw)
		if err != nil {
			t.Fatal(err)
		}
		a, b := InvFreq(d.RoPE, 64), InvFreqRef(d.RoPE, 64)
		for i := range a {
			if math.Abs(a[i]-b[i]) > 1e-15*math.Max(1, b[i]) {
				t.Fatalf("inv_freq[%d] %g vs %g", i, a[i], b[i])
			}
		}
		if a[0] != 1/ifElse(d.RoPE.Scaling.Type == "linear", 2.0, 1.0) {
			t.Fatalf("inv_freq[0] = %g", a[0])
		}
	}
}

func ifElse(c bool, a, b float64) float64 {
	if c {
		return a
	}
	return b
}

// TestLongPrefillMatchesDecode: a prefill longer than the attention query
// block (attnBlock) gives the logits of token-by-token decoding, for full
// causal attention and for a sliding window.
func TestLongPrefillMatchesDecode(t *testing.T) {
	toks := make([]int, 3*attnBlock+17)
	for i := range toks {
		toks[i] = (i*37 + 11) % 97
	}
	dirs := map[string]string{}
	dirs["mistral-window"], _, _ = synthCheckpoint(t, with(baseConfig("MistralForCausalLM"), "sliding_window", 70), 5, safetensors.F32)
	dirs["llama"], _, _ = synthCheckpoint(t, baseConfig("LlamaForCausalLM"), 6, safetensors.F32)
	for name, dir := range dirs {
		m, _ := loadDir(t, dir, 2)
		a := forwardAll(t, m, toks)
		b := forwardSteps(t, m, toks, 1)
		var diff float64
		for i := range a {
			diff = math.Max(diff, math.Abs(float64(a[i]-b[i])))
		}
		if diff > 1e-4 {
			t.Errorf("%s: prefill vs decode max abs diff %.3g", name, diff)
		}
	}
}
