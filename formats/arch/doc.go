// Package arch turns a Hugging Face config.json into one normalized model
// description, through per-architecture adapters registered by name
// (config.json's architectures[0]), one file per family.
//
// Each adapter unmarshals config.json into its own struct, applies the
// family's defaults (for example Qwen2's always-on q/k/v biases, Qwen3's q/k
// RMSNorm and explicit head_dim, Mixtral's always-renormalised top-k), and
// states its tensor-name mapping as data: a per-layer table of tensor names
// by role. The runtime, calibration, pruning and quantization read only the
// Description; none of them parse config.json themselves.
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
