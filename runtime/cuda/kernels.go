package cuda

import (
	"embed"
	"errors"
	"fmt"
	"iter"
	"path"
	"regexp"
	"slices"
	"strings"
)

//go:embed kernels/*.cu kernels/common.cuh
var kernelFS embed.FS

// Source is one embedded kernel source file, compiled by NVRTC as its own
// program (common.cuh prepended).
type Source struct {
	// Name is the file name, e.g. "attention.cu".
	Name string
	// Code is the full program text (common.cuh, then the file).
	Code string
	// Kernels are the extern "C" __global__ functions it spells out
	// (kernels made by macros, like attn_split_g8, appear only in the PTX:
	// see ptxEntries).
	Kernels []string
}

var (
	kernelRE = regexp.MustCompile(`extern "C" __global__ void ([A-Za-z0-9_]+)\(`)
	entryRE  = regexp.MustCompile(`\.entry ([A-Za-z0-9_]+)\(`)
)

// ptxEntries returns the kernel entry points of PTX text, in order.
func ptxEntries(ptx string) []string {
	var out []string
	for _, m := range entryRE.FindAllStringSubmatch(ptx, -1) {
		out = append(out, m[1])
	}
	return out
}

// Sources returns every embedded kernel source, sorted by name.
func Sources() []Source {
	common, err := kernelFS.ReadFile("kernels/common.cuh")
	if err != nil {
		panic(err) // embedded at build time
	}
	ents, _ := kernelFS.ReadDir("kernels")
	var out []Source
	for _, e := range ents {
		if path.Ext(e.Name()) != ".cu" {
			continue
		}
		b, _ := kernelFS.ReadFile("kernels/" + e.Name())
		s := Source{Name: e.Name(), Code: string(common) + "\n#line 1 \"" + e.Name() + "\"\n" + string(b)}
		for _, m := range kernelRE.FindAllStringSubmatch(string(b), -1) {
			s.Kernels = append(s.Kernels, m[1])
		}
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b Source) int {
		if a.Name < b.Name {
			return -1
		}
		if a.Name > b.Name {
			return 1
		}
		return 0
	})
	return out
}

// Kernels is the device code of every embedded source, loaded on one
// device: kernel name → module.
type Kernels struct {
	d   *Device
	mod map[string]*Module
	// direct is set on the handle Batch passes to its function.
	direct bool
	// Arch is the architecture the images were built for (compute_XX PTX
	// or sm_XX CUBIN, see Target).
	Arch int
	// Target is what was loaded; NVRTC the library that built it.
	Target Target
	NVRTC  *NVRTC
}

// ErrKernels is wrapped when no NVRTC library found produces kernels this
// driver and device load (each attempt is named in the message).
var ErrKernels = errors.New("cuda: the kernels cannot be loaded")

// LoadKernels compiles (or takes from the disk cache, cacheDir "" for the
// default) every embedded source and loads it on d. It tries each NVRTC
// library of NVRTCCandidates in order and, for each, CUBIN for the
// device's architecture first (when that NVRTC can make it), then PTX,
// skipping PTX from an NVRTC newer than the driver (the driver would
// reject it); an image the driver rejects (CUDA_ERROR_UNSUPPORTED_PTX_
// VERSION, NO_BINARY_FOR_GPU, INVALID_IMAGE, INVALID_PTX) or a source
// that NVRTC fails to compile moves on to the next choice. Errors:
// ErrNoNVRTC (no NVRTC library loads), ErrKernels (every choice failed,
// each named with why), other driver errors.
func LoadKernels(d *Device, cacheDir string) (*Kernels, error) {
	return loadKernels(d, cacheDir, Sources())
}

func loadKernels(d *Device, cacheDir string, srcs []Source) (*Kernels, error) {
	mods, nv, tg, err := loadImages(nvrtcLibraries(), d.CC, d.DriverVersion, cacheDir, srcs, d.LoadImage, func(m *Module) { m.Unload() })
	if err != nil {
		return nil, fmt.Errorf("%w (device %s, compute capability %d.%d, driver CUDA %s)", err, d.Name, d.CC/10, d.CC%10, cudaVersionString(d.DriverVersion))
	}
	return &Kernels{d: d, mod: mods, Arch: tg.Arch, Target: tg, NVRTC: nv}, nil
}

// cudaVersionString formats cuDriverGetVersion's 12040 as "12.4".
func cudaVersionString(v int) string { return fmt.Sprintf("%d.%d", v/1000, v%1000/10) }

// targets returns what to ask nv for on a device of compute capability cc
// under a driver of CUDA version drv (major·1000+minor·10; 0 = unknown),
// in order of preference: CUBIN for the newest supported sm_XX ≤ cc of
// the device's major (NVRTC ≥ 11.1, not from a newer CUDA major than the
// driver's), then PTX for compute_XX unless this NVRTC is newer than the
// driver. An empty list comes with the reason.
func targets(nv *NVRTC, cc, drv int) ([]Target, string) {
	arch, err := nv.PickArch(cc)
	if err != nil {
		return nil, err.Error()
	}
	var ts []Target
	if nv.HasCUBIN() && arch/10 == cc/10 && (drv == 0 || nv.Major <= drv/1000) {
		ts = append(ts, Target{Arch: arch, Cubin: true})
	}
	if drv == 0 || nv.CUDAVersion() <= drv {
		ts = append(ts, Target{Arch: arch})
	}
	if len(ts) == 0 {
		return nil, fmt.Sprintf("NVRTC %s is newer than the driver's CUDA %s (the driver rejects its PTX) and cannot make CUBIN for this device", nv.Version(), cudaVersionString(drv))
	}
	return ts, ""
}

// imageRejected reports whether err is the driver refusing an image it
// cannot use (so another target or NVRTC may work): CUDA_ERROR_INVALID_
// IMAGE (200), NO_BINARY_FOR_GPU (209), INVALID_PTX (218),
// JIT_COMPILER_NOT_FOUND (221), UNSUPPORTED_PTX_VERSION (222),
// JIT_COMPILATION_DISABLED (223).
func imageRejected(err error) bool {
	var ce *cuError
	if !errors.As(err, &ce) {
		return false
	}
	switch ce.code {
	case 200, 209, 218, 221, 222, 223:
		return true
	}
	return false
}

// loadImages builds every source with the first (NVRTC, target) choice
// whose images load (see LoadKernels) and returns kernel name → module.
// load and unload stand for Device.LoadImage and Module.Unload (tests
// fake them).
func loadImages[M comparable](libs iter.Seq2[*NVRTC, error], cc, drv int, cacheDir string, srcs []Source,
	load func(*Image) (M, error), unload func(M)) (map[string]M, *NVRTC, Target, error) {
	var tried []string
	anyLib := false
	seenVer := map[string]bool{}
	for nv, err := range libs {
		if err != nil {
			tried = append(tried, err.Error())
			continue
		}
		anyLib = true
		if seenVer[nv.Version()] {
			continue
		}
		seenVer[nv.Version()] = true
		ts, why := targets(nv, cc, drv)
		if len(ts) == 0 {
			tried = append(tried, fmt.Sprintf("%s: %s", nv.Path, why))
			continue
		}
		for _, tg := range ts {
			mods, err := buildAndLoad(nv, tg, cacheDir, srcs, load, unload)
			if err == nil {
				return mods, nv, tg, nil
			}
			var cerr *CompileError
			if !imageRejected(err) && !errors.As(err, &cerr) {
				return nil, nil, Target{}, err
			}
			tried = append(tried, fmt.Sprintf("%s: NVRTC %s %s: %v", nv.Path, nv.Version(), tg, err))
		}
	}
	if !anyLib {
		return nil, nil, Target{}, fmt.Errorf("%w: searched %s (%s)", ErrNoNVRTC, strings.Join(tried, "; "), nvrtcHint)
	}
	return nil, nil, Target{}, fmt.Errorf("%w: tried %s", ErrKernels, strings.Join(tried, "; "))
}

// buildAndLoad builds and loads every source for tg; on an error the
// modules loaded so far are unloaded.
func buildAndLoad[M comparable](nv *NVRTC, tg Target, cacheDir string, srcs []Source, load func(*Image) (M, error), unload func(M)) (map[string]M, error) {
	mods := map[string]M{}
	var loaded []M
	fail := func(err error) (map[string]M, error) {
		for _, m := range loaded {
			unload(m)
		}
		return nil, err
	}
	for _, s := range srcs {
		img, err := nv.BuildCached(cacheDir, s.Name, s.Code, tg)
		if err != nil {
			return fail(err)
		}
		m, err := load(img)
		if err != nil {
			return fail(fmt.Errorf("loading %s: %w", s.Name, err))
		}
		loaded = append(loaded, m)
		for _, n := range img.Entries {
			mods[n] = m
		}
	}
	return mods, nil
}

// Launch queues kernel name (see Module.Launch).
func (k *Kernels) Launch(name string, grid, block Dim, args ...any) error {
	return k.LaunchShared(name, grid, block, 0, args...)
}

// LaunchShared is Launch with shmem bytes of dynamic shared memory.
func (k *Kernels) LaunchShared(name string, grid, block Dim, shmem int, args ...any) error {
	m, ok := k.mod[name]
	if !ok {
		return fmt.Errorf("cuda: no kernel %q in the embedded sources", name)
	}
	return m.launch(k.direct, name, grid, block, shmem, args...)
}

// Batch runs f on the driver thread with a handle whose Launch calls go
// straight to the driver instead of one thread hand-off each (a decode
// step makes hundreds). f must launch through that handle only, and must
// not call Device methods (Upload, Download, Alloc, Sync, ...): they would
// wait for the thread f is running on. Launches through k itself from
// other goroutines meanwhile are queued as usual.
func (k *Kernels) Batch(f func(b *Kernels) error) error {
	b := *k
	b.direct = true
	return k.d.Do(func() error { return f(&b) })
}

// Close unloads the modules and returns the first unload error.
func (k *Kernels) Close() error {
	seen := map[*Module]bool{}
	var first error
	for _, m := range k.mod {
		if !seen[m] {
			seen[m] = true
			if err := m.Unload(); err != nil && first == nil {
				first = err
			}
		}
	}
	k.mod = nil
	return first
}
