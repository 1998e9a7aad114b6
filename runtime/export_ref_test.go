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
	// Q8Width reports whether bits-bit weights decode on int8
	// activations (q8Widths).
	Q8Width = func(bits int) bool { return q8Widths[bits] }
)
