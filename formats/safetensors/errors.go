package safetensors

import "errors"

// Sentinel errors. Every error this package returns is wrapped with %w and
// carries the file (or directory) and, where there is one, the tensor name, so
// callers branch with errors.Is and show the message as is.
var (
	// ErrMissingTensor is returned when a tensor name is not in a file or
	// checkpoint.
	ErrMissingTensor = errors.New("tensor not found")

	// ErrFormat is wrapped by every error about a malformed file: bad header
	// length, invalid JSON, bad dtype/shape/offsets, a checkpoint index that
	// disagrees with its shards.
	ErrFormat = errors.New("malformed safetensors data")

	// ErrNoWeights is returned by OpenDir for a directory holding no
	// safetensors file at all.
	ErrNoWeights = errors.New("no safetensors weights")

	// ErrClosed is returned when a File or Checkpoint is used after Close.
	ErrClosed = errors.New("file is closed")
)
