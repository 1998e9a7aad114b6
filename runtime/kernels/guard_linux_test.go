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
	b := guardedBytes(t, 4*n)
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), n)
}

// guardedBytes is guarded for n bytes (zeroed), the last one just before
// the inaccessible page; its capacity is n.
func guardedBytes(t *testing.T, n int) []byte {
	t.Helper()
	page := unix.Getpagesize()
	data := (n + page - 1) / page * page
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
	return mem[data-n : data : data]
}

const haveGuard = true
