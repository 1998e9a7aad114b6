package arch

import "fmt"

// qwen2 describes Qwen2ForCausalLM: Llama layout with q/k/v biases (always
// present, no o_proj bias) and a sliding window where layer_types says
// sliding_attention, or, without layer_types, from layer max_window_layers
// on when use_sliding_window.
type qwen2 struct{}

var _ Adapter = (*qwen2)(nil)

func init() { Register("Qwen2ForCausalLM", func() Adapter { return &qwen2{} }) }

// qwen2Config is Qwen2ForCausalLM's config.json. Defaults are
// transformers' Qwen2Config: num_key_value_heads 32 (null:
// num_attention_heads), rms_norm_eps 1e-6, max_position_embeddings 32768,
// rope_theta 10000, use_sliding_window false, sliding_window 4096,
// max_window_layers 28.
type qwen2Config struct {
	decoderConfig
	qwenWindowConfig
}

// qwenWindowConfig holds the sliding-window keys of the Qwen families.
type qwenWindowConfig struct {
	UseSlidingWindow bool `json:"use_sliding_window"`
	SlidingWindow    *int `json:"sliding_window"`
	MaxWindowLayers  int  `json:"max_window_layers"`
}

// qwenWindowDefaults are Qwen2Config's and Qwen3Config's window defaults.
func qwenWindowDefaults() qwenWindowConfig {
	return qwenWindowConfig{SlidingWindow: ptr(4096), MaxWindowLayers: 28}
}

// window is the window transformers' Qwen configs put in effect:
// sliding_window when use_sliding_window, else none.
func (w *qwenWindowConfig) window() int {
	if !w.UseSlidingWindow {
		return 0
	}
	return slidingWindowValue(w.SlidingWindow)
}

// why explains a sliding layer without a window.
func (w *qwenWindowConfig) why() string {
	if !w.UseSlidingWindow {
		return "use_sliding_window is false (transformers then has no window)"
	}
	return fmt.Sprintf("sliding_window is %v", w.SlidingWindow)
}

// thresholdWindows sets Qwen2's and Qwen3's windows: layer_types when
// given, else sliding from layer max_window_layers on (transformers'
// Qwen2Config/Qwen3Config build layer_types so).
func thresholdWindows(d *Description, c *decoderConfig, w *qwenWindowConfig) error {
	sliding, err := c.layerTypes()
	if err != nil {
		return err
	}
	if sliding == nil {
		sliding = make([]bool, len(d.Layers))
		for i := range sliding {
			sliding[i] = w.window() > 0 && i >= w.MaxWindowLayers
		}
	}
	return setWindows(d, sliding, w.window(), w.why())
}

func (*qwen2) Describe(raw []byte) (*Description, error) {
	c := qwen2Config{
		decoderConfig:    decoderConfig{NumKeyValueHeads: ptr(32), RMSNormEps: 1e-6, MaxPositionEmbeddings: 32768},
		qwenWindowConfig: qwenWindowDefaults(),
	}
	if err := decode(raw, &c); err != nil {
		return nil, err
	}
	d, err := c.newDescription(10000)
	if err != nil {
		return nil, err
	}
	addQKVBias(d)
	if err := thresholdWindows(d, &c.decoderConfig, &c.qwenWindowConfig); err != nil {
		return nil, err
	}
	addDenseMLPs(d, &c.decoderConfig)
	return d, nil
}
