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
// q/k/v, and so on: four passes per block). On stories260K at 3-bit g64
// true-sequential gave heldout perplexity 11.42 against 11.91 (32
// windows), at 2-bit g64 607.6 against 595.7: it is an option, off by
// default.
// Each block's tensors are written to their own safetensors shard as soon
// as the block is done.
//
// Predicted error of a tensor quantized to Ŵ (Report): the mean over
// calibration tokens of ‖(W − Ŵ)x‖², i.e. ½·tr(ΔW H ΔWᵀ) with
// H = (2/N)Σxxᵀ, in the units of that tensor's output. The allocator does
// not sum these (q_proj's and down_proj's outputs are not comparable): it
// measures each option as the relative error of the block's output with
// only that tensor quantized (see Options.TargetBPW and allocate). On
// stories260K that choice matters: with the summed Linear errors the 3.5
// bpw allocation had heldout perplexity 21.3, worse than uniform GPTQ
// 3-bit g64 (11.9 at 3.43 bpw); with relative block errors it has 10.4.
//
// MoE models: the routed experts' weights are targets too. With Bits they
// take that width; with MoEBudget every expert gets a width in {1,2,3,4}
// from GEMQ (package quantize/gemq: coefficients from the MoE block's
// output on the float model, then exact DP or the Lagrangian solver under
// the budget, counted in stored bits per expert weight with scales and
// zero-points, as TargetBPW counts them). The attention weights stay in
// the sequential pipeline above, and so do the experts' GPTQ Hessians: the
// block's Hessian pass also routes the quantized prefix's hidden states
// and accumulates each expert's inputs (calibrate.ExpertCollector; at
// budget 2.0 on stories260K-moe-hf this took GPTQ+MSEClip from
// perplexity 88.0 to 79.4, 16 windows), with the
// sparse-expert fallback of calibrate.ExpertLayer.Hessians reported as a
// warning. docs/QUANT.md "MoE models" has the details. On
// stories260K-moe-hf (attention 4-bit g32, experts per channel, the first
// 16 heldout windows of 512, calibration 4096 tokens of calib.txt in
// windows of 512; float 6.49) the written checkpoints have
// perplexity, at budgets 1.5/2.0/2.5/3.0: RTN 326/192/102/35, RTN with
// MSEClip 269/156/59/22, GPTQ with MSEClip (sequential expert Hessians)
// 112/79/35/17.8 (TestMoEBudget logs the table). MSEClip matters most at 2
// bits: the min-max 2-bit grid is so coarse on these heavy-tailed rows
// that the allocator skips 2 bits entirely (1→3 is cheaper per unit of
// error); with clipping it uses it.
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
