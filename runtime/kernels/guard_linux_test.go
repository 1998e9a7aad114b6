//go:build linux

package kernels

import (
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// guarded returns a float32 slice of length n whose last element is the last
// 4 bytes before an inaccessible page, so a kernel that reads or writes even
// one element past the end faults. The memory is unmapped at test cleanup.
func guarded(t *testing.T, n int) []float32 {
	t.Helper()
	page := unix.Getpagesize()
	data := (n*4 + page - 1) / page * page
	mem, err := unix.Mmap(-1, 0, data+page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatalf("mmap %d bytes: %v", data+page, err)
	}
	if err := unix.Mprotect(mem[data:], unix.PROT_NONE); err != nil {
		t.Fatalf("mprotect guard page: %v", err)
	}
	t.Cleanup(func() { unix.Munmap(mem) })
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&mem[data-n*4])), n)
}

const haveGuard = true
