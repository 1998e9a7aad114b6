package runtime

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
	// Q8Width reports whether bits-bit weights in groups of 32 decode
	// on int8 activations (q8Capable, qseg.q8).
	Q8Width = func(bits int) bool { return q8Capable(bits, 32) }
)

// Ragged-batch test helpers (batch_test.go).
var (
	CheckBatchAlone = checkBatchAlone
	MixedPlan       = mixedPlan
)

type BatchPlan = batchPlan
