package compress

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/internal/shared"
)

const goodRecipe = `name: t
calibrate:
  data: calib.txt
  tokens: 1024
  ctx: 256
quantize:
  kv:
    cache: oscar2
pack:
  lz4: true
eval:
  data: heldout.txt
  ctx: 256
  max_windows: 2
  max_delta_ppl_pct: 100
`

// TestRecipeUnknownKey: an unknown key anywhere is ErrRecipe naming the
// key, its line and its section.
func TestRecipeUnknownKey(t *testing.T) {
	for _, c := range []struct {
		name, from, to, want string
	}{
		{"top", "name: t\n", "name: t\nstages: 3\n", `line 2: unknown key "stages" in the top level`},
		{"calibrate", "  tokens: 1024\n", "  tokenz: 1024\n", `line 4: unknown key "tokenz" in calibrate`},
		{"kv", "    cache: oscar2\n", "    cache: oscar2\n    bits: 2\n", `line 9: unknown key "bits" in quantize.kv`},
		{"eval", "  max_windows: 2\n", "  max_window: 2\n", `line 14: unknown key "max_window" in eval`},
	} {
		t.Run(c.name, func(t *testing.T) {
			src := strings.Replace(goodRecipe, c.from, c.to, 1)
			_, err := ParseRecipe("r.yaml", []byte(src))
			if !errors.Is(err, ErrRecipe) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "r.yaml") {
				t.Fatalf("got %v, want ErrRecipe containing %q", err, c.want)
			}
		})
	}
}

// TestRecipeValues: invalid values and the unavailable weights stage are
// refused naming the field; defaults are filled in.
func TestRecipeValues(t *testing.T) {
	r, err := ParseRecipe("r.yaml", []byte(goodRecipe))
	if err != nil {
		t.Fatal(err)
	}
	if kv := r.Quantize.KV; kv.ClipK != 0.96 || kv.ClipV != 0.92 || !*r.Pack.LZ4 || r.Eval.MaxDeltaPPLPct != 100 {
		t.Errorf("defaults: kv %+v lz4 %v eval %+v", *kv, *r.Pack.LZ4, *r.Eval)
	}
	for _, c := range []struct {
		name, from, to, want string
		is                   error
	}{
		{"tokens", "tokens: 1024", "tokens: 0", "line 4: calibrate.tokens 0", ErrRecipe},
		{"ctx", "  ctx: 256\nquantize", "  ctx: 1\nquantize", "calibrate.ctx 1", ErrRecipe},
		{"expert memory", "  ctx: 256\nquantize", "  ctx: 256\n  max_expert_memory: -1\nquantize", "calibrate.max_expert_memory -1", ErrRecipe},
		{"cache", "cache: oscar2", "cache: oscar9", `quantize.kv.cache "oscar9"`, ErrRecipe},
		{"clip", "cache: oscar2", "cache: oscar2\n    clip_k: 1.5", "clip_k 1.5", ErrRecipe},
		{"clip without rotation", "cache: oscar2", "cache: kivi2\n    clip_k: 0.9", "takes no rotations", ErrRecipe},
		{"clip search without rotation", "cache: oscar2", "cache: int4\n    clip_search: true", "cache int4 takes no rotations", ErrRecipe},
		{"kv_bits without rotation", "cache: oscar2", "cache: kivi2\n    kv_bits: 3", "cache kivi2 takes no rotations", ErrRecipe},
		{"kv_bits with oscar2", "cache: oscar2", "cache: oscar2\n    kv_bits: 3", "quantize.kv.kv_bits 3: per-layer widths are the oscar-mixed cache's", ErrRecipe},
		{"oscar-mixed without kv_bits", "cache: oscar2", "cache: oscar-mixed", "quantize.kv.cache oscar-mixed needs quantize.kv.kv_bits", ErrRecipe},
		{"kv_bits range", "cache: oscar2", "cache: oscar-mixed\n    kv_bits: 1", "quantize.kv.kv_bits 1: want 0 (uniform widths) or average bits per element in [2, 16]", ErrRecipe},
		{"clip_k4 range", "cache: oscar2", "cache: oscar4\n    clip_k4: 2", "quantize.kv.clip_k4 2", ErrRecipe},
		{"serving_ctx below windows", "cache: oscar2", "cache: oscar-mixed\n    kv_bits: 3\n    sink: 16\n    recent: 64\n    serving_ctx: 64", "quantize.kv.serving_ctx 64: want a context above the fp16 windows' quantize.kv.sink 16 + quantize.kv.recent 64 = 80 tokens (the context at which quantize.kv.kv_bits counts bits per element)", ErrRecipe},
		{"recent beyond the default serving_ctx", "cache: oscar2", "cache: oscar-mixed\n    kv_bits: 3\n    sink: 16\n    recent: 40000", "quantize.kv.recent 40000: want a window below 32752 tokens: the default serving context 32768 (no quantize.kv.serving_ctx), at which quantize.kv.kv_bits counts bits per element, less quantize.kv.sink 16 (or give a longer quantize.kv.serving_ctx)", ErrRecipe},
		{"sink beyond the default serving_ctx", "cache: oscar2", "cache: oscar-mixed\n    kv_bits: 3\n    sink: 40000\n    recent: 16", "quantize.kv.sink 40000: want a window below the default serving context 32768", ErrRecipe},
		{"serving_ctx without kv_bits", "cache: oscar2", "cache: oscar2\n    serving_ctx: 4096", "quantize.kv.serving_ctx 4096: the context at which kv_bits counts", ErrRecipe},
		{"search_tokens without a search", "cache: oscar2", "cache: oscar2\n    search_tokens: 512", "quantize.kv.search_tokens 512: the calibration tokens of the clip_search / kv_bits measurement", ErrRecipe},
		{"search_tokens negative", "cache: oscar2", "cache: oscar2\n    clip_search: true\n    search_tokens: -1", "quantize.kv.search_tokens -1", ErrRecipe},
		{"no calibrate", "calibrate:\n  data: calib.txt\n  tokens: 1024\n  ctx: 256\n", "", "needs a calibrate section", ErrRecipe},
		{"prune both", "quantize:", "prune:\n  layers: 1\n  layer_ratio: 0.2\nquantize:", "prune.layers 1: want exactly one of prune.layers and prune.layer_ratio", ErrRecipe},
		{"prune method", "quantize:", "prune:\n  layers: 1\n  method: random\nquantize:", `prune.method "random"`, ErrRecipe},
		{"eval ctx", "  ctx: 256\n  max_windows", "  ctx: 1\n  max_windows", "eval.ctx 1: want >= 2", ErrRecipe},
		{"gate", "max_delta_ppl_pct: 100", "max_delta_ppl_pct: -1", "max_delta_ppl_pct -1", ErrRecipe},
		{"old absolute gate", "max_delta_ppl_pct: 100", "max_delta_ppl: 12", "line 15: eval.max_delta_ppl 12: removed, gates are relative to the source model now: give max_delta_ppl_pct", ErrRecipe},
		{"weights method", "quantize:\n", "quantize:\n  weights:\n    bits: 4\n", `quantize.weights.method ""`, ErrRecipe},
		{"weights bits", "quantize:\n", "quantize:\n  weights:\n    method: rtn\n    bits: 5\n", "quantize.weights.bits 5", ErrRecipe},
		{"weights bits and bpw", "quantize:\n", "quantize:\n  weights:\n    method: rtn\n    bits: 4\n    target_bpw: 3\n", "want exactly one of quantize.weights.bits and quantize.weights.target_bpw", ErrRecipe},
		{"weights neither", "quantize:\n", "quantize:\n  weights:\n    method: gptq\n", "want exactly one of quantize.weights.bits and quantize.weights.target_bpw", ErrRecipe},
		{"moe budget without bits", "quantize:\n", "quantize:\n  weights:\n    method: gptq\n    moe_budget: 2.5\n", "quantize.weights.bits 0: want 2, 3, 4 or 8 with quantize.weights.moe_budget: the width of the non-expert weights", ErrRecipe},
		{"weights group", "quantize:\n", "quantize:\n  weights:\n    method: rtn\n    bits: 4\n    group: 48\n", "quantize.weights.group 48", ErrRecipe},
		{"weights group with bpw", "quantize:\n", "quantize:\n  weights:\n    method: gptq\n    target_bpw: 3.5\n    group: 32\n", "remove group", ErrRecipe},
		{"weights act_order rtn", "quantize:\n", "quantize:\n  weights:\n    method: rtn\n    bits: 4\n    act_order: true\n", "quantize.weights.act_order: want quantize.weights.method gptq", ErrRecipe},
		{"weights unknown key", "quantize:\n", "quantize:\n  weights:\n    method: rtn\n    bits: 4\n    group_size: 32\n", `line 10: unknown key "group_size" in quantize.weights`, ErrRecipe},
		{"weights no calibrate", "calibrate:\n  data: calib.txt\n  tokens: 1024\n  ctx: 256\nquantize:\n  kv:\n    cache: oscar2\n", "quantize:\n  weights: {method: rtn, bits: 4}\n", "quantize.weights needs a calibrate section", ErrRecipe},
		{"moe budget negative", "quantize:\n", "quantize:\n  weights:\n    method: gptq\n    bits: 4\n    moe_budget: -1\n", "quantize.weights.moe_budget -1", ErrRecipe},
		{"moe budget with bpw", "quantize:\n", "quantize:\n  weights:\n    method: gptq\n    target_bpw: 3\n    moe_budget: 2.5\n", "quantize.weights.moe_budget 2.5: want quantize.weights.bits for the non-expert weights, not quantize.weights.target_bpw", ErrRecipe},
		{"moe weighting alone", "quantize:\n", "quantize:\n  weights:\n    method: gptq\n    bits: 4\n    moe_weighting: kl\n", "quantize.weights.moe_weighting \"kl\": want quantize.weights.moe_budget", ErrRecipe},
		{"moe weighting", "quantize:\n", "quantize:\n  weights:\n    method: gptq\n    bits: 4\n    moe_budget: 2\n    moe_weighting: grad\n", `moe_weighting "grad"`, ErrRecipe},
		{"ffn ratio 1", "quantize:", "prune:\n  ffn_ratio: 1\nquantize:", "prune.ffn_ratio 1: want in (0, 1)", ErrRecipe},
		{"sparsity 1", "quantize:", "prune:\n  sparsity: 1\nquantize:", "prune.sparsity 1: want in (0, 1)", ErrRecipe},
		{"sparsity with ffn ratio", "quantize:", "prune:\n  sparsity: 0.2\n  ffn_ratio: 0.1\nquantize:", "prune.sparsity 0.2: want no prune.head_groups, prune.head_ratio or prune.ffn_ratio with it", ErrRecipe},
		{"head step alone", "quantize:", "prune:\n  ffn_ratio: 0.2\n  head_step: 2\nquantize:", "line 8: prune.head_step 2: want prune.head_groups, prune.head_ratio or prune.sparsity", ErrRecipe},
		{"head refit alone", "quantize:", "prune:\n  ffn_ratio: 0.2\n  head_refit: true\nquantize:", "line 8: prune.head_refit: want prune.head_groups, prune.head_ratio or prune.sparsity", ErrRecipe},
		{"head refit with layers", "quantize:", "prune:\n  layers: 1\n  head_refit: true\nquantize:", "prune.head_refit: want prune.head_groups", ErrRecipe},
		{"head step with layers", "quantize:", "prune:\n  layers: 1\n  head_step: 3\nquantize:", "prune.head_step 3: want prune.head_groups", ErrRecipe},
		{"refit with layers", "quantize:", "prune:\n  layers: 1\n  refit: false\nquantize:", "prune.refit needs", ErrRecipe},
		{"head method with layers", "quantize:", "prune:\n  layers: 1\n  head_method: proxy\nquantize:", `prune.head_method "proxy": want prune.head_groups`, ErrRecipe},
		{"expert memory fraction", "  ctx: 256\nquantize", "  ctx: 256\n  max_expert_memory: 1.5\nquantize", "calibrate.max_expert_memory \"1.5\": want an integer", ErrRecipe},
		{"expert memory string", "  ctx: 256\nquantize", "  ctx: 256\n  max_expert_memory: abc\nquantize", "line 6: calibrate.max_expert_memory \"abc\": want an integer", ErrRecipe},
		{"head refit string", "quantize:", "prune:\n  head_groups: 2\n  head_refit: maybe\nquantize:", "prune.head_refit \"maybe\": want true or false", ErrRecipe},
		{"yes for a boolean", "lz4: true", "lz4: yes", "line 10: pack.lz4 \"yes\": want true or false", ErrRecipe},
		{"list for a scalar", "tokens: 1024", "tokens: [1024]", "line 4: calibrate.tokens: want a single value, not a list", ErrRecipe},
		{"section for a scalar", "tokens: 1024", "tokens:\n    n: 1024", "calibrate.tokens: want a single value, not a section", ErrRecipe},
		{"scalar for a section", "pack:\n  lz4: true\n", "pack: 3\n", "line 9: pack: want a section of keys, not \"3\"", ErrRecipe},
		{"empty section", "quantize:\n", "quantize:\n  weights:\n", "quantize.weights is empty", ErrRecipe},
		{"explicit zero layers", "quantize:", "prune:\n  layers: 0\nquantize:", "prune.layers 0: want > 0, or leave the key out", ErrRecipe},
		{"explicit zero head_step", "quantize:", "prune:\n  head_groups: 2\n  head_step: 0\nquantize:", "prune.head_step 0: want > 0", ErrRecipe},
		{"head step fraction", "quantize:", "prune:\n  head_ratio: 0.2\n  head_step: 1.5\nquantize:", "head_step", ErrRecipe},
		{"ffn ratio negative", "quantize:", "prune:\n  ffn_ratio: -0.1\nquantize:", "prune.ffn_ratio -0.1", ErrRecipe},
		{"head method", "quantize:", "prune:\n  head_ratio: 0.2\n  head_method: foo\nquantize:", `prune.head_method "foo": want putri or proxy`, ErrRecipe},
		{"head method alone", "quantize:", "prune:\n  ffn_ratio: 0.2\n  head_method: proxy\nquantize:", `prune.head_method "proxy": want prune.head_groups, prune.head_ratio or prune.sparsity`, ErrRecipe},
		{"head groups and ratio", "quantize:", "prune:\n  head_groups: 2\n  head_ratio: 0.2\nquantize:", "prune.head_groups 2: want at most one of prune.head_groups and prune.head_ratio", ErrRecipe},
		{"head groups negative", "quantize:", "prune:\n  head_groups: -2\nquantize:", "prune.head_groups -2", ErrRecipe},
		{"head ratio 1", "quantize:", "prune:\n  head_ratio: 1\nquantize:", "prune.head_ratio 1: want in (0, 1)", ErrRecipe},
		{"refit alone", "quantize:", "prune:\n  head_groups: 2\n  refit: false\nquantize:", "prune.refit needs ffn_ratio", ErrRecipe},
		{"prune empty", "quantize:", "prune:\n  method: lorp\nquantize:", `line 7: prune.method "lorp": want prune.layers or prune.layer_ratio with it`, ErrRecipe},
		{"prune nothing", "quantize:", "prune: {}\nquantize:", "prune.layers: want something to prune", ErrRecipe},
		{"width no calibrate", "calibrate:\n  data: calib.txt\n  tokens: 1024\n  ctx: 256\nquantize:\n  kv:\n    cache: oscar2\n", "prune:\n  ffn_ratio: 0.25\n", "width pruning (head_groups, head_ratio, ffn_ratio) needs a calibrate section", ErrRecipe},
		{"width unknown key", "quantize:", "prune:\n  ffn_ratio: 0.25\n  ffn_method: putri\nquantize:", `line 8: unknown key "ffn_method" in prune`, ErrRecipe},
		// Keys every CLI flag has (true_sequential, moe_solver, moe_group,
		// moe_min_tokens, all_experts, min_expert_tokens) reach the
		// stage's validator, which words its errors in the recipe's keys.
		{"true_sequential rtn", "quantize:\n", "quantize:\n  weights:\n    method: rtn\n    bits: 4\n    true_sequential: true\n", "line 10: quantize.weights.true_sequential: want quantize.weights.method gptq", ErrRecipe},
		{"moe_solver", "quantize:\n", "quantize:\n  weights:\n    method: gptq\n    bits: 4\n    moe_budget: 2.5\n    moe_solver: ilp\n", `line 11: quantize.weights.moe_solver "ilp": want dp or lagrangian`, ErrRecipe},
		{"moe_group alone", "quantize:\n", "quantize:\n  weights:\n    method: gptq\n    bits: 4\n    moe_group: 32\n", "quantize.weights.moe_group 32: want quantize.weights.moe_budget", ErrRecipe},
		{"moe_min_tokens", "quantize:\n", "quantize:\n  weights:\n    method: gptq\n    bits: 4\n    moe_budget: 2.5\n    moe_min_tokens: -1\n", "quantize.weights.moe_min_tokens -1: want >= 0", ErrRecipe},
		{"min_expert_tokens", "  ctx: 256\nquantize", "  ctx: 256\n  min_expert_tokens: -3\nquantize", "line 6: calibrate.min_expert_tokens -3: want >= 0", ErrRecipe},
		{"two documents", "name: t\n", "name: t\n---\nname: u\n", "more than one YAML document", ErrRecipe},
		{"syntax", "name: t\n", "name: [t\n", "r.yaml", ErrRecipe},
	} {
		t.Run(c.name, func(t *testing.T) {
			src := strings.Replace(goodRecipe, c.from, c.to, 1)
			if src == goodRecipe {
				t.Fatalf("edit %q not applied", c.from)
			}
			_, err := ParseRecipe("r.yaml", []byte(src))
			if !errors.Is(err, c.is) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want %v containing %q", err, c.is, c.want)
			}
		})
	}
	if _, err := ParseRecipe("r.yaml", nil); !errors.Is(err, ErrRecipe) || !strings.Contains(err.Error(), "empty recipe") {
		t.Errorf("empty recipe: %v", err)
	}
}

// TestRecipeKVKeys: quantize.kv's clip search and mixed-width keys parse
// into oscar.KVOptions with the section's windows.
func TestRecipeKVKeys(t *testing.T) {
	src := strings.Replace(goodRecipe, "    cache: oscar2\n", "    cache: oscar-mixed\n    kv_bits: 3.5\n    clip_search: true\n    serving_ctx: 4096\n    search_tokens: 512\n    clip_k4: 0.99\n    clip_v8: 0.98\n    sink: 4\n    recent: 16\n", 1)
	r, err := ParseRecipe("r.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	o := r.Quantize.KV.options()
	if o.KVBits != 3.5 || !o.ClipSearch || o.ServingCtx != 4096 || o.SearchTokens != 512 || o.ClipK4 != 0.99 || o.ClipV8 != 0.98 ||
		o.Sink != 4 || o.Recent != 16 || o.ClipK != 0.96 || o.ClipV != 0.92 {
		t.Errorf("kv options %+v", o)
	}
}

// TestRecipeNewKeys: the keys added for the CLI flags that had none parse
// into their stage's options.
func TestRecipeNewKeys(t *testing.T) {
	src := strings.Replace(goodRecipe, "  ctx: 256\nquantize:\n", "  ctx: 256\n  all_experts: true\n  min_expert_tokens: 4\nquantize:\n  weights:\n    method: gptq\n    bits: 4\n    true_sequential: true\n    moe_budget: 2.5\n    moe_solver: lagrangian\n    moe_group: 32\n    moe_min_tokens: 8\n", 1)
	r, err := ParseRecipe("r.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	c, w := r.Calibrate.options("d", "o"), r.Quantize.Weights.options()
	if !c.AllExperts || c.MinExpertTokens != 4 || !w.TrueSequential || w.MoESolver != "lagrangian" || w.MoEGroup != 32 || w.MoEMinTokens != 8 {
		t.Errorf("calibrate %+v\nweights %+v", c, w)
	}
}

// TestExampleRecipes: the repository's recipes load with their stages in
// order. Data paths resolve against the recipe's directory.
func TestExampleRecipes(t *testing.T) {
	for _, c := range []struct {
		file   string
		stages []string
		is     error
	}{
		{"kv-int2.yaml", []string{"calibrate", "quantize-kv", "pack", "eval"}, nil},
		{"prune-kv-int2.yaml", []string{"calibrate", "prune-layers", "quantize-kv", "pack", "eval"}, nil},
		{"w4-kv-int2.yaml", []string{"calibrate", "quantize-weights", "quantize-kv", "pack", "eval"}, nil},
		{"moe-mixed.yaml", []string{"calibrate", "quantize-weights", "pack", "eval"}, nil},
		{"prune-width-w4-kv-int2.yaml", []string{"calibrate", "prune-width", "quantize-weights", "quantize-kv", "pack", "eval"}, nil},
	} {
		path := filepath.Join("..", "recipes", c.file)
		r, err := LoadRecipe(path)
		if c.is != nil {
			if !errors.Is(err, c.is) || !strings.Contains(err.Error(), "quantize.weights.moe_budget") {
				t.Errorf("%s: got %v, want %v", c.file, err, c.is)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.file, err)
			continue
		}
		p := &pipeline{r: r}
		var names []string
		for _, s := range p.stages() {
			names = append(names, s.name)
		}
		if strings.Join(names, ",") != strings.Join(c.stages, ",") {
			t.Errorf("%s: stages %v, want %v", c.file, names, c.stages)
		}
		if want := filepath.Join("..", "recipes", "../../shared/data/tinystories-valid/calib.txt"); r.Calibrate.Data != want {
			t.Errorf("%s: calibrate.data %q, want %q", c.file, r.Calibrate.Data, want)
		}
	}
}

// FuzzParseRecipe: arbitrary bytes never panic, and a recipe that parses
// is valid and re-parses from its canonical sections.
func FuzzParseRecipe(f *testing.F) {
	f.Add([]byte(goodRecipe))
	f.Add([]byte("prune:\n  method: list:1\n"))
	f.Add([]byte("quantize:\n  weights: {bits: 4}\n"))
	f.Add([]byte("calibrate: {data: c, tokens: 8, ctx: 4}\nquantize:\n  weights: {method: gptq, target_bpw: 3.5}\n"))
	f.Add([]byte("{}"))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := ParseRecipe("fuzz.yaml", b)
		if err != nil {
			if !errors.Is(err, ErrRecipe) {
				t.Fatalf("error not ErrRecipe: %v", err)
			}
			return
		}
		if r.Pack.LZ4 == nil {
			t.Fatalf("lz4 default not set")
		}
		p := &pipeline{r: r}
		if len(p.stages()) == 0 {
			t.Fatalf("no stages")
		}
	})
}

// TestRecipeIntegers: a fraction (or any non-integer) given for an
// integer key is ErrRecipe naming the key and its line, not truncated.
func TestRecipeIntegers(t *testing.T) {
	weights := strings.Replace(goodRecipe, "quantize:\n", "quantize:\n  weights:\n    method: rtn\n    bits: 4\n    group: 32\n", 1)
	for _, c := range []struct {
		name, src, from, to, want string
	}{
		{"bits", weights, "bits: 4\n", "bits: 4.5\n", "line 9: quantize.weights.bits \"4.5\": want an integer"},
		{"group", weights, "group: 32\n", "group: 32.9\n", "line 10: quantize.weights.group \"32.9\""},
		{"tokens", goodRecipe, "tokens: 1024\n", "tokens: 2048.7\n", "line 4: calibrate.tokens \"2048.7\""},
		{"max_windows", goodRecipe, "max_windows: 2\n", "max_windows: 4.9\n", "line 14: eval.max_windows \"4.9\""},
		{"head_groups", goodRecipe, "quantize:\n", "prune:\n  head_groups: 2.5\nquantize:\n", "line 7: prune.head_groups \"2.5\": want an integer"},
		{"sink", goodRecipe, "cache: oscar2\n", "cache: oscar2\n    sink: 64.5\n", "line 9: quantize.kv.sink \"64.5\""},
	} {
		src := strings.Replace(c.src, c.from, c.to, 1)
		if src == c.src {
			t.Fatalf("%s: edit did not apply", c.name)
		}
		_, err := ParseRecipe("r.yaml", []byte(src))
		if !errors.Is(err, ErrRecipe) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "r.yaml") {
			t.Errorf("%s: got %v, want ErrRecipe containing %q", c.name, err, c.want)
		}
	}
	if _, err := ParseRecipe("r.yaml", []byte(weights)); err != nil {
		t.Errorf("integers: %v", err)
	}
}

// TestRecipeMessages: data-path errors name the recipe file and the key
// (calibrate.data, eval.data); prune errors use the recipe's keys and
// report a duplicate list index as a duplicate.
func TestRecipeMessages(t *testing.T) {
	model := shared.Path(t, "stories260K-hf")
	run := func(src string, data, evalData string) error {
		r, err := ParseRecipe("my.yaml", []byte(src))
		if err != nil {
			return err
		}
		dir := t.TempDir()
		_, err = Run(t.Context(), Options{Model: model, Recipe: r, RecipePath: "my.yaml", Out: filepath.Join(dir, "m.lmpk"),
			Data: data, EvalData: evalData, Threads: 1, Version: "test"})
		return err
	}
	calib, held := shared.Path(t, "tinystories-valid", "calib.txt"), shared.Path(t, "tinystories-valid", "heldout.txt")
	missing := strings.Replace(goodRecipe, "data: calib.txt", "data: /nonexist/calib.txt", 1)
	for _, c := range []struct {
		name, src, data, eval string
		want                  []string
	}{
		{"calibrate.data missing", missing, "", held, []string{"my.yaml", "calibrate.data /nonexist/calib.txt"}},
		{"eval.data missing", strings.Replace(goodRecipe, "data: heldout.txt", "data: /nonexist/held.txt", 1), calib, "", []string{"my.yaml", "eval.data /nonexist/held.txt"}},
		{"no calibrate.data", strings.Replace(goodRecipe, "  data: calib.txt\n", "", 1), "", held, []string{"my.yaml", "needs a data file", "calibrate.data"}},
		{"no eval.data", strings.Replace(goodRecipe, "  data: heldout.txt\n", "", 1), calib, "", []string{"my.yaml", "needs a data file", "eval.data"}},
		{"duplicate", strings.Replace(goodRecipe, "quantize:", "prune:\n  method: list:2,2,2,2\nquantize:", 1), calib, held, []string{"my.yaml", "listed twice", "duplicate"}},
		{"list and layers", strings.Replace(goodRecipe, "quantize:", "prune:\n  method: list:2\n  layers: 2\nquantize:", 1), calib, held, []string{"prune.layers"}},
		{"list and ratio", strings.Replace(goodRecipe, "quantize:", "prune:\n  method: list:2\n  layer_ratio: 0.5\nquantize:", 1), calib, held, []string{"my.yaml", "prune.layer_ratio"}},
	} {
		err := run(c.src, c.data, c.eval)
		if !errors.Is(err, ErrRecipe) {
			t.Errorf("%s: %v, want ErrRecipe", c.name, err)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %v, want %q in it", c.name, err, w)
			}
		}
		if strings.Contains(err.Error(), "--layer") {
			t.Errorf("%s: %v names a CLI flag", c.name, err)
		}
	}
}

// TestWidthParamsHeadRefit: head_refit is part of the prune-width stage's
// cache key, so a cached stage without the o_proj refit is not reused for
// a recipe asking for it.
func TestWidthParamsHeadRefit(t *testing.T) {
	a := PruneStage{HeadGroups: 2, HeadMethod: "proxy"}
	b := a
	b.HeadRefit = true
	if string(a.widthParams()) == string(b.widthParams()) {
		t.Fatalf("head_refit does not change the prune-width key: %s", a.widthParams())
	}
	if !strings.Contains(string(b.widthParams()), `"head_refit":true`) {
		t.Errorf("prune-width key %s lacks head_refit", b.widthParams())
	}
}
