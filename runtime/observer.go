package runtime

// Observer interfaces: calibration installs a value implementing any of
// them with Model.SetObserver. Slices passed to hooks are views into the
// runtime's scratch buffers, valid only during the call; copy what you
// keep. pos is the position of the first of the n tokens. All are float32
// row-major.

// BlockObserver sees each decoder block's input and output residual
// streams, x: [n, hidden].
type BlockObserver interface {
	BlockInput(layer, pos, n int, x []float32)
	BlockOutput(layer, pos, n int, x []float32)
}

// QKVObserver sees post-RoPE queries and keys (after q/k norm) and values:
// q: [n, num_heads*head_dim], k, v: [n, num_key_value_heads*head_dim];
// head h occupies columns [h*head_dim, (h+1)*head_dim).
type QKVObserver interface {
	QKV(layer, pos, n int, q, k, v []float32)
}

// RouterObserver sees an MoE layer's router logits, [n, num_experts], and
// the chosen experts, [n, top_k] (ids, best first).
type RouterObserver interface {
	RouterLogits(layer, pos, n int, logits []float32, selected []int32)
}

// FFNObserver sees the FFN input (after post_attention_layernorm),
// x: [n, hidden], and the dense FFN's down_proj input (silu(gate)*up),
// h: [n, intermediate_size] (nil for MoE layers).
type FFNObserver interface {
	FFNInput(layer, pos, n int, x, h []float32)
}

// AttnObserver sees the attention half's Linear inputs: the q/k/v input
// (after input_layernorm), x: [n, hidden], and the o_proj input (the
// concatenated head outputs), a: [n, num_heads*head_dim]. Weight
// quantization (GPTQ) accumulates its Hessians from them.
type AttnObserver interface {
	AttnInput(layer, pos, n int, x []float32)
	OProjInput(layer, pos, n int, a []float32)
}
