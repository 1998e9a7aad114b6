package cuda

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"unsafe"
)

// NVRTC is a loaded NVRTC library.
type NVRTC struct {
	// Path is the library file (or soname) that was opened.
	Path string
	// Major and Minor are nvrtcVersion's result (e.g. 11, 8).
	Major, Minor int
	// Archs are the virtual architectures it compiles for (e.g. 35..90),
	// from nvrtcGetSupportedArchs; nil when the library predates it.
	Archs []int

	createProgram  func(prog *uintptr, src, name *byte, nh int32, headers, names unsafe.Pointer) int32
	compileProgram func(prog uintptr, nopt int32, opts unsafe.Pointer) int32
	destroyProgram func(prog *uintptr) int32
	getLogSize     func(prog uintptr, n *uintptr) int32
	getLog         func(prog uintptr, buf *byte) int32
	getPTXSize     func(prog uintptr, n *uintptr) int32
	getPTX         func(prog uintptr, buf *byte) int32
	errorString    func(res int32) string
}

var (
	nvrtcOnce sync.Once
	nvrtcLib  *NVRTC
	nvrtcErr  error
)

// LoadNVRTC opens NVRTC once (search order: NVRTCCandidates) and returns
// it. Errors wrap ErrNoNVRTC and list every path tried.
func LoadNVRTC() (*NVRTC, error) {
	nvrtcOnce.Do(func() { nvrtcLib, nvrtcErr = loadNVRTC() })
	return nvrtcLib, nvrtcErr
}

func loadNVRTC() (*NVRTC, error) {
	lib, path, err := dlopenFirst(ErrNoNVRTC, NVRTCCandidates())
	if err != nil {
		return nil, fmt.Errorf("%w (set LMPACK_NVRTC to the library file, or install Debian's libnvrtc11.2 or pip's nvidia-cuda-nvrtc-cu12)", err)
	}
	n := &NVRTC{Path: path}
	var version func(major, minor *int32) int32
	if err := bind(lib, path, map[string]any{
		"nvrtcVersion":           &version,
		"nvrtcCreateProgram":     &n.createProgram,
		"nvrtcCompileProgram":    &n.compileProgram,
		"nvrtcDestroyProgram":    &n.destroyProgram,
		"nvrtcGetProgramLogSize": &n.getLogSize,
		"nvrtcGetProgramLog":     &n.getLog,
		"nvrtcGetPTXSize":        &n.getPTXSize,
		"nvrtcGetPTX":            &n.getPTX,
		"nvrtcGetErrorString":    &n.errorString,
	}); err != nil {
		return nil, err
	}
	var ma, mi int32
	if r := version(&ma, &mi); r != 0 {
		return nil, fmt.Errorf("cuda: %s: nvrtcVersion failed: %s", path, n.errorString(r))
	}
	n.Major, n.Minor = int(ma), int(mi)
	if optionalSym(lib, "nvrtcGetSupportedArchs") {
		var num func(n *int32) int32
		var archs func(a *int32) int32
		if err := bind(lib, path, map[string]any{"nvrtcGetNumSupportedArchs": &num, "nvrtcGetSupportedArchs": &archs}); err == nil {
			var k int32
			if num(&k) == 0 && k > 0 {
				a := make([]int32, k)
				if archs(&a[0]) == 0 {
					for _, x := range a {
						n.Archs = append(n.Archs, int(x))
					}
				}
			}
		}
	}
	return n, nil
}

// Version returns "major.minor".
func (n *NVRTC) Version() string { return fmt.Sprintf("%d.%d", n.Major, n.Minor) }

// PickArch returns the virtual architecture to compile for on a device of
// compute capability cc (major·10+minor): the newest supported one ≤ cc,
// or cc itself when the supported list is unknown. Errors when every
// supported architecture is newer than the device.
func (n *NVRTC) PickArch(cc int) (int, error) {
	if len(n.Archs) == 0 {
		return cc, nil
	}
	best := 0
	for _, a := range n.Archs {
		if a <= cc && a > best {
			best = a
		}
	}
	if best == 0 {
		return 0, fmt.Errorf("cuda: NVRTC %s (%s) supports compute_%d..compute_%d, none ≤ the device's %d", n.Version(), n.Path, n.Archs[0], n.Archs[len(n.Archs)-1], cc)
	}
	return best, nil
}

// CompileError is returned by Compile when NVRTC rejects the source; Log
// is NVRTC's program log.
type CompileError struct {
	Name, Arch string
	Log        string
}

func (e *CompileError) Error() string {
	return fmt.Sprintf("cuda: NVRTC failed to compile %s for %s:\n%s", e.Name, e.Arch, e.Log)
}

// compileOptions are the NVRTC flags every kernel source is built with
// (besides --gpu-architecture). The sources need only C++11, so the
// dialect is left at each NVRTC's default (newer releases drop old
// --std values). No -lineinfo: with it NVRTC 11.8's ptxas crashed
// (SIGSEGV) building attention.cu for sm_90.
var compileOptions = []string{"-default-device"}

// Compile compiles CUDA C++ source (named name in messages) to PTX for
// compute_<arch> (e.g. 80) and returns the NUL-free PTX text. Errors: a
// *CompileError with NVRTC's log, or NVRTC's error string.
func (n *NVRTC) Compile(name, source string, arch int) (string, error) {
	opts := append([]string{fmt.Sprintf("--gpu-architecture=compute_%d", arch)}, compileOptions...)
	prog, _, err := n.compile(name, source, opts)
	if err != nil {
		return "", err
	}
	defer n.destroyProgram(&prog)
	var sz uintptr
	if r := n.getPTXSize(prog, &sz); r != 0 || sz == 0 {
		return "", fmt.Errorf("cuda: nvrtcGetPTXSize(%s): %s", name, n.errorString(r))
	}
	ptx := make([]byte, sz)
	if r := n.getPTX(prog, &ptx[0]); r != 0 {
		return "", fmt.Errorf("cuda: nvrtcGetPTX(%s): %s", name, n.errorString(r))
	}
	return strings.TrimRight(string(ptx), "\x00"), nil
}

// compile runs NVRTC on source with opts and returns the program (to be
// destroyed by the caller) and its log; on failure the program is
// destroyed and the error is a *CompileError.
func (n *NVRTC) compile(name, source string, opts []string) (uintptr, string, error) {
	src := append([]byte(source), 0)
	nm := append([]byte(name), 0)
	var prog uintptr
	if r := n.createProgram(&prog, &src[0], &nm[0], 0, nil, nil); r != 0 {
		return 0, "", fmt.Errorf("cuda: nvrtcCreateProgram(%s): %s", name, n.errorString(r))
	}
	cstrs := make([][]byte, len(opts))
	ptrs := make([]uintptr, len(opts))
	for i, o := range opts {
		cstrs[i] = append([]byte(o), 0)
		ptrs[i] = uintptr(unsafe.Pointer(&cstrs[i][0]))
	}
	r := n.compileProgram(prog, int32(len(opts)), unsafe.Pointer(&ptrs[0]))
	runtime.KeepAlive(cstrs)
	log := n.log(prog)
	if r != 0 {
		n.destroyProgram(&prog)
		arch := ""
		for _, o := range opts {
			if a, ok := strings.CutPrefix(o, "--gpu-architecture="); ok {
				arch = a
			}
		}
		return 0, "", &CompileError{Name: name, Arch: arch, Log: log + "\n(" + n.errorString(r) + ")"}
	}
	return prog, log, nil
}

// PtxasInfo compiles source to machine code for sm_<arch> with ptxas
// verbose output and returns NVRTC's log (registers, shared memory,
// spills per kernel). Errors: a *CompileError.
func (n *NVRTC) PtxasInfo(name, source string, arch int) (string, error) {
	opts := append([]string{fmt.Sprintf("--gpu-architecture=sm_%d", arch), "--ptxas-options=-v"}, compileOptions...)
	prog, log, err := n.compile(name, source, opts)
	if err != nil {
		return "", err
	}
	n.destroyProgram(&prog)
	return log, nil
}

func (n *NVRTC) log(prog uintptr) string {
	var sz uintptr
	if n.getLogSize(prog, &sz) != 0 || sz <= 1 {
		return ""
	}
	b := make([]byte, sz)
	if n.getLog(prog, &b[0]) != 0 {
		return ""
	}
	return strings.TrimRight(string(b), "\x00")
}

// CacheKey returns the on-disk cache key of source compiled for arch by
// this NVRTC: SHA-256 over the source and the options, the arch and the
// NVRTC version.
func (n *NVRTC) CacheKey(source string, arch int) string {
	h := sha256.New()
	h.Write([]byte(source))
	h.Write([]byte(strings.Join(compileOptions, "\x00")))
	return fmt.Sprintf("%s-sm%d-nvrtc%d.%d", hex.EncodeToString(h.Sum(nil))[:32], arch, n.Major, n.Minor)
}

// CompileCached is Compile with an on-disk cache in dir (empty:
// os.UserCacheDir()/lmpack/cuda; caching is skipped when that is
// unavailable). A cache file that cannot be written is not an error.
func (n *NVRTC) CompileCached(dir, name, source string, arch int) (string, error) {
	if dir == "" {
		if d, err := os.UserCacheDir(); err == nil {
			dir = filepath.Join(d, "lmpack", "cuda")
		}
	}
	var path string
	if dir != "" {
		path = filepath.Join(dir, n.CacheKey(source, arch)+".ptx")
		if b, err := os.ReadFile(path); err == nil && len(b) > 0 {
			return string(b), nil
		}
	}
	ptx, err := n.Compile(name, source, arch)
	if err != nil {
		return "", err
	}
	if path != "" {
		writeAtomic(dir, path, []byte(ptx))
	}
	return ptx, nil
}

// writeAtomic writes b to path through a temporary file in dir renamed
// into place; failures leave no partial file and are ignored (a cache).
func writeAtomic(dir, path string, b []byte) {
	if os.MkdirAll(dir, 0o755) != nil {
		return
	}
	f, err := os.CreateTemp(dir, ".ptx-*")
	if err != nil {
		return
	}
	_, werr := f.Write(b)
	cerr := f.Close()
	if werr != nil || cerr != nil || os.Rename(f.Name(), path) != nil {
		os.Remove(f.Name())
	}
}
