//go:build unix && !linux

package kernels

import "syscall"

const rusageThread = syscall.RUSAGE_SELF
