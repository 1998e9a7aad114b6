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
// ratios the INT2 quantiser uses, tied to the model and to the calibration
// file by fingerprints. QuantizeKV is the entry point of
// `lmpack quantize kv`.
//
// Layout: rotation.go is math on slices (no I/O); file.go is the rotation
// file; run.go opens the model and the calibration file.
//
// What it is not for: quantising or storing keys and values (the runtime's
// KV caches and quantize/kvq do that, reading the Rotations this package
// produces), and collecting statistics (calibrate).
package oscar
