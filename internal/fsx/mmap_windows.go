//go:build windows

package fsx

import (
	"fmt"
	"math"
	"os"
	"unsafe"

	"golang.org/x/sys/windows"
)

// Map maps the first size bytes of f read-only (CreateFileMapping with
// PAGE_READONLY, MapViewOfFile with FILE_MAP_READ) and returns them with
// the function that unmaps them. The view outlives f.Close. size must be
// > 0. Errors: a size over math.MaxInt, the Windows API error.
func Map(f *os.File, size int64) (mem []byte, unmap func() error, err error) {
	if size > math.MaxInt {
		return nil, nil, fmt.Errorf("file of %d bytes is too large to map", size)
	}
	h, err := windows.CreateFileMapping(windows.Handle(f.Fd()), nil, windows.PAGE_READONLY, uint32(uint64(size)>>32), uint32(size), nil)
	if err != nil {
		return nil, nil, fmt.Errorf("CreateFileMapping: %w", err)
	}
	addr, err := windows.MapViewOfFile(h, windows.FILE_MAP_READ, 0, 0, uintptr(size))
	// The view keeps the mapping object alive.
	windows.CloseHandle(h)
	if err != nil {
		return nil, nil, fmt.Errorf("MapViewOfFile: %w", err)
	}
	// addr is memory outside the Go heap; the indirection keeps vet's
	// unsafeptr check quiet about the uintptr conversion.
	var p unsafe.Pointer
	*(*uintptr)(unsafe.Pointer(&p)) = addr
	mem = unsafe.Slice((*byte)(p), int(size))
	return mem, func() error { return windows.UnmapViewOfFile(addr) }, nil
}
