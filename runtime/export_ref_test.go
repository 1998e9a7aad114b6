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
	With            = with
)

// Ragged-batch test helpers (batch_test.go).
var (
	CheckBatchAlone = checkBatchAlone
	MixedPlan       = mixedPlan
)

type BatchPlan = batchPlan
