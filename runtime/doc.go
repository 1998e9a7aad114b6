// Package runtime executes a model described by formats/arch on a Backend.
//
// The CPU backend (NewCPU) is pure Go: float32 weights and activations,
// matmuls and attention on the SIMD kernels of runtime/kernels, parallel
// across a fixed pool of worker goroutines. It is the reference every other
// backend is checked against, and lmpack's compression speed on machines
// without a GPU.
//
// The forward pass covers the Llama family and its descendants: token
// embedding, RMSNorm, RoPE (rotate_half convention, with linear and llama3
// scaling), grouped-query attention (GQA) over a KV cache with optional
// sliding window, optional q/k/v/o biases (Qwen2) and q/k RMSNorm (Qwen3),
// a SwiGLU FFN, and mixture-of-experts routing (softmax, top-k, optional
// renormalisation; shared experts with a sigmoid gate), then the final
// RMSNorm and the (optionally tied) lm_head.
//
// Extension points for later stages are small interfaces: Backend and
// Model (a CUDA backend), KVCache (quantized caches, with the optional
// abilities F32KV, zero-copy float32 storage, QuantizedKV, fp16 windows,
// and KVAttender, attention against the packed storage) and the observer interfaces of observer.go
// (calibration). Unused observers cost one nil check per layer.
//
// The package does not parse files: weights come from a TensorSource
// (a safetensors checkpoint or an lmpack artifact) and the description
// from formats/arch. Weights listed in the description's quantization
// block (docs/QUANT.md) are read as packed codes with fp16 scales
// (ReadQuantized); the CPU backend keeps the linear ones packed unless
// LoadOptions.DequantizeWeights, and likewise uses BF16/F16 linear weights
// and embeddings in place from the mapped file (halflinear.go,
// kernels.MatMulNTHalf).
// HiddenForwarder runs the blocks on given hidden states (sequential
// compression stages load one block at a time).
//
// ForwardBatch runs a ragged batch: several sequences, each with its own
// cache, position and number of new tokens, in one call that reads every
// weight once (BatchForwarder; batch_cpu.go for the CPU backend, whose
// Forward is its one-sequence case). On the CPU every linear map runs
// kernels.MatMulNTRows, whose outputs do not depend on the other rows, so
// a sequence's logits are the same bits batched or alone, on any number
// of threads.
package runtime
