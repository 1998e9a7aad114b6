//go:build unix

package fsx

import (
	"fmt"
	"math"
	"os"

	"golang.org/x/sys/unix"
)

// Map maps the first size bytes of f read-only and shared (mmap(2)) and
// returns them with the function that unmaps them. The mapping outlives
// f.Close. size must be > 0. Errors: a size over math.MaxInt, the mmap
// error.
func Map(f *os.File, size int64) (mem []byte, unmap func() error, err error) {
	if size > math.MaxInt {
		return nil, nil, fmt.Errorf("file of %d bytes is too large to map", size)
	}
	mem, err = unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, nil, fmt.Errorf("mmap: %w", err)
	}
	return mem, func() error { return unix.Munmap(mem) }, nil
}
