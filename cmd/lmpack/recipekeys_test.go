package main

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/calibrate"
	"github.com/lmpack/lmpack/compress"
	"github.com/lmpack/lmpack/eval"
	"github.com/lmpack/lmpack/eval/kveval"
	"github.com/lmpack/lmpack/pack"
	"github.com/lmpack/lmpack/prune"
	"github.com/lmpack/lmpack/quantize/oscar"
	"github.com/lmpack/lmpack/quantize/wquant"
	"github.com/spf13/pflag"
)

// flagRecipeKeys maps each stage command's flag ("calibrate --tokens") to
// the compress recipe key that sets the same option. A flag missing here
// must be on cliOnlyFlags.
var flagRecipeKeys = map[string]string{
	"calibrate --data":                  "calibrate.data",
	"calibrate --tokens":                "calibrate.tokens",
	"calibrate --ctx":                   "calibrate.ctx",
	"calibrate --max-expert-memory":     "calibrate.max_expert_memory",
	"calibrate --calibrate-all-experts": "calibrate.all_experts",
	"calibrate --min-expert-tokens":     "calibrate.min_expert_tokens",

	"prune --layers":       "prune.layers",
	"prune --layer-ratio":  "prune.layer_ratio",
	"prune --layer-method": "prune.method",
	"prune --head-groups":  "prune.head_groups",
	"prune --head-ratio":   "prune.head_ratio",
	"prune --head-method":  "prune.head_method",
	"prune --head-step":    "prune.head_step",
	"prune --ffn-ratio":    "prune.ffn_ratio",
	"prune --sparsity":     "prune.sparsity",
	"prune --no-refit":     "prune.refit",
	"prune --head-refit":   "prune.head_refit",

	"quantize weights --method":          "quantize.weights.method",
	"quantize weights --bits":            "quantize.weights.bits",
	"quantize weights --group":           "quantize.weights.group",
	"quantize weights --sym":             "quantize.weights.sym",
	"quantize weights --mse-clip":        "quantize.weights.mse_clip",
	"quantize weights --act-order":       "quantize.weights.act_order",
	"quantize weights --true-sequential": "quantize.weights.true_sequential",
	"quantize weights --target-bpw":      "quantize.weights.target_bpw",
	"quantize weights --moe-budget":      "quantize.weights.moe_budget",
	"quantize weights --moe-group":       "quantize.weights.moe_group",
	"quantize weights --moe-weighting":   "quantize.weights.moe_weighting",
	"quantize weights --moe-rule":        "quantize.weights.moe_rule",
	"quantize weights --moe-solver":      "quantize.weights.moe_solver",
	"quantize weights --moe-min-tokens":  "quantize.weights.moe_min_tokens",

	"quantize kv --clip-k":         "quantize.kv.clip_k",
	"quantize kv --clip-v":         "quantize.kv.clip_v",
	"quantize kv --clip-k4":        "quantize.kv.clip_k4",
	"quantize kv --clip-v4":        "quantize.kv.clip_v4",
	"quantize kv --clip-k8":        "quantize.kv.clip_k8",
	"quantize kv --clip-v8":        "quantize.kv.clip_v8",
	"quantize kv --clip-search":    "quantize.kv.clip_search",
	"quantize kv --search-tokens":  "quantize.kv.search_tokens",
	"quantize kv --kv-bits":        "quantize.kv.kv_bits",
	"quantize kv --kv-serving-ctx": "quantize.kv.serving_ctx",
	"quantize kv --kv-window":      "quantize.kv.sink", // and quantize.kv.recent

	"pack --kv-cache":    "quantize.kv.cache",
	"pack --kv-window":   "quantize.kv.sink", // and quantize.kv.recent
	"pack --no-compress": "pack.lz4",

	"eval --data":        "eval.data",
	"eval --ctx":         "eval.ctx",
	"eval --max-windows": "eval.max_windows",
	"eval --kv-prompt":   "eval.kv_prompt",
	"eval --kv-chunk":    "eval.kv_chunk",
}

// cliOnlyFlags are the stage flags without a recipe key, each for a
// reason the README's recipe section states: process settings (--threads,
// --device, --json), files the pipeline makes itself (-o, --calib,
// --kv-rotations), quantize kv's only rotation method, and eval's side by
// side KV cache comparison (the recipe's eval stage measures the
// artifact's own cache).
var cliOnlyFlags = []string{
	"--threads", "--device", "--json", "--output",
	"prune --calib", "quantize weights --calib", "quantize kv --calib", "pack --kv-rotations",
	"quantize kv --method",
	"eval --kv", "eval --kv-rotations", "eval --kv-window", "eval --kv-layers", "eval --plot",
	"eval --kv-protocol", "eval --kv-serving-ctx",
	// --dequantize chooses the memory layout of the weights (a process
	// setting).
	"--dequantize",
}

// recipeKeys is every dotted key of compress.Recipe ("calibrate.tokens").
func recipeKeys(t reflect.Type, prefix string, out map[string]bool) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	for i := range t.NumField() {
		f := t.Field(i)
		name := strings.Split(f.Tag.Get("yaml"), ",")[0]
		if name == "" || name == "-" {
			continue
		}
		key := prefix + name
		out[key] = true
		ft := f.Type
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		if ft.Kind() == reflect.Struct {
			recipeKeys(ft, key+".", out)
		}
	}
}

// TestEveryStageFlagHasARecipeKey: every flag of calibrate, prune,
// quantize weights, quantize kv, pack and eval has a compress recipe key
// that exists (or is on the short CLI-only list), so a recipe can say
// whatever the step-by-step commands can.
func TestEveryStageFlagHasARecipeKey(t *testing.T) {
	keys := map[string]bool{}
	recipeKeys(reflect.TypeFor[compress.Recipe](), "", keys)
	for k, v := range flagRecipeKeys {
		if !keys[v] {
			t.Errorf("%s: recipe key %s does not exist", k, v)
		}
	}
	root, _ := newRoot()
	seen := 0
	for _, path := range [][]string{{"calibrate"}, {"prune"}, {"quantize", "weights"}, {"quantize", "kv"}, {"pack"}, {"eval"}} {
		cmd, _, err := root.Find(path)
		if err != nil || cmd.Name() != path[len(path)-1] {
			t.Fatalf("command %v: %v", path, err)
		}
		cmd.NonInheritedFlags().VisitAll(func(f *pflag.Flag) {
			if f.Name == "help" {
				return
			}
			seen++
			name := strings.Join(path, " ") + " --" + f.Name
			if _, ok := flagRecipeKeys[name]; ok {
				return
			}
			if !slices.Contains(cliOnlyFlags, name) && !slices.Contains(cliOnlyFlags, "--"+f.Name) {
				t.Errorf("%s has no recipe key (add one to compress.Recipe and flagRecipeKeys, or document it as CLI-only)", name)
			}
		})
	}
	if seen < len(flagRecipeKeys) {
		t.Errorf("visited %d flags, fewer than the %d with recipe keys", seen, len(flagRecipeKeys))
	}
}

// TestFlagTablesNameFields: every Go field a flag table renames exists in
// its options type (a misspelt entry would leave that field's errors in
// Go names).
func TestFlagTablesNameFields(t *testing.T) {
	for _, c := range []struct {
		table map[string]string
		typ   reflect.Type
	}{
		{calibrateFlags, reflect.TypeFor[calibrate.Options]()},
		{weightsFlags, reflect.TypeFor[wquant.Options]()},
		{kvFlags, reflect.TypeFor[oscar.KVOptions]()},
		{pruneFlags, reflect.TypeFor[prune.Options]()},
		{packFlags, reflect.TypeFor[pack.FromOptions]()},
	} {
		for f := range c.table {
			if _, ok := c.typ.FieldByName(f); !ok {
				t.Errorf("%s has no field %s", c.typ, f)
			}
		}
	}
	for f := range evalFlags {
		_, a := reflect.TypeFor[eval.PerplexityOptions]().FieldByName(f)
		_, b := reflect.TypeFor[kveval.Options]().FieldByName(f)
		if !a && !b {
			t.Errorf("evalFlags: no field %s in eval.PerplexityOptions or kveval.Options", f)
		}
	}
}
