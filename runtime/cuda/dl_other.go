//go:build !linux

package cuda

import (
	"fmt"
	"runtime"
)

// errUnsupportedOS is wrapped by every error of a library load here: the
// backend loads libcuda.so.1 and libnvrtc.so.* through the Linux dynamic
// loader (NVIDIA ships no CUDA for macOS; the Windows DLLs, nvcuda.dll and
// nvrtc64_*.dll, are not wired up).
var errUnsupportedOS = fmt.Errorf("%w (%s)", ErrUnsupportedOS, runtime.GOOS)

// dlopen fails: see errUnsupportedOS.
func dlopen(name string, global bool) (uintptr, error) { return 0, errUnsupportedOS }

// dlsym fails: see errUnsupportedOS.
func dlsym(lib uintptr, name string) error { return errUnsupportedOS }

// registerLibFunc is never reached (dlopen fails first).
func registerLibFunc(fp any, lib uintptr, name string) { panic(errUnsupportedOS) }
