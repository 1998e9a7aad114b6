package runtime

import (
	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/quantize/weights"
)

// Test helpers exported to the runtime_test package (tests there may
// import packages that import runtime, such as prune).
var (
	RefForward      = refForward
	SynthCheckpoint = synthCheckpoint
	LoadDir         = loadDir
	ForwardAll      = forwardAll
	ForwardSteps    = forwardSteps
	MaxAbsDiff      = maxAbsDiff
	Flatten         = flatten
	BaseConfig      = baseConfig
	// ProcessCPUSeconds is the process's user+system CPU time in seconds,
	// -1 where unavailable (cputime_*_test.go).
	ProcessCPUSeconds = processCPUSeconds
	With              = with
	// BuildQuantLlama builds the synthetic Llama of config cfg in memory
	// (N(0, 1/fan_in) weights, fixed seed) with its linear weights
	// RTN-quantized with o (qlinear_bench_test.go's buildQuantLlama).
	BuildQuantLlama = func(cfg map[string]any, o weights.Options) (*arch.Description, TensorSource) {
		d, src := buildQuantLlama(cfg, o)
		return d, src
	}
	// Q8Width reports whether bits-bit weights in groups of 32 decode
	// on int8 activations (q8Capable, qseg.q8).
	Q8Width = func(bits int) bool { return q8Capable(bits, 32) }
	// CheckQ8Logits checks logits on int8 activations against the float
	// path's with the one acceptance criterion of every such test
	// (q8logits_test.go).
	CheckQ8Logits = checkQ8Logits
)

// Ragged-batch test helpers (batch_test.go).
var (
	CheckBatchAlone = checkBatchAlone
	MixedPlan       = mixedPlan
)

type BatchPlan = batchPlan
