// Package oscar computes OSCAR rotations for a 2-bit KV cache (Offline
// Spectral Covariance-Aware Rotation; docs/METHODS.md §1, arXiv
// 2605.17757, reference code FutureMLS-Lab/OSCAR
// rotation/compute_kv_rotation.py, composition "r_h_pbr", methods "qqt" for
// K and "sst" for V).
//
// From the per-layer covariances a calibration file holds (calibrate,
// statistic "oscar": C_Q for keys, C_S for values), Rotation builds one
// orthogonal d×d matrix per layer and per K/V: eigenvectors sorted by
// importance, then a Walsh–Hadamard transform that spreads importance
// evenly over the coordinates, then a bit-reversal permutation. The
// rotation file (WriteFile, ReadFile) stores them as F32 with the clipping
// ratios per width (OSCAR's published 0.96/0.92 are INT2 ratios and apply
// to 2-bit sides only; 4- and 8-bit sides clip only with ratios of their
// own) and, optionally, per-layer K and V widths in {2, 4, 8} for the
// runtime's oscar-mixed cache, tied to the model and to the calibration
// file by fingerprints. QuantizeKV is the entry point of
// `lmpack quantize kv`; with ClipSearch it picks the ratios per layer,
// side and width by the KL of the model's final logits measured on the
// calibration tokens with that one side quantized as served, and with
// KVBits it chooses the widths by exact DP on the same KL errors
// (ChooseWidths, quantize/alloc) within a bits-per-element budget at a
// serving context.
//
// Layout: rotation.go is math on slices (no I/O); file.go is the rotation
// file; run.go opens the model and the calibration file; search.go
// measures the errors and chooses the widths.
//
// What it is not for: quantising or storing keys and values (the runtime's
// KV caches and quantize/kvq do that, reading the Rotations this package
// produces), and collecting statistics (calibrate).
package oscar
