// Package weights quantizes Linear weight matrices to 1, 2, 3, 4 or 8
// bits: round-to-nearest (RTN) on a per-group min-max grid (at 1 bit the
// two levels μ ± α of the group's mean and mean deviation), and GPTQ (Frantar et
// al., "GPTQ: Accurate Post-Training Quantization for Generative
// Pre-trained Transformers", arXiv 2210.17323), which uses the layer's
// input Hessian H = (2/N)·Σ x xᵀ to feed each column's rounding error into
// the columns not yet quantized. docs/METHODS.md §7 gives the
// defaults (damp 0.01·mean diag, groups 32/64/128 or per-channel).
//
// Inputs are float32 [out, in] row-major weights and, for GPTQ, a Hessian
// accumulated from float32 [n, in] activations. Output is a Quantized:
// codes packed as one LSB-first bit stream per row, float16 scales and
// zero-points per (row, group), and for GPTQ act-order with groups a
// column permutation. BitsPerWeight counts codes, scales, zero-points and
// the permutation (4-bit, group 128, asymmetric: 4.25).
//
// Not for: reading or writing checkpoints (quantize/wquant writes
// Quantized values as the docs/QUANT.md checkpoint format, the runtime reads
// them back), running calibration, choosing bit widths (see quantize/alloc),
// or computing with quantized weights.
// Everything here works on slices and small structs; one layer at a time.
package weights
