package cuda

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"iter"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"unsafe"

	"github.com/lmpack/lmpack/internal/fsx"
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
	// getCUBINSize and getCUBIN are nil before NVRTC 11.1.
	getCUBINSize func(prog uintptr, n *uintptr) int32
	getCUBIN     func(prog uintptr, buf *byte) int32
}

var (
	nvrtcMu     sync.Mutex
	nvrtcByPath = map[string]*NVRTC{}
)

// nvrtcHint ends the error when no NVRTC library loads.
const nvrtcHint = "set LMPACK_NVRTC to the library file, or install Debian's libnvrtc11.2 or pip's nvidia-cuda-nvrtc-cu12"

// LoadNVRTC opens the first NVRTC library of NVRTCCandidates that loads
// and returns it (each library is opened once per process). Errors wrap
// ErrNoNVRTC and list every path tried with why it failed.
func LoadNVRTC() (*NVRTC, error) {
	if errUnsupportedOS != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoNVRTC, errUnsupportedOS)
	}
	var tried []string
	for nv, err := range nvrtcLibraries() {
		if err != nil {
			tried = append(tried, err.Error())
			continue
		}
		return nv, nil
	}
	return nil, fmt.Errorf("%w: searched %s (%s)", ErrNoNVRTC, strings.Join(tried, "; "), nvrtcHint)
}

// nvrtcLibraries yields every NVRTC library of NVRTCCandidates in order,
// opened (once per process, RTLD_LOCAL so two versions do not bind each
// other's symbols), or an error naming a candidate that did not load.
// The same file reached by two names is yielded once.
func nvrtcLibraries() iter.Seq2[*NVRTC, error] {
	return func(yield func(*NVRTC, error) bool) {
		seen := map[string]bool{}
		for _, c := range NVRTCCandidates() {
			if strings.ContainsRune(c, '/') {
				if _, err := os.Stat(c); err != nil {
					if !yield(nil, fmt.Errorf("%s (absent)", c)) {
						return
					}
					continue
				}
			}
			nv, err := openNVRTC(c)
			if err != nil {
				if !yield(nil, err) {
					return
				}
				continue
			}
			key := nv.Path
			if r, err := filepath.EvalSymlinks(nv.Path); err == nil {
				key = r
			}
			if seen[key] {
				continue
			}
			seen[key] = true
			if !yield(nv, nil) {
				return
			}
		}
	}
}

// openNVRTC dlopens one NVRTC library (a path or a soname) and binds it;
// the result is kept per name.
func openNVRTC(path string) (*NVRTC, error) {
	nvrtcMu.Lock()
	defer nvrtcMu.Unlock()
	if nv, ok := nvrtcByPath[path]; ok {
		return nv, nil
	}
	lib, err := dlopen(path, false)
	if err != nil {
		return nil, fmt.Errorf("%s (%v)", path, err)
	}
	nv, err := bindNVRTC(lib, path)
	if err != nil {
		return nil, fmt.Errorf("%s (%v)", path, err)
	}
	nvrtcByPath[path] = nv
	return nv, nil
}

func bindNVRTC(lib uintptr, path string) (*NVRTC, error) {
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
	if optionalSym(lib, "nvrtcGetCUBIN") && optionalSym(lib, "nvrtcGetCUBINSize") {
		if err := bind(lib, path, map[string]any{"nvrtcGetCUBINSize": &n.getCUBINSize, "nvrtcGetCUBIN": &n.getCUBIN}); err != nil {
			n.getCUBINSize, n.getCUBIN = nil, nil
		}
	}
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

// CUDAVersion is the version in cuDriverGetVersion's encoding,
// major·1000 + minor·10 (11.8 → 11080).
func (n *NVRTC) CUDAVersion() int { return n.Major*1000 + n.Minor*10 }

// HasCUBIN reports whether this NVRTC can return machine code
// (nvrtcGetCUBIN, NVRTC ≥ 11.1).
func (n *NVRTC) HasCUBIN() bool { return n.getCUBIN != nil }

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
	img, err := n.Build(name, source, Target{Arch: arch})
	if err != nil {
		return "", err
	}
	return string(img.Data), nil
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

// Target is what NVRTC is asked to produce: PTX for the virtual
// architecture compute_<Arch> (JIT-compiled by the driver at load, which
// needs a driver at least as new as the NVRTC), or, when Cubin is set,
// machine code (CUBIN) for the real architecture sm_<Arch>, which the
// driver loads as is (it runs only on devices of that compute capability).
type Target struct {
	Arch  int
	Cubin bool
}

// String is NVRTC's --gpu-architecture value: "compute_80" or "sm_90".
func (t Target) String() string {
	if t.Cubin {
		return fmt.Sprintf("sm_%d", t.Arch)
	}
	return fmt.Sprintf("compute_%d", t.Arch)
}

// kind is the output kind, "ptx" or "cubin" (also the cache file's
// extension).
func (t Target) kind() string {
	if t.Cubin {
		return "cubin"
	}
	return "ptx"
}

// Image is one compiled kernel source: the bytes cuModuleLoadData takes
// (PTX text without the trailing NUL, or a CUBIN ELF image) and the kernel
// entry points it holds.
type Image struct {
	Target  Target
	Data    []byte
	Entries []string
}

// Build compiles CUDA C++ source (named name in messages) for t: PTX, or
// CUBIN when t.Cubin (NVRTC ≥ 11.1; the entry points are read from the
// PTX NVRTC also returns). Errors: a *CompileError with NVRTC's log, an
// NVRTC without CUBIN output asked for one, NVRTC's error string.
func (n *NVRTC) Build(name, source string, t Target) (*Image, error) {
	if t.Cubin && !n.HasCUBIN() {
		return nil, fmt.Errorf("cuda: NVRTC %s (%s) cannot produce CUBIN (nvrtcGetCUBIN needs NVRTC ≥ 11.1)", n.Version(), n.Path)
	}
	opts := append([]string{"--gpu-architecture=" + t.String()}, compileOptions...)
	prog, _, err := n.compile(name, source, opts)
	if err != nil {
		return nil, err
	}
	defer n.destroyProgram(&prog)
	ptx, err := n.output(prog, name, "PTX", n.getPTXSize, n.getPTX)
	if err != nil {
		return nil, err
	}
	ptx = bytes.TrimRight(ptx, "\x00")
	img := &Image{Target: t, Data: ptx, Entries: ptxEntries(string(ptx))}
	if t.Cubin {
		if img.Data, err = n.output(prog, name, "CUBIN", n.getCUBINSize, n.getCUBIN); err != nil {
			return nil, err
		}
	}
	return img, nil
}

// output reads one of a compiled program's outputs (PTX or CUBIN).
func (n *NVRTC) output(prog uintptr, name, what string, size func(uintptr, *uintptr) int32, get func(uintptr, *byte) int32) ([]byte, error) {
	var sz uintptr
	if r := size(prog, &sz); r != 0 || sz == 0 {
		return nil, fmt.Errorf("cuda: nvrtcGet%sSize(%s): %s (size %d)", what, name, n.errorString(r), sz)
	}
	b := make([]byte, sz)
	if r := get(prog, &b[0]); r != 0 {
		return nil, fmt.Errorf("cuda: nvrtcGet%s(%s): %s", what, name, n.errorString(r))
	}
	return b, nil
}

// CacheKey returns the on-disk cache file name of source built for t by
// this NVRTC: SHA-256 over the source and the options, then the target
// (which names the output kind and arch), the NVRTC version and the kind
// as the extension, e.g. "<hash>-sm_90-nvrtc12.4.cubin".
func (n *NVRTC) CacheKey(source string, t Target) string {
	h := sha256.New()
	h.Write([]byte(source))
	h.Write([]byte(strings.Join(compileOptions, "\x00")))
	return fmt.Sprintf("%s-%s-nvrtc%d.%d.%s", hex.EncodeToString(h.Sum(nil))[:32], t, n.Major, n.Minor, t.kind())
}

// cubinMagic starts a cached CUBIN file: the magic, the entry points
// separated by spaces, a newline, then the ELF image.
const cubinMagic = "lmpack-cubin-v1 "

// BuildCached is Build with an on-disk cache in dir (empty:
// os.UserCacheDir()/lmpack/cuda; caching is skipped when that is
// unavailable). A PTX file holds the PTX text; a CUBIN file holds a line
// listing the entry points, then the image. An unreadable or malformed
// cache file is rebuilt; one that cannot be written is not an error.
func (n *NVRTC) BuildCached(dir, name, source string, t Target) (*Image, error) {
	if dir == "" {
		if d, err := os.UserCacheDir(); err == nil {
			dir = filepath.Join(d, "lmpack", "cuda")
		}
	}
	var path string
	if dir != "" {
		path = filepath.Join(dir, n.CacheKey(source, t))
		if b, err := os.ReadFile(path); err == nil && len(b) > 0 {
			if img := decodeCached(b, t); img != nil {
				return img, nil
			}
		}
	}
	img, err := n.Build(name, source, t)
	if err != nil {
		return nil, err
	}
	if path != "" {
		b := img.Data
		if t.Cubin {
			b = append([]byte(cubinMagic+strings.Join(img.Entries, " ")+"\n"), img.Data...)
		}
		writeAtomic(dir, path, b)
	}
	return img, nil
}

// decodeCached parses a cache file written by BuildCached, or returns nil.
func decodeCached(b []byte, t Target) *Image {
	if !t.Cubin {
		return &Image{Target: t, Data: b, Entries: ptxEntries(string(b))}
	}
	rest, ok := bytes.CutPrefix(b, []byte(cubinMagic))
	if !ok {
		return nil
	}
	line, data, ok := bytes.Cut(rest, []byte("\n"))
	if !ok || len(data) == 0 {
		return nil
	}
	return &Image{Target: t, Data: data, Entries: strings.Fields(string(line))}
}

// writeAtomic writes b to path (in dir, created if needed) atomically
// (fsx.WriteBytes); failures leave no partial file and are ignored (a
// cache).
func writeAtomic(dir, path string, b []byte) {
	if os.MkdirAll(dir, 0o755) != nil {
		return
	}
	_ = fsx.WriteBytes(path, b, 0o644)
}
