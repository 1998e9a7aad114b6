package runtime_test

import (
	"math"
	"path/filepath"
	"slices"
	"testing"

	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/prune"
	"github.com/lmpack/lmpack/prune/depth"
	"github.com/lmpack/lmpack/runtime"
)

// TestDepthPrunedSlidingWindow: removing a layer from a sliding-window
// model keeps every other layer's attention type. The pruned checkpoint
// (prune.ApplyDepth) runs as the unpruned model with that layer skipped:
// its logits equal the float64 reference forward over the original
// weights and the kept layers (each with its original window), for
// Qwen2's max_window_layers rule, for layer_types, and for Qwen2-MoE's
// even-layer rule (where the pruned config gains layer_types).
func TestDepthPrunedSlidingWindow(t *testing.T) {
	tokens := []int{1, 5, 90, 33, 33, 7, 64, 2, 0, 96, 12, 45, 45, 45, 3, 80, 11, 19, 23, 29}
	qwen2 := runtime.With(runtime.BaseConfig("Qwen2ForCausalLM"), "num_hidden_layers", 4, "use_sliding_window", true, "sliding_window", 4)
	cases := []struct {
		name    string
		cfg     map[string]any
		remove  int
		windows []int // of the unpruned model
	}{
		// Layers 2 and 3 slide; removing 1 shifts layer 2 below
		// max_window_layers unless it is rewritten.
		{"qwen2-max_window_layers", runtime.With(cloneConfig(qwen2), "max_window_layers", 2), 1, []int{0, 0, 4, 4}},
		{"qwen2-layer_types", runtime.With(cloneConfig(qwen2), "layer_types", []string{"full_attention", "sliding_attention", "full_attention", "sliding_attention"}), 2, []int{0, 4, 0, 4}},
		{"qwen2moe-even-layers", runtime.With(runtime.BaseConfig("Qwen2MoeForCausalLM"), "num_hidden_layers", 4, "use_sliding_window", true, "sliding_window", 4,
			"max_window_layers", 4, "num_experts", 4, "num_experts_per_tok", 2, "moe_intermediate_size", 16, "shared_expert_intermediate_size", 24), 1, []int{4, 0, 4, 0}},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir, d, w := runtime.SynthCheckpoint(t, c.cfg, uint64(700+i), safetensors.F32)
			for l, want := range c.windows {
				if d.Layers[l].SlidingWindow != want {
					t.Fatalf("unpruned layer %d: window %d, want %d", l, d.Layers[l].SlidingWindow, want)
				}
			}
			ck, err := safetensors.OpenDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer ck.Close()
			plan, err := depth.ListPlan([]int{c.remove}, len(d.Layers))
			if err != nil {
				t.Fatal(err)
			}
			out := filepath.Join(t.TempDir(), "pruned")
			if _, _, err := prune.ApplyDepth(dir, ck, plan, out, ""); err != nil {
				t.Fatal(err)
			}
			// The reference: the unpruned description without the removed
			// layer, on the unpruned weights (tensor names unchanged).
			skip := *d
			skip.Layers = slices.Delete(slices.Clone(d.Layers), c.remove, c.remove+1)
			ref, _ := runtime.RefForward(&skip, w, tokens)
			want := runtime.Flatten(ref)
			var scale float64
			for _, v := range want {
				scale = math.Max(scale, math.Abs(v))
			}
			tol := 2e-5 * math.Max(1, scale)
			m, pd := runtime.LoadDir(t, out, 2)
			for l := range pd.Layers {
				if pd.Layers[l].SlidingWindow != skip.Layers[l].SlidingWindow {
					t.Errorf("pruned layer %d: window %d, want %d", l, pd.Layers[l].SlidingWindow, skip.Layers[l].SlidingWindow)
				}
			}
			if diff := runtime.MaxAbsDiff(runtime.ForwardAll(t, m, tokens), want); diff > tol {
				t.Errorf("prefill: max abs diff %.3g from the unpruned model with layer %d skipped > %.3g", diff, c.remove, tol)
			}
			if diff := runtime.MaxAbsDiff(runtime.ForwardSteps(t, m, tokens, 3), want); diff > tol {
				t.Errorf("decode in chunks of 3: max abs diff %.3g > %.3g", diff, tol)
			}
			// The windows matter: full attention everywhere gives other logits.
			full := skip
			full.Layers = slices.Clone(skip.Layers)
			for l := range full.Layers {
				full.Layers[l].SlidingWindow = 0
			}
			fref, _ := runtime.RefForward(&full, w, tokens)
			if diff := runtime.MaxAbsDiff(runtime.ForwardAll(t, m, tokens), runtime.Flatten(fref)); diff < 1e-3 {
				t.Errorf("windows change the logits by only %.3g; the test cannot see a lost window", diff)
			}
		})
	}
}

func cloneConfig(m map[string]any) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
