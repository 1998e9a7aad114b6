// Package safetensors reads and writes the Hugging Face safetensors format:
// an 8-byte little-endian header length N, N bytes of JSON header (tensor
// name → dtype, row-major shape, [begin,end) byte offsets into the data
// section, plus an optional "__metadata__" string map), then the data section
// of little-endian tensor bytes, which the tensors must tile exactly.
//
// What it is for:
//   - Open: memory-map one file, validate the header strictly (every error
//     names the file and tensor), and hand out zero-copy Tensor views;
//     Tensor.Float32 converts any supported dtype (F32, F16, BF16, FP8
//     E4M3/E5M2, F64, integers, BOOL) to float32.
//   - OpenDir / OpenPath: a whole Hugging Face checkpoint (sharded through
//     model.safetensors.index.json, a single model.safetensors, or all
//     *.safetensors files of a directory) as one tensor name space.
//   - WriteFile: a deterministic, streaming, atomic writer (temporary file,
//     fsync, rename), with F32/F16/BF16 encoding helpers; WriteIndex for
//     sharded checkpoints.
//
// What it is not for: it does not interpret tensors (no model config, no
// name conventions, no quantized block formats beyond the element dtypes
// above), does not do tensor arithmetic, and does not read PyTorch pickle or
// GGUF files. Data views alias a read-only mapping: they are invalid after
// Close and must not be written.
//
// Why not github.com/nlpodyssey/safetensors. The design card names that
// module; this package is our own because, at the version in go.mod
// (v0.0.0-20250209183917-bfb01cc25f7c), checked against its source:
//   - no FP8: its DType enumeration is BOOL, U8, I8, I16, U16, F16, BF16,
//     I32, U32, F32, F64, I64, U64, and ParseDType("F8_E4M3") fails, so FP8
//     checkpoints cannot be opened at all;
//   - 0-d tensors only half work: Deserialize accepts shape [] as one element,
//     but NewTensorView computes zero elements for shape [] and rejects a
//     scalar's 4 F32 bytes, so a 0-d tensor cannot be built for writing
//     through its own constructor;
//   - no header-only read: ReadMetadata/Deserialize take the whole file as a
//     []byte and fail ("metadata incomplete buffer") unless it is all there,
//     so the caller must read or map everything itself;
//   - no streaming write source: SerializeToWriter streams its output, but
//     every tensor must be a View whose Data() returns all its bytes in
//     memory; there is no per-tensor writer callback, no atomic
//     write-and-rename, and tensors are ordered by dtype, then name.
//
// nlpodyssey/safetensors is still used in this package's tests as an
// independent reader to cross-check ours on a real checkpoint and on files
// our writer produces.
//
// Format rules follow the safetensors README and the reference validation
// in huggingface/safetensors (safetensors/src/tensor.rs): header at most
// 100,000,000 bytes, UTF-8 JSON beginning with '{', trailing whitespace
// padding allowed, no duplicate keys, offsets sorted must be contiguous from 0
// to the end of the file, byte length = prod(shape) × dtype size, shape []
// is a scalar, a zero dim an empty tensor. FP8 decoding follows the OCP 8-bit
// Floating Point Specification (OFP8) v1.0.
package safetensors
