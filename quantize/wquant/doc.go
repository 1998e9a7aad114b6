// Package wquant is the weight-quantization pipeline behind `lmpack
// quantize weights`: it runs a dense model's calibration tokens through
// the model one decoder block at a time, quantizes each block's Linear
// weights with RTN or GPTQ (package quantize/weights; docs/METHODS.md §7), and
// writes a quantized checkpoint directory (docs/QUANT.md) that the runtime
// executes. With a bits-per-weight target it first measures every tensor's
// output error under every (bits, group) option and picks one option per
// tensor by exact dynamic programming (package quantize/alloc), the
// exllamav2 idea solved exactly.
//
// Sequential, layer by layer (GPTQ paper §4 "sequential"): the calibration
// windows' hidden states X_l (float32 [tokens, hidden]) are kept; block l
// is loaded alone as a one-layer runtime model (the embedding replaced by
// a 1-row stub), X_l is pushed through it once with observers accumulating
// the four input Hessians (q/k/v share the post-input_layernorm input;
// o_proj; gate/up share the post-attention-norm input; down_proj), the
// block's seven weights are quantized, the block is reloaded with the
// dequantized weights and X_l is pushed through it again to give X_{l+1}.
// So the inputs of block l come from the already quantized blocks < l,
// and only one block's weights and Hessians are in memory at a time
// (plus the hidden states: 4·tokens·hidden bytes). Within a block the
// Hessians come from the full-precision block, unless
// Options.TrueSequential (then o_proj's from the block with quantized
// q/k/v, and so on: four passes per block); it does not always lower
// perplexity, so it is an option, off by default.
// Each block's tensors are written to their own safetensors shard as soon
// as the block is done.
//
// Predicted error of a tensor quantized to Ŵ (Report): the mean over
// calibration tokens of ‖(W − Ŵ)x‖², i.e. ½·tr(ΔW H ΔWᵀ) with
// H = (2/N)Σxxᵀ, in the units of that tensor's output. The allocator does
// not sum these (q_proj's and down_proj's outputs are not comparable): it
// measures each option as the relative error of the block's output with
// only that tensor quantized (see Options.TargetBPW and allocate).
//
// MoE models: the routed experts' weights are targets too. With Bits they
// take that width; with MoEBudget every expert gets a width in {1,2,3,4}
// from GEMQ (package quantize/gemq: coefficients from the MoE block's
// output on the float model, then exact DP or the Lagrangian solver under
// the budget, counted in stored bits per expert weight with scales and
// zero-points, as TargetBPW counts them). The attention weights stay in
// the sequential pipeline above, and so do the experts' GPTQ Hessians: the
// block's Hessian pass also routes the quantized prefix's hidden states
// and accumulates each expert's inputs (calibrate.ExpertCollector), with
// the sparse-expert fallback of calibrate.ExpertLayer.Hessians reported
// as a warning. docs/QUANT.md "MoE models" has the details;
// TestMoEBudget logs the perplexity of RTN, RTN with MSEClip and GPTQ
// with MSEClip per budget. The min-max 2-bit grid can be so coarse on
// heavy-tailed rows that the allocator skips 2 bits (1→3 is cheaper per
// unit of error); MSEClip makes 2 bits usable.
//
// Shared experts (Qwen2-MoE mlp.shared_expert) are quantized like the
// dense weights, at Bits/GroupSize/Symmetric, outside the GEMQ allocation
// and MoEBudget's expert bits per weight (they count with the non-expert
// weights; Target.Shared marks them); their [1, hidden] gate vector and
// the router stay float. Their GPTQ Hessians come from the same block
// pass: gate/up_proj's from the MoE block input of every token,
// down_proj's from silu(x·gateᵀ)⊙(x·upᵀ), computed by the observer from x
// and the shared gate/up weights in float64 (the runtime does not expose
// it; sharedDown).
//
// Not for: TargetBPW on MoE models, or running
// the result (the runtime keeps the written weights packed and decodes
// them inside its matmuls: docs/QUANT.md "Runtime").
package wquant
