package cuda

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// nvrtcForTest loads NVRTC. Without one the test skips, naming the
// library (Debian's libnvrtc11.2 installs libnvrtc.so.11.2), so that
// `make test` passes on a machine without it; with LMPACK_REQUIRE_NVRTC=1
// (set by .ci/run, which installs it) the skip is a failure.
func nvrtcForTest(t *testing.T) *NVRTC {
	t.Helper()
	nv, err := LoadNVRTC()
	if err != nil {
		const msg = "libnvrtc.so.11.2 (or libnvrtc.so.12/13) not found: install Debian's libnvrtc11.2 (bookworm non-free) or set LMPACK_NVRTC to the library"
		if os.Getenv("LMPACK_REQUIRE_NVRTC") == "1" {
			t.Fatalf("LMPACK_REQUIRE_NVRTC=1 and %s: %v", msg, err)
		}
		t.Skipf("%s (LMPACK_REQUIRE_NVRTC=1 makes this a failure): %v", msg, err)
	}
	return nv
}

// TestCompileKernels compiles every embedded source to PTX for compute_80
// and compute_90 and to CUBIN for sm_90, and logs the sizes (go test -v).
func TestCompileKernels(t *testing.T) {
	nv := nvrtcForTest(t)
	t.Logf("NVRTC %s from %s, architectures %v", nv.Version(), nv.Path, nv.Archs)
	srcs := Sources()
	if len(srcs) < 6 {
		t.Fatalf("%d embedded sources, want at least 6", len(srcs))
	}
	var all []string
	for _, arch := range []int{80, 90} {
		for _, s := range srcs {
			ptx, err := nv.Compile(s.Name, s.Code, arch)
			if err != nil {
				t.Fatalf("%v", err)
			}
			entries := ptxEntries(ptx)
			for _, k := range s.Kernels {
				if !slices.Contains(entries, k) {
					t.Errorf("%s compute_%d: PTX lacks entry %s", s.Name, arch, k)
				}
			}
			all = append(all, entries...)
			if !strings.Contains(ptx, ".target sm_"+strconv.Itoa(arch)) {
				t.Errorf("%s: PTX is not for sm_%d", s.Name, arch)
			}
			t.Logf("compute_%d %-16s %7d bytes PTX, kernels %s", arch, s.Name, len(ptx), strings.Join(entries, " "))
		}
		// Every kernel the Go side launches must be there.
		for _, k := range launchedKernels {
			if !slices.Contains(all, k) {
				t.Errorf("compute_%d: no PTX entry %s (launched by the backend)", arch, k)
			}
		}
		all = all[:0]
	}
	// CUBIN for sm_90 (what an H100/H200 loads): an ELF image per source
	// with the same entry points as the PTX.
	if !nv.HasCUBIN() {
		t.Logf("NVRTC %s has no CUBIN output: CUBIN not checked", nv.Version())
		return
	}
	for _, s := range srcs {
		img, err := nv.Build(s.Name, s.Code, Target{Arch: 90, Cubin: true})
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.HasPrefix(img.Data, []byte("\x7fELF")) {
			t.Errorf("%s sm_90: image is not ELF", s.Name)
		}
		for _, k := range s.Kernels {
			if !slices.Contains(img.Entries, k) {
				t.Errorf("%s sm_90: CUBIN entries %v lack %s", s.Name, img.Entries, k)
			}
		}
		t.Logf("sm_90 %-16s %7d bytes CUBIN", s.Name, len(img.Data))
	}
}

// TestCompileErrorLog checks a bad source fails with NVRTC's log.
// launchedKernels are the kernel names the Go code launches.
var launchedKernels = []string{"embed", "rmsnorm", "rope", "silu_mul", "add_bias", "gemv_f16", "gemv_bf16", "gemm_f16", "gemm_bf16",
	"gemv_q", "dequant_q", "kv_append", "attn_split_g1", "attn_split_g2", "attn_split_g4", "attn_split_g8",
	"attn_split_kv_g1", "attn_split_kv_g2", "attn_split_kv_g4", "attn_split_kv_g8", "attn_merge",
	"moe_route", "moe_gemv", "moe_gemv_q", "moe_combine", "moe_shared"}

func TestCompileErrorLog(t *testing.T) {
	nv := nvrtcForTest(t)
	_, err := nv.Compile("bad.cu", `extern "C" __global__ void k(float* x) { x[0] = undefined_name; }`, 80)
	var ce *CompileError
	if !errors.As(err, &ce) {
		t.Fatalf("err = %v, want *CompileError", err)
	}
	if !strings.Contains(ce.Log, "undefined_name") {
		t.Errorf("log %q does not name the undefined identifier", ce.Log)
	}
}

// TestCompileCache: the second build comes from the disk cache, whose
// file name carries the output kind (ptx or cubin) and target, for PTX
// and for CUBIN (with the entry points kept beside the image).
func TestCompileCache(t *testing.T) {
	nv := nvrtcForTest(t)
	dir := t.TempDir()
	src := probeSources()[0]
	targets := []Target{{Arch: 80}}
	if nv.HasCUBIN() {
		targets = append(targets, Target{Arch: 80, Cubin: true})
	} else {
		t.Logf("NVRTC %s has no CUBIN output: only PTX checked", nv.Version())
	}
	for i, tg := range targets {
		a, err := nv.BuildCached(dir, src.Name, src.Code, tg)
		if err != nil {
			t.Fatal(err)
		}
		name := nv.CacheKey(src.Code, tg)
		suffix := fmt.Sprintf("-%s-nvrtc%s.%s", tg, nv.Version(), map[bool]string{false: "ptx", true: "cubin"}[tg.Cubin])
		if !strings.HasSuffix(name, suffix) {
			t.Errorf("cache key %q, want suffix %q", name, suffix)
		}
		ents, _ := os.ReadDir(dir)
		if len(ents) != i+1 {
			t.Fatalf("cache dir holds %v after %d builds", ents, i+1)
		}
		if len(a.Entries) == 0 || !slices.Equal(a.Entries, src.Kernels) {
			t.Errorf("%s: entries %v, want %v", tg, a.Entries, src.Kernels)
		}
		if tg.Cubin && !bytes.HasPrefix(a.Data, []byte("\x7fELF")) {
			t.Errorf("CUBIN image starts %q, want an ELF header", a.Data[:min(4, len(a.Data))])
		}
		// A marker written into the cached file proves the next call reads it.
		p := filepath.Join(dir, name)
		raw, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, append(raw, "// cached"...), 0o644); err != nil {
			t.Fatal(err)
		}
		b, err := nv.BuildCached(dir, src.Name, src.Code, tg)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b.Data, append(a.Data, "// cached"...)) || !slices.Equal(b.Entries, a.Entries) {
			t.Errorf("%s: second build did not come from the cache", tg)
		}
		// A malformed CUBIN cache file is rebuilt, not loaded.
		if tg.Cubin {
			if err := os.WriteFile(p, []byte("garbage"), 0o644); err != nil {
				t.Fatal(err)
			}
			c, err := nv.BuildCached(dir, src.Name, src.Code, tg)
			if err != nil || !bytes.Equal(c.Data, a.Data) {
				t.Errorf("malformed cache file: got %d bytes, %v; want the rebuilt image", len(c.Data), err)
			}
		}
	}
	k80, k90 := nv.CacheKey(src.Code, Target{Arch: 80}), nv.CacheKey(src.Code, Target{Arch: 90})
	if k80 == k90 || k80 == nv.CacheKey(src.Code+" ", Target{Arch: 80}) || k80 == nv.CacheKey(src.Code, Target{Arch: 80, Cubin: true}) {
		t.Errorf("cache key ignores the arch, the source or the output kind")
	}
}

// TestKernelsNoSpills compiles every source to sm_80 and sm_90 machine
// code through NVRTC's ptxas and fails when a kernel spills registers or
// uses a stack frame (a sign of local arrays indexed at run time); it
// logs each kernel's registers and shared memory.
func TestKernelsNoSpills(t *testing.T) {
	nv := nvrtcForTest(t)
	spillRE := regexp.MustCompile(`(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads`)
	for _, arch := range []int{80, 90} {
		for _, s := range Sources() {
			log, err := nv.PtxasInfo(s.Name, s.Code, arch)
			if err != nil {
				t.Fatal(err)
			}
			entry := ""
			for _, l := range strings.Split(log, "\n") {
				if i := strings.Index(l, "Compiling entry function '"); i >= 0 {
					entry = strings.SplitN(l[i+len("Compiling entry function '"):], "'", 2)[0]
				}
				if m := spillRE.FindStringSubmatch(l); m != nil && (m[1] != "0" || m[2] != "0" || m[3] != "0") {
					t.Errorf("sm_%d %s %s: %s", arch, s.Name, entry, strings.TrimSpace(l))
				}
				if strings.Contains(l, "Used ") {
					t.Logf("sm_%d %-14s %-14s %s", arch, s.Name, entry, strings.TrimSpace(l[strings.Index(l, "Used "):]))
				}
			}
			if entry == "" {
				t.Errorf("sm_%d %s: no ptxas output in the log %q", arch, s.Name, log)
			}
		}
	}
}
