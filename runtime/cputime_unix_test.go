//go:build unix

package runtime

import "syscall"

// processCPUSeconds returns the user plus system CPU time of this process
// in seconds (getrusage RUSAGE_SELF), or -1 when unavailable. A
// one-thread benchmark divides its work by it to measure throughput per
// CPU-second, which other processes on a shared machine do not dilute
// (their load only lengthens the wall time).
func processCPUSeconds() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return -1
	}
	tv := func(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }
	return tv(ru.Utime) + tv(ru.Stime)
}
