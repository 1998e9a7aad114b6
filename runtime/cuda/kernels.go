package cuda

import (
	"embed"
	"fmt"
	"path"
	"regexp"
	"slices"
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
	// direct is set inside Batch.
	direct bool
	// Arch is the compute_XX the PTX was generated for.
	Arch int
}

// LoadKernels compiles (or takes from the disk cache, cacheDir "" for the
// default) every source for d's compute capability and loads it. Errors:
// NVRTC missing (ErrNoNVRTC), *CompileError, driver errors.
func LoadKernels(d *Device, cacheDir string) (*Kernels, error) {
	nv, err := LoadNVRTC()
	if err != nil {
		return nil, err
	}
	arch, err := nv.PickArch(d.CC)
	if err != nil {
		return nil, err
	}
	k := &Kernels{d: d, mod: map[string]*Module{}, Arch: arch}
	for _, s := range Sources() {
		ptx, err := nv.CompileCached(cacheDir, s.Name, s.Code, arch)
		if err != nil {
			k.Close()
			return nil, err
		}
		names := ptxEntries(ptx)
		m, err := d.LoadModule(ptx, names)
		if err != nil {
			k.Close()
			return nil, fmt.Errorf("cuda: loading %s (compute_%d PTX from NVRTC %s) on %s: %w", s.Name, arch, nv.Version(), d.Name, err)
		}
		for _, n := range names {
			k.mod[n] = m
		}
	}
	return k, nil
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

// Batch runs f on the driver thread: the Launch calls f makes go straight
// to the driver instead of one thread hand-off each (a decode step makes
// hundreds). f must not call other Device methods (Upload, Download,
// Alloc, Sync, ...): they would wait for the thread f is running on.
func (k *Kernels) Batch(f func() error) error {
	return k.d.Do(func() error {
		k.direct = true
		defer func() { k.direct = false }()
		return f()
	})
}

// Close unloads the modules.
func (k *Kernels) Close() error {
	seen := map[*Module]bool{}
	for _, m := range k.mod {
		if !seen[m] {
			seen[m] = true
			m.Unload()
		}
	}
	k.mod = nil
	return nil
}
