// Package arch turns a Hugging Face config.json into one normalized model
// description, through per-architecture adapters registered by name
// (config.json's architectures[0]), one file per family.
//
// Each family's file (llama.go, mistral.go, mixtral.go, qwen2.go, qwen3.go,
// qwenmoe.go) holds its config struct, pre-filled with transformers'
// defaults for that family (configuration_<family>.py: Qwen3's rope_theta
// 10000 and head_dim 128, Mixtral's rms_norm_eps 1e-5, Mistral's
// sliding_window 4096, ...), and the code for what differs: Qwen2's
// always-on q/k/v biases, Qwen3's q/k RMSNorm, which layers slide, the
// FFN (Mixtral's always-renormalised top-k, the Qwen MoE layer pattern).
// common.go, rope.go and window.go are helpers they share. The runtime,
// calibration, pruning and quantization read only the Description; none of
// them parse config.json themselves.
//
// RoPE is read in both spellings: transformers v4's rope_theta and
// rope_scaling, and v5's rope_parameters object (rope_theta, rope_type and
// the scaling keys together). lmpack runs default, linear and llama3 RoPE;
// any other rope_type (yarn, dynamic, longrope, ...), a key inside the
// object it does not implement, partial_rotary_factor other than 1 and
// RoPE per layer type are refused with an error naming the key and value.
//
// Sliding windows follow transformers per family: layer_types
// ("full_attention" / "sliding_attention") decides for Qwen2, Qwen3 and
// Qwen2-MoE; without it Qwen2 and Qwen3 slide from max_window_layers on
// when use_sliding_window, Qwen2-MoE on even layers below
// max_window_layers; Qwen3-MoE, Mistral and Mixtral window every layer
// when a window is set, and Llama none (a layer_types that contradicts
// these is refused).
//
// RewriteConfig is the one config.json rewriter of the stages that write
// checkpoints: depth pruning (per-layer lists sliced, layer indices and
// window/MoE thresholds rewritten so every kept layer keeps its attention
// type and FFN kind), width pruning (layer_configs) and weight
// quantization (lmpack_quantization).
//
// A quantized checkpoint written by `lmpack quantize weights` carries an
// lmpack_quantization block (docs/QUANT.md) that Parse reads into
// Description.Quant for every architecture: per weight its bits, group
// size, symmetry and permutation. StorageShapes lists the tensors such a
// checkpoint stores (NAME.qweight, NAME.scales, ... instead of
// NAME.weight); QuantStorage gives one weight's.
//
// The package does no tensor I/O and no math: it is for describing a model,
// not for loading or running it.
package arch
