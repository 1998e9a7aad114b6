//go:build !unix

package safetensors

import (
	"fmt"
	"io"
	"math"
	"os"
)

// mapFile reads size bytes of f into memory (platforms without mmap).
func mapFile(f *os.File, size int64) ([]byte, func() error, error) {
	if size > math.MaxInt {
		return nil, nil, fmt.Errorf("file of %d bytes is too large to read", size)
	}
	mem := make([]byte, size)
	if _, err := io.ReadFull(f, mem); err != nil {
		return nil, nil, err
	}
	return mem, func() error { return nil }, nil
}
