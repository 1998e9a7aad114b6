// Package pack writes, opens and verifies lmpack artifacts (.lmpk): one
// file holding a model's tensors, its tokenizer and configuration files,
// its KV scheme (rotations, clip ratios) and a JSON manifest describing
// them and their provenance. The byte layout is specified in
// docs/FORMAT.md.
//
// Writers are deterministic (same Artifact, same bytes) and atomic (a
// temporary file renamed over the destination). Readers memory-map the
// file; an uncompressed section is returned as a zero-copy view of the
// map, an lz4 section is decompressed into a new slice.
//
// Integrity: the fixed header and the manifest carry CRC-32C checksums that
// Open checks; every section carries a CRC-32C that Verify checks, and
// that Tensor and File check on each access (Open does not read section
// bytes); the whole file carries a sha256 that Verify
// checks and that also serves as the artifact's identity.
//
// A Reader is a runtime.TensorSource: Description rebuilds the
// arch.Description from the manifest, Tensor hands out CRC-checked tensor
// views and records what was consumed, so a loader can fail on manifest
// tensors nothing read (Unconsumed). pack itself does not build a runtime
// model (internal/engine does) and not the compression pipeline (it does not quantize or
// prune): it stores bytes that other packages produce.
package pack
