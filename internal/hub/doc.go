// Package hub turns the MODEL argument of the lmpack command line into a
// local directory that holds a Hugging Face checkpoint (config.json,
// tokenizer files and *.safetensors weights).
//
// MODEL is either a directory on disk, returned unchanged, or a Hugging Face
// hub id "org/name" with an optional "@revision" (branch, tag or 40-hex commit
// hash). A hub id is looked up in the shared Hugging Face cache, whose layout
// is documented at https://huggingface.co/docs/hub/local-cache:
//
//	<cache>/models--org--name/refs/<revision>            one line: the commit hash
//	<cache>/models--org--name/snapshots/<commit>/<file>  symlink to ../../blobs/<etag>
//	<cache>/models--org--name/blobs/<etag>               the bytes (sha1 for git files, sha256 for LFS files)
//	<cache>/models--org--name/.no_exist/<commit>/<file>  empty marker: file absent at that commit
//	<cache>/.locks/models--org--name/<etag>.lock         advisory lock while a blob is written
//
// so a cache filled by huggingface-cli (or transformers) is reused as is, and
// a cache filled by lmpack can be read by Python tools.
//
// When the cache lacks the model, Resolve downloads only the files an
// inference runtime needs (config, generation config, tokenizer files,
// safetensors weights and their index) through the Hub HTTP API. Downloads are
// resumable: bytes go to blobs/<etag>.incomplete, a rerun continues them with
// a Range request, and a blob is renamed into place only after its size (and
// sha256, for LFS files) has been checked.
//
// The package is not a general Hugging Face client: it does not upload, list
// or search repositories, does not handle datasets or spaces, does not fetch
// PyTorch (*.bin, *.pt), GGUF or ONNX files, does not check a cached branch
// for newer commits once the cache holds a complete snapshot for it, and on
// systems without symbolic links it does not fall back to copies.
package hub
