//go:build linux

package kernels

const rusageThread = 1 // RUSAGE_THREAD
