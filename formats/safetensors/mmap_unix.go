//go:build unix

package safetensors

import (
	"fmt"
	"math"
	"os"

	"golang.org/x/sys/unix"
)

// mapFile maps size bytes of f read-only and shared. The returned release
// function unmaps them. size must be > 0.
func mapFile(f *os.File, size int64) ([]byte, func() error, error) {
	if size > math.MaxInt {
		return nil, nil, fmt.Errorf("file of %d bytes is too large to map", size)
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, nil, fmt.Errorf("mmap: %w", err)
	}
	return mem, func() error { return unix.Munmap(mem) }, nil
}
