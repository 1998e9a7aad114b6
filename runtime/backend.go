package runtime

import (
	"context"
	"errors"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
)

// ErrBadWeights is wrapped by Load when a tensor is missing, has the wrong
// shape or holds NaN/Inf values.
var ErrBadWeights = errors.New("bad weights")

// TensorSource gives a model's tensors by name; *safetensors.Checkpoint
// implements it. Tensor returns an error wrapping
// safetensors.ErrMissingTensor when the name is absent.
type TensorSource interface {
	Tensor(name string) (*safetensors.Tensor, error)
}

// LoadOptions configures Backend.Load.
type LoadOptions struct {
	// Threads is the number of worker threads; <= 0 means all cores.
	Threads int
	// DequantizeWeights asks the CPU backend for float32 copies of the
	// weights it otherwise uses in place: BF16/F16 and quantized ones.
	//
	// BF16/F16: by default (false) the CPU backend keeps the linear
	// weights (q, k, v, o; gate, up, down of MLPs and experts; lm_head)
	// and the embedding of BF16/F16 tensors in place, as src's 16-bit
	// data, 2 bytes per weight instead of a 4-byte float32 copy
	// (runtime/halflinear.go), with logits bit-identical to the widened
	// ones. src's tensors' data must then stay valid until the model is
	// closed (a safetensors.Checkpoint left open); with DequantizeWeights
	// src may be closed after Load. Norms, biases and routers are float32
	// either way.
	//
	// Quantized: DequantizeWeights makes the CPU backend dequantize every quantized
	// weight (docs/QUANT.md) to float32 at load: 32 bits per weight in
	// memory instead of about bits + 16/group_size
	// (+16/group_size for zero-points). By default (false) the quantized
	// linear weights stay packed (runtime/qlinear.go): weights of 1, 2, 4
	// or 8 bits run on int8 activations (logits within about 2e-2·
	// max|logit|, 5e-2 for 1-2-bit models; docs/QUANT.md "Runtime"), the
	// others dequantize tiles inside each matmul (bit-identical to
	// DequantizeWeights); either way a sequence's logits in a batched call
	// (ForwardBatch) equal those it gets alone, on any number of threads.
	// The CUDA backend ignores it.
	DequantizeWeights bool
	// ConvertPerBlock makes the CPU backend keep the float weights of the
	// decoder blocks' linear maps (q, k, v, o; gate, up, down of the MLP,
	// the routed experts and the shared expert) in src's dtype, as src's
	// tensors, and convert one block's to float32 at a time: at the start
	// of that block in every Forward and ForwardHidden call, into one
	// scratch buffer the size of the largest block. Memory is then src's
	// data plus one block's float32 weights instead of every block's;
	// every call pays one conversion of all block weights, which suits
	// long prefill windows (calibration), not decode. Results are
	// bit-identical to the default. Load still checks every value (shape,
	// dtype, NaN/Inf). The tensors' data must stay valid until the model is
	// closed (a safetensors.Checkpoint left open). The embedding, lm_head,
	// norms, biases and routers are loaded as by default (BF16/F16
	// embedding and lm_head in place unless DequantizeWeights);
	// packed quantized weights stay packed. The CUDA backend ignores it.
	ConvertPerBlock bool
}

// Backend loads models for one kind of device.
type Backend interface {
	// Name is "cpu" or "cuda".
	Name() string
	// Load reads and checks every tensor the description names. Errors wrap
	// ErrBadWeights and name the tensor (missing, shape mismatch, NaN/Inf).
	Load(ctx context.Context, d *arch.Description, src TensorSource, opt LoadOptions) (Model, error)
}

// Model is a loaded model. A Model is not safe for concurrent Forward calls.
type Model interface {
	// Description returns the model's description.
	Description() *arch.Description
	// NewCache returns an empty float32 KV cache holding up to capacity
	// tokens.
	NewCache(capacity int) KVCache
	// Forward runs tokens (ids in [0, vocab)) at positions cache.Len() ..
	// cache.Len()+len(tokens)-1, appends their keys and values to cache,
	// and writes logits: when allLogits, logits is [len(tokens), vocab]
	// row-major float32; otherwise [vocab] for the last token only. The
	// call's tokens attend to each other through their fresh float32 keys
	// and values; tokens of earlier calls are read from the cache in its
	// storage format (QuantizedKV: windows counted back from each query;
	// an F32KV cache's rows as stored). Errors: empty tokens, an id out of range, the cache full, a short
	// logits slice, ctx cancelled.
	Forward(ctx context.Context, tokens []int, cache KVCache, logits []float32, allLogits bool) error
	// SetObserver installs calibration hooks (nil removes them). The
	// observer may implement any of the observer interfaces.
	SetObserver(o any)
	// Close releases the model's resources.
	Close() error
}
