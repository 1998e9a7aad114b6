package cuda

import (
	"errors"
	"fmt"
	"iter"
	"slices"
	"strings"
	"testing"
)

// fakeLoader stands for Device.LoadImage: it records each image's target
// and rejects those reject says with the given CUresult.
type fakeLoader struct {
	reject   func(Target) int32
	loads    []string
	unloaded []int
	next     int
}

func (f *fakeLoader) load(img *Image) (int, error) {
	f.loads = append(f.loads, img.Target.String())
	if code := f.reject(img.Target); code != 0 {
		return 0, &cuError{"cuModuleLoadData", code, "fake rejection"}
	}
	f.next++
	return f.next, nil
}

func (f *fakeLoader) unload(m int) { f.unloaded = append(f.unloaded, m) }

func libsOf(libs ...*NVRTC) iter.Seq2[*NVRTC, error] {
	return func(yield func(*NVRTC, error) bool) {
		for _, nv := range libs {
			if !yield(nv, nil) {
				return
			}
		}
	}
}

// withVersion is nv posing as another NVRTC version (same library).
func withVersion(nv *NVRTC, major, minor int) *NVRTC {
	c := *nv
	c.Major, c.Minor, c.Path = major, minor, fmt.Sprintf("fake-libnvrtc-%d.%d", major, minor)
	return &c
}

// TestLoadImagesFallback: the choice of NVRTC library and CUBIN/PTX that
// LoadKernels (and so Probe) makes against a faked driver: CUBIN first,
// PTX when the driver rejects it, NVRTCs newer than the driver skipped,
// the next library when one's images are rejected, ErrKernels naming
// every attempt when nothing loads, ErrNoNVRTC when no library opens, and
// modules of a half-loaded attempt unloaded.
func TestLoadImagesFallback(t *testing.T) {
	nv := nvrtcForTest(t)
	if !nv.HasCUBIN() {
		t.Skipf("NVRTC %s has no CUBIN output", nv.Version())
	}
	srcs := Sources()[:2]
	dir := t.TempDir()
	const cc = 80
	never := func(Target) int32 { return 0 }
	cubinNo := func(tg Target) int32 {
		if tg.Cubin {
			return 209 // CUDA_ERROR_NO_BINARY_FOR_GPU
		}
		return 0
	}
	newDrv := nv.CUDAVersion() + 10
	for _, tc := range []struct {
		name   string
		libs   []*NVRTC
		drv    int
		reject func(Target) int32
		want   Target // loaded target; Arch 0: an error
		loads  []string
		errIs  error
		errHas []string
	}{
		{"cubin first", []*NVRTC{nv}, newDrv, never, Target{cc, true}, []string{"sm_80", "sm_80"}, nil, nil},
		{"ptx after rejected cubin", []*NVRTC{nv}, newDrv, cubinNo, Target{cc, false}, []string{"sm_80", "compute_80", "compute_80"}, nil, nil},
		{"unknown driver version", []*NVRTC{nv}, 0, cubinNo, Target{cc, false}, []string{"sm_80", "compute_80", "compute_80"}, nil, nil},
		{"newer nvrtc skipped", []*NVRTC{withVersion(nv, nv.Major+1, 0), nv}, newDrv, never, Target{cc, true}, []string{"sm_80", "sm_80"}, nil, nil},
		{"newer minor: cubin only, then next library", []*NVRTC{withVersion(nv, nv.Major, nv.Minor+1), nv}, nv.CUDAVersion(), cubinNo,
			Target{cc, false}, []string{"sm_80", "sm_80", "compute_80", "compute_80"}, nil, nil},
		{"ptx version rejected", []*NVRTC{nv}, newDrv, func(Target) int32 { return 222 }, Target{}, []string{"sm_80", "compute_80"},
			ErrKernels, []string{"sm_80", "compute_80", "CUresult 222"}},
		{"driver too old", []*NVRTC{nv}, (nv.Major - 1) * 1000, never, Target{}, nil, ErrKernels, []string{"newer than the driver"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeLoader{reject: tc.reject}
			mods, got, tg, err := loadImages(libsOf(tc.libs...), cc, tc.drv, dir, srcs, f.load, f.unload)
			if tc.want.Arch == 0 {
				if !errors.Is(err, tc.errIs) {
					t.Fatalf("err = %v, want %v", err, tc.errIs)
				}
				for _, w := range tc.errHas {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q lacks %q", err, w)
					}
				}
			} else {
				if err != nil {
					t.Fatal(err)
				}
				if tg != tc.want || got.Path != nv.Path {
					t.Errorf("loaded %s from %s, want %s from %s", tg, got.Path, tc.want, nv.Path)
				}
				for _, s := range srcs {
					for _, k := range s.Kernels {
						if mods[k] == 0 {
							t.Errorf("kernel %s not loaded", k)
						}
					}
				}
			}
			if tc.loads != nil && !slices.Equal(f.loads[:min(len(f.loads), len(tc.loads))], tc.loads) {
				t.Errorf("load attempts %v, want them to start %v", f.loads, tc.loads)
			}
			// Every module of a failed attempt was unloaded.
			if len(f.unloaded) != f.next-len(uniq(mods)) {
				t.Errorf("%d modules loaded, %d kept, %d unloaded", f.next, len(uniq(mods)), len(f.unloaded))
			}
		})
	}
	// A driver error that is not an image rejection is returned as is.
	f := &fakeLoader{reject: func(Target) int32 { return 2 }} // CUDA_ERROR_OUT_OF_MEMORY
	if _, _, _, err := loadImages(libsOf(nv), cc, newDrv, dir, srcs, f.load, f.unload); errors.Is(err, ErrKernels) || !strings.Contains(err.Error(), "CUresult 2)") || len(f.loads) != 1 {
		t.Errorf("out of memory: err = %v after %v, want the driver error after one load", err, f.loads)
	}
	// No library at all.
	none := func(yield func(*NVRTC, error) bool) { yield(nil, errors.New("/x/libnvrtc.so.12 (absent)")) }
	if _, _, _, err := loadImages(none, cc, newDrv, dir, srcs, f.load, f.unload); !errors.Is(err, ErrNoNVRTC) || !strings.Contains(err.Error(), "/x/libnvrtc.so.12 (absent)") {
		t.Errorf("no NVRTC: err = %v, want ErrNoNVRTC naming the path", err)
	}
}

func uniq(m map[string]int) map[int]bool {
	u := map[int]bool{}
	for _, v := range m {
		u[v] = true
	}
	return u
}

// TestTargets: CUBIN only for the device's own major architecture and a
// driver of at least the NVRTC's CUDA major; PTX only from an NVRTC not
// newer than the driver.
func TestTargets(t *testing.T) {
	nv := &NVRTC{Path: "x", Major: 12, Minor: 4, Archs: []int{50, 60, 70, 75, 80, 86, 89, 90}, getCUBIN: func(uintptr, *byte) int32 { return 0 }}
	old := &NVRTC{Path: "y", Major: 11, Minor: 0, Archs: []int{35, 50, 60, 70, 75, 80}}
	for _, tc := range []struct {
		nv      *NVRTC
		cc, drv int
		want    []Target
	}{
		{nv, 90, 12040, []Target{{90, true}, {90, false}}},
		{nv, 90, 12020, []Target{{90, true}}},              // minor-version compatible CUBIN, PTX too new
		{nv, 90, 11080, nil},                               // older major: neither
		{nv, 100, 13000, []Target{{90, false}}},            // no sm_100: PTX for compute_90
		{nv, 87, 12040, []Target{{86, true}, {86, false}}}, // sm_86 CUBIN runs on 8.7
		{old, 86, 12040, []Target{{80, false}}},            // no nvrtcGetCUBIN
		{nv, 90, 0, []Target{{90, true}, {90, false}}},
	} {
		got, why := targets(tc.nv, tc.cc, tc.drv)
		if !slices.Equal(got, tc.want) {
			t.Errorf("targets(NVRTC %s, cc %d, driver %d) = %v (%s), want %v", tc.nv.Version(), tc.cc, tc.drv, got, why, tc.want)
		}
		if len(got) == 0 && why == "" {
			t.Errorf("no targets and no reason")
		}
	}
}
