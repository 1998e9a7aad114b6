// Package kvq holds the math primitives of KV-cache quantization: the
// normalized Walsh–Hadamard transform (FWHT, HadamardMatrix), the
// bit-reversal permutation used by OSCAR's rotation, clipping, and row
// quantizers with packed codes (asymmetric and symmetric per row, and
// KIVI-style per-channel over a block of tokens) at 2, 4 and 8 bits.
//
// It works on slices only: no files, no model, no cache bookkeeping. The
// caches that store tokens with these quantizers live in runtime/kvcache;
// the OSCAR calibration that computes rotations lives in quantize/oscar.
// The methods are specified in docs/METHODS.md §1–3.
//
// Code packing: b-bit codes are packed LSB first within a byte, 8/b codes
// per byte (2-bit: 4, 4-bit: 2, 8-bit: 1); element i of a row sits in byte
// i·b/8 at bit offset (i·b) mod 8.
package kvq
