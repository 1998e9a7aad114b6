package arch_test

import (
	"fmt"

	"github.com/lmpack/lmpack/formats/arch"
)

func ExampleParse() {
	d, err := arch.Parse([]byte(`{"architectures": ["Qwen3ForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
		"num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 1000}`))
	if err != nil {
		panic(err)
	}
	l := d.Layers[0]
	fmt.Println(d.Architecture, len(d.Layers), "layers")
	fmt.Println("q", l.QDim(), "kv", l.KVDim(), "GQA group", l.NumHeads/l.NumKVHeads)
	fmt.Println(l.Attn.QNorm)
	// Output:
	// Qwen3ForCausalLM 2 layers
	// q 128 kv 32 GQA group 4
	// model.layers.0.self_attn.q_norm.weight
}
