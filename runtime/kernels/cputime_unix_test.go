//go:build unix

package kernels

import "syscall"

// threadCPUSeconds returns the CPU time (user + system) of the calling
// thread in seconds (getrusage RUSAGE_THREAD on Linux, the process
// elsewhere), or -1: benchmarks that pin their goroutine to a thread
// measure CPU time per operation with it, which other processes on a
// shared machine do not dilute.
func threadCPUSeconds() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(rusageThread, &ru); err != nil {
		return -1
	}
	tv := func(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }
	return tv(ru.Utime) + tv(ru.Stime)
}
