package arch

import "fmt"

// Attention types of transformers' layer_types list.
const (
	fullAttention    = "full_attention"
	slidingAttention = "sliding_attention"
)

// layerTypes reads config.json's layer_types: nil when absent, else one
// flag per layer, true for "sliding_attention". Errors: a list whose
// length is not num_hidden_layers, an entry other than full_attention and
// sliding_attention (named with its layer).
func (c *decoderConfig) layerTypes() ([]bool, error) {
	if c.LayerTypes == nil {
		return nil, nil
	}
	if len(c.LayerTypes) != c.NumHiddenLayers {
		return nil, fmt.Errorf("layer_types has %d entries, num_hidden_layers is %d", len(c.LayerTypes), c.NumHiddenLayers)
	}
	out := make([]bool, len(c.LayerTypes))
	for i, t := range c.LayerTypes {
		switch t {
		case fullAttention:
		case slidingAttention:
			out[i] = true
		default:
			return nil, fmt.Errorf("layer_types[%d] %q unsupported (want %q or %q)", i, t, fullAttention, slidingAttention)
		}
	}
	return out, nil
}

// setWindows gives layer i of d the sliding window when sliding[i] and
// full attention otherwise. window is the window in effect (0: none);
// a sliding layer without one is an error naming why (the config keys
// that leave transformers without a window: its sliding mask refuses).
func setWindows(d *Description, sliding []bool, window int, why string) error {
	for i := range d.Layers {
		d.Layers[i].SlidingWindow = 0
		if !sliding[i] {
			continue
		}
		if window <= 0 {
			return fmt.Errorf("layer_types[%d] is %q but %s", i, slidingAttention, why)
		}
		d.Layers[i].SlidingWindow = window
	}
	return nil
}

// uniformWindows is for the families whose attention windows every layer
// or none (Llama: none; Mistral, Mixtral, Qwen3-MoE: every layer when a
// window is set). Their transformers models do not read layer_types; a
// layer_types that says otherwise is refused, naming the layer, rather
// than run one way while the config says another.
func uniformWindows(d *Description, c *decoderConfig, window int, family string) error {
	types, err := c.layerTypes()
	if err != nil {
		return err
	}
	for i := range d.Layers {
		d.Layers[i].SlidingWindow = max(window, 0)
		if types != nil && types[i] != (window > 0) {
			what := "no layer slides"
			if window > 0 {
				what = fmt.Sprintf("every layer slides (window %d)", window)
			}
			return fmt.Errorf("layer_types[%d] is %q, but in %s %s: transformers does not read layer_types for this family", i, c.LayerTypes[i], family, what)
		}
	}
	return nil
}

// slidingWindowValue returns the window sliding_window gives: 0 (none)
// for null, absent without a family default, or a value <= 0.
func slidingWindowValue(w *int) int {
	if w == nil || *w <= 0 {
		return 0
	}
	return *w
}
