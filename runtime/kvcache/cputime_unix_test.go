//go:build unix

package kvcache

import (
	goruntime "runtime"
	"syscall"
)

// threadCPU returns the CPU time (user + system) in seconds of the
// calling thread on Linux (getrusage RUSAGE_THREAD = 1) and of the
// process elsewhere, or -1 when unavailable.
func threadCPU() float64 {
	who := syscall.RUSAGE_SELF
	if goos == "linux" {
		who = 1
	}
	var ru syscall.Rusage
	if err := syscall.Getrusage(who, &ru); err != nil {
		return -1
	}
	tv := func(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }
	return tv(ru.Utime) + tv(ru.Stime)
}

const goos = goruntime.GOOS
