package arch

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
)

// ErrRewrite is wrapped by RewriteConfig when config.json cannot be
// rewritten as asked: not a JSON object, a per-layer list or index of
// the wrong length or type, or a result whose kept layers would not keep
// their attention type or FFN kind.
var ErrRewrite = errors.New("config.json cannot be rewritten")

// ConfigEdit is a change to config.json by a stage that writes a new
// checkpoint (depth or width pruning, weight quantization). Zero fields
// change nothing.
type ConfigEdit struct {
	// Layers, when > 0, is the decoder block count the edit is for:
	// num_hidden_layers must equal it.
	Layers int
	// Keep, when non-nil, keeps only these decoder blocks (original
	// indices, ascending), renumbered 0..len(Keep)-1; see RewriteConfig.
	Keep []int
	// LayerConfigs, when non-nil, is written as lmpack's layer_configs
	// (one entry per decoder block of the result).
	LayerConfigs []LayerConfig
	// Quant, when non-nil, is written as the lmpack_quantization block
	// (QuantKey) at the top level.
	Quant *Quantization
}

// perLayerKeys are config.json lists with one entry per decoder block;
// layerIndexKeys are lists of decoder block indices.
var (
	perLayerKeys   = []string{"layer_types", "layer_configs", "no_rope_layers", "layers_block_type"}
	layerIndexKeys = []string{"mlp_only_layers"}
)

// RewriteConfig returns config.json (configJSON) with e applied. The
// language model's fields are those of the top-level object, or of its
// "text_config" when a multimodal config nests them there (no top-level
// num_hidden_layers); every other field is kept, numbers verbatim, keys
// sorted, two-space indent, a final newline.
//
// With e.Keep, num_hidden_layers becomes len(e.Keep); the per-layer lists
// (layer_types, layer_configs, no_rope_layers, layers_block_type) are
// sliced to the kept layers; the index lists (mlp_only_layers) are
// renumbered with removed layers dropped; max_window_layers becomes the
// number of kept layers below it, so Qwen2/Qwen3 layers keep their
// attention type; a decoder_sparse_step other than 1 becomes 1 with
// mlp_only_layers listing the kept dense layers, so Qwen MoE layers keep
// their FFN kind. When the config describes a model Parse reads, the
// result is checked: every kept layer must keep its sliding window, head
// counts, head_dim and FFN (dense size, or experts and shared expert);
// where the window rule cannot express the kept layers' windows (Qwen2's
// default max_window_layers, Qwen2-MoE's even-layer rule) layer_types is
// written out.
//
// Errors wrap ErrRewrite and name the field: not a JSON object;
// num_hidden_layers missing or not e.Layers; Keep out of range or not
// ascending; a per-layer list whose length is not num_hidden_layers; a
// non-integer index; a kept layer that would change.
func RewriteConfig(configJSON []byte, e ConfigEdit) ([]byte, error) {
	var cfg map[string]any
	dec := json.NewDecoder(bytes.NewReader(configJSON))
	dec.UseNumber()
	if err := dec.Decode(&cfg); err != nil || cfg == nil {
		return nil, fmt.Errorf("%w: not a JSON object (%v)", ErrRewrite, err)
	}
	target := cfg
	if tc, ok := cfg["text_config"].(map[string]any); ok {
		if _, has := cfg["num_hidden_layers"]; !has {
			target = tc
		}
	}
	L, err := intField(target, "num_hidden_layers")
	if err != nil {
		return nil, err
	}
	if e.Layers > 0 && L != e.Layers {
		return nil, fmt.Errorf("%w: num_hidden_layers %d, the edit is for %d layers", ErrRewrite, L, e.Layers)
	}
	if e.Keep != nil {
		if err := keepLayers(configJSON, cfg, target, L, e.Keep); err != nil {
			return nil, err
		}
	}
	if e.LayerConfigs != nil {
		target["layer_configs"] = e.LayerConfigs
	}
	if e.Quant != nil {
		cfg[QuantKey] = e.Quant
	}
	return marshalConfig(cfg)
}

// marshalConfig writes cfg as RewriteConfig documents.
func marshalConfig(cfg map[string]any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(cfg); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrRewrite, err)
	}
	return buf.Bytes(), nil
}

// intField reads an integer field of obj. Errors name it.
func intField(obj map[string]any, key string) (int, error) {
	n, ok := obj[key].(json.Number)
	v, err := n.Int64()
	if !ok || err != nil {
		return 0, fmt.Errorf("%w: %s %v: want an integer", ErrRewrite, key, obj[key])
	}
	return int(v), nil
}

// keepLayers applies ConfigEdit.Keep to target (inside cfg), then checks
// the result against the original (orig: configJSON's bytes).
func keepLayers(orig []byte, cfg, target map[string]any, L int, keep []int) error {
	if len(keep) == 0 {
		return fmt.Errorf("%w: no layer kept", ErrRewrite)
	}
	newIndex := make(map[int]int, len(keep))
	for i, l := range keep {
		if l < 0 || l >= L || (i > 0 && l <= keep[i-1]) {
			return fmt.Errorf("%w: kept layers %v: want ascending indices in [0, %d)", ErrRewrite, keep, L)
		}
		newIndex[l] = i
	}
	target["num_hidden_layers"] = len(keep)
	for _, key := range perLayerKeys {
		v, ok := target[key]
		if !ok || v == nil {
			continue
		}
		list, ok := v.([]any)
		if !ok || len(list) != L {
			return fmt.Errorf("%w: %s %v: want a list of num_hidden_layers (%d) entries", ErrRewrite, key, v, L)
		}
		nv := make([]any, len(keep))
		for i, l := range keep {
			nv[i] = list[l]
		}
		target[key] = nv
	}
	for _, key := range layerIndexKeys {
		idx, err := indexList(target, key)
		if err != nil {
			return err
		}
		if idx == nil {
			continue
		}
		nv := []any{}
		for _, l := range idx {
			if ni, ok := newIndex[l]; ok {
				nv = append(nv, ni)
			}
		}
		target[key] = nv
	}
	if _, has := target["layer_types"]; !has {
		if v, ok := target["max_window_layers"]; ok && v != nil {
			mwl, err := intField(target, "max_window_layers")
			if err != nil {
				return err
			}
			below := 0
			for _, l := range keep {
				if l < mwl {
					below++
				}
			}
			target["max_window_layers"] = below
		}
	}
	if v, ok := target["decoder_sparse_step"]; ok && v != nil {
		step, err := intField(target, "decoder_sparse_step")
		if err != nil {
			return err
		}
		if step > 1 {
			only, err := indexList(target, "mlp_only_layers")
			if err != nil {
				return err
			}
			// Indices are already renumbered: a kept layer is dense when
			// listed or when its original index is off the step.
			dense := []any{}
			for i, l := range keep {
				if slices.Contains(only, i) || (l+1)%step != 0 {
					dense = append(dense, i)
				}
			}
			target["decoder_sparse_step"] = 1
			target["mlp_only_layers"] = dense
		}
	}
	before, err := Parse(orig)
	if err != nil {
		// Not a model this package describes (a nested multimodal config,
		// for one): the rules above are all that can be applied.
		return nil
	}
	after, err := parseMap(cfg)
	if err == nil && !keptLayersMatch(before, after, keep) && target["layer_types"] == nil {
		types := make([]any, len(keep))
		for i, l := range keep {
			types[i] = fullAttention
			if before.Layers[l].SlidingWindow > 0 {
				types[i] = slidingAttention
			}
		}
		target["layer_types"] = types
		after, err = parseMap(cfg)
	}
	if err != nil {
		return fmt.Errorf("%w: the rewritten config does not parse: %v", ErrRewrite, err)
	}
	for i, l := range keep {
		if msg := layerDiff(&before.Layers[l], &after.Layers[i]); msg != "" {
			return fmt.Errorf("%w: kept layer %d (now %d) would change: %s", ErrRewrite, l, i, msg)
		}
	}
	return nil
}

// indexList reads a list of layer indices; nil when absent or null.
func indexList(obj map[string]any, key string) ([]int, error) {
	v, ok := obj[key]
	if !ok || v == nil {
		return nil, nil
	}
	list, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("%w: %s %v: want a list of layer indices", ErrRewrite, key, v)
	}
	out := make([]int, 0, len(list))
	for _, x := range list {
		var n int64
		var err error
		switch x := x.(type) {
		case json.Number:
			n, err = x.Int64()
		case int:
			n = int64(x)
		default:
			err = errors.New("not a number")
		}
		if err != nil {
			return nil, fmt.Errorf("%w: %s entry %v is not an integer", ErrRewrite, key, x)
		}
		out = append(out, int(n))
	}
	return out, nil
}

// parseMap parses a config held as a map.
func parseMap(cfg map[string]any) (*Description, error) {
	b, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	return Parse(b)
}

// keptLayersMatch reports whether after's layers equal before's kept ones.
func keptLayersMatch(before, after *Description, keep []int) bool {
	if len(after.Layers) != len(keep) {
		return false
	}
	for i, l := range keep {
		if layerDiff(&before.Layers[l], &after.Layers[i]) != "" {
			return false
		}
	}
	return true
}

// layerDiff describes how b differs from a in what a rewrite must keep
// (window, head counts, head_dim, FFN kind and sizes, biases, q/k norm);
// "" when it does not.
func layerDiff(a, b *Layer) string {
	switch {
	case a.SlidingWindow != b.SlidingWindow:
		return fmt.Sprintf("sliding window %d, was %d", b.SlidingWindow, a.SlidingWindow)
	case a.NumHeads != b.NumHeads || a.NumKVHeads != b.NumKVHeads || a.HeadDim != b.HeadDim:
		return fmt.Sprintf("heads %d/%d of %d, was %d/%d of %d", b.NumHeads, b.NumKVHeads, b.HeadDim, a.NumHeads, a.NumKVHeads, a.HeadDim)
	case (a.MLP == nil) != (b.MLP == nil):
		return "dense FFN and MoE swapped"
	case a.MLP != nil && a.MLP.IntermediateSize != b.MLP.IntermediateSize:
		return fmt.Sprintf("intermediate_size %d, was %d", b.MLP.IntermediateSize, a.MLP.IntermediateSize)
	case a.MoE != nil && (a.MoE.NumExperts != b.MoE.NumExperts || a.MoE.TopK != b.MoE.TopK || (a.MoE.Shared == nil) != (b.MoE.Shared == nil)):
		return "MoE experts, top-k or shared expert differ"
	case (a.Attn.QBias == "") != (b.Attn.QBias == "") || (a.Attn.OBias == "") != (b.Attn.OBias == "") || (a.Attn.QNorm == "") != (b.Attn.QNorm == ""):
		return "attention biases or q/k norm differ"
	}
	return ""
}
