// Package gemq computes GEMQ's expert-level error coefficients for MoE
// models and allocates a bit width to every (layer, expert) under a
// bits-per-expert-weight budget (GEMQ, arXiv 2605.23078; shared docs
// docs/METHODS.md §4; reference code jndeng/GEMQ).
//
// Pipeline:
//   - Capture runs the model over the calibration windows and keeps, for
//     the requested MoE layers, the block input x [N, H], the router
//     logits [N, E] and the chosen experts [N, K] (LayerInput). Compute
//     captures as many layers per pass as Options.MaxCaptureBytes allows,
//     so memory stays bounded by that cap plus one layer's experts.
//   - LayerCoefficients quantizes one expert at a time at each width
//     b ∈ Options.Bits (default 1, 2, 3, 4; RTN per output channel,
//     asymmetric min-max, docs/METHODS.md §4 step 2) and records the MoE-block
//     output perturbation c[l,e,b] (Weighting documents the formula).
//   - Allocate turns the coefficients into a multiple-choice knapsack
//     (one item per expert, one option per width, cost b·params bits) and
//     solves it with quantize/alloc: exact dynamic programming, or the
//     Lagrangian solver with its gap to the LP bound, optionally under the
//     per-layer rule (one expert at the top width and one at the next).
//
// Forward only. The paper weights the squared output error by the squared
// gradient of the LM loss with respect to the layer output (docs/METHODS.md §4
// step 1); the runtime has no backward pass, so that weight is replaced by
// 1 (the forward-only fallback of docs/METHODS.md §4, as in MC-MoE). Weighting
// chooses the measurement: the exact block perturbation under the model's
// own top-k routing (WeightRouted, the default; cheap, one capture), every
// token weighted by the expert's full softmax probability (WeightSoft), or
// the KL divergence of the final next-token distributions (WeightKL, the
// other fallback docs/METHODS.md §4 names; one forward pass per (layer, expert,
// width), for small models). On stories260K-moe-hf the KL coefficients
// track perplexity far better than the block-output ones, which ignore how
// an error grows through the later layers (see TestStories260KMoE).
//
// Not for: packing quantized weights or writing checkpoints (the weights
// CLI does that from the returned Allocation), or collecting Hessians
// (calibrate.CollectExperts).
package gemq
