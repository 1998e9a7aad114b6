package cuda

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// ErrNoDriver is wrapped by the errors returned when libcuda.so.1 cannot
// be opened or has no usable device; ErrNoNVRTC when no NVRTC library is
// found. Both messages name every location searched.
var (
	ErrNoDriver = errors.New("cuda: no CUDA driver")
	ErrNoNVRTC  = errors.New("cuda: no NVRTC library")
	// ErrNoDevice: the driver loaded but reports no CUDA device.
	ErrNoDevice = errors.New("cuda: no CUDA device")
	// ErrUnsupportedOS is wrapped (with ErrNoDriver or ErrNoNVRTC) on
	// operating systems other than Linux, where the backend cannot load
	// its libraries; the CPU backend runs everywhere.
	ErrUnsupportedOS = errors.New("the CUDA backend is unsupported on this OS")
)

// nvrtcSonames are the NVRTC sonames tried through the dynamic loader, in
// order (CUDA 13, 12, 11.2–11.8; 11.x keeps the 11.2 soname).
var nvrtcSonames = []string{"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2"}

// NVRTCCandidates returns the NVRTC paths FindNVRTC tries, in order:
// $LMPACK_NVRTC (a file, or a directory searched for the sonames),
// $CUDA_HOME/lib64/<soname>, the bare sonames (resolved by the dynamic
// loader: LD_LIBRARY_PATH, ld.so.cache), /usr/local/cuda/lib64, then
// <site-packages>/nvidia/*/lib/<soname> (pip's nvidia-cuda-nvrtc wheels)
// under $VIRTUAL_ENV/lib, ~/.local/lib, /usr/local/lib, /usr/lib,
// /opt/conda/lib and /opt/*/.venv/lib.
func NVRTCCandidates() []string {
	var out []string
	inDir := func(dir string) {
		for _, s := range nvrtcSonames {
			out = append(out, filepath.Join(dir, s))
		}
	}
	if p := os.Getenv("LMPACK_NVRTC"); p != "" {
		if st, err := os.Stat(p); err == nil && st.IsDir() {
			inDir(p)
		} else {
			out = append(out, p)
		}
	}
	if h := os.Getenv("CUDA_HOME"); h != "" {
		inDir(filepath.Join(h, "lib64"))
	}
	out = append(out, nvrtcSonames...)
	inDir("/usr/local/cuda/lib64")
	for _, d := range wheelLibDirs() {
		inDir(d)
	}
	return out
}

// wheelLibDirs lists site-packages/nvidia/*/lib directories of the pip
// wheels (nvidia-cuda-nvrtc-cu12 and friends), sorted.
func wheelLibDirs() []string {
	var roots []string
	if v := os.Getenv("VIRTUAL_ENV"); v != "" {
		roots = append(roots, filepath.Join(v, "lib"))
	}
	if h, err := os.UserHomeDir(); err == nil {
		roots = append(roots, filepath.Join(h, ".local", "lib"))
	}
	roots = append(roots, "/usr/local/lib", "/usr/lib", "/opt/conda/lib")
	// Virtual environments under /opt (e.g. /opt/torch/.venv).
	venvs, _ := filepath.Glob("/opt/*/.venv/lib")
	sort.Strings(venvs)
	roots = append(roots, venvs...)
	var dirs []string
	for _, r := range roots {
		for _, sp := range []string{"site-packages", "dist-packages"} {
			m, _ := filepath.Glob(filepath.Join(r, "python3*", sp, "nvidia", "*", "lib"))
			sort.Strings(m)
			dirs = append(dirs, m...)
		}
		m, _ := filepath.Glob(filepath.Join(r, "site-packages", "nvidia", "*", "lib"))
		sort.Strings(m)
		dirs = append(dirs, m...)
	}
	return dirs
}

// dlopenFirst opens the first candidate the dynamic loader accepts and
// returns its handle and path; the error wraps base and names every
// candidate with its dlopen error.
func dlopenFirst(base error, cands []string) (uintptr, string, error) {
	if errUnsupportedOS != nil {
		return 0, "", fmt.Errorf("%w: %w", base, errUnsupportedOS)
	}
	var tried []string
	for _, c := range cands {
		if strings.ContainsRune(c, '/') {
			if _, err := os.Stat(c); err != nil {
				tried = append(tried, c+" (absent)")
				continue
			}
		}
		h, err := dlopen(c, true)
		if err == nil {
			return h, c, nil
		}
		tried = append(tried, fmt.Sprintf("%s (%v)", c, err))
	}
	return 0, "", fmt.Errorf("%w: searched %s", base, strings.Join(tried, "; "))
}

// bind registers each symbol of lib into the function pointer fns[name];
// a missing symbol is an error naming the library.
func bind(lib uintptr, path string, fns map[string]any) error {
	for name, fp := range fns {
		if err := dlsym(lib, name); err != nil {
			return fmt.Errorf("cuda: %s lacks symbol %s: %w", path, name, err)
		}
		registerLibFunc(fp, lib, name)
	}
	return nil
}

// optionalSym reports whether lib exports name.
func optionalSym(lib uintptr, name string) bool {
	return dlsym(lib, name) == nil
}
