//go:build !unix && !windows

package fsx

import (
	"fmt"
	"math"
	"os"
)

// Map reads the first size bytes of f into memory (platforms without
// mmap, e.g. wasip1); unmap does nothing. Errors: a size over
// math.MaxInt, read errors.
func Map(f *os.File, size int64) (mem []byte, unmap func() error, err error) {
	if size > math.MaxInt {
		return nil, nil, fmt.Errorf("file of %d bytes is too large to read", size)
	}
	mem = make([]byte, size)
	if n, err := f.ReadAt(mem, 0); n < len(mem) {
		return nil, nil, fmt.Errorf("read %d of %d bytes: %w", n, size, err)
	}
	return mem, func() error { return nil }, nil
}
