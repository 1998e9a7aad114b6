package cuda

import (
	"errors"
	"fmt"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strings"
	"testing"
)

// TestNVRTCSearchOrder: $LMPACK_NVRTC (a directory here), then
// $CUDA_HOME/lib64, then the sonames 13, 12, 11.2, then wheel dirs.
func TestNVRTCSearchOrder(t *testing.T) {
	dir, home := t.TempDir(), t.TempDir()
	t.Setenv("LMPACK_NVRTC", dir)
	t.Setenv("CUDA_HOME", home)
	t.Setenv("VIRTUAL_ENV", "")
	c := NVRTCCandidates()
	want := []string{
		filepath.Join(dir, "libnvrtc.so.13"), filepath.Join(dir, "libnvrtc.so.12"), filepath.Join(dir, "libnvrtc.so.11.2"),
		filepath.Join(home, "lib64", "libnvrtc.so.13"), filepath.Join(home, "lib64", "libnvrtc.so.12"), filepath.Join(home, "lib64", "libnvrtc.so.11.2"),
		"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2",
	}
	if len(c) < len(want) || !slices.Equal(c[:len(want)], want) {
		t.Fatalf("candidates start %v, want %v", c[:min(len(c), len(want))], want)
	}
	for _, p := range c[len(want):] {
		if !strings.Contains(p, "/usr/local/cuda/lib64/") && !strings.Contains(p, "/nvidia/") {
			t.Errorf("unexpected candidate after the sonames: %s", p)
		}
	}
	// A file in LMPACK_NVRTC is tried as is, first.
	t.Setenv("LMPACK_NVRTC", "/opt/x/libnvrtc.so.12.4")
	if c := NVRTCCandidates(); c[0] != "/opt/x/libnvrtc.so.12.4" {
		t.Errorf("first candidate %q, want the LMPACK_NVRTC file", c[0])
	}
}

// TestMissingLibraryError: the error wraps the sentinel and names every
// path tried with why it failed.
func TestMissingLibraryError(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "libnvrtc.so.12")
	_, _, err := dlopenFirst(ErrNoNVRTC, []string{missing, "libnvrtc-does-not-exist.so.99"})
	if !errors.Is(err, ErrNoNVRTC) {
		t.Fatalf("err = %v, want ErrNoNVRTC", err)
	}
	for _, w := range []string{missing + " (absent)", "libnvrtc-does-not-exist.so.99 ("} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q lacks %q", err, w)
		}
	}
}

// TestNoDriver: without libcuda.so.1 (CI), OpenDevice and Probe fail with
// ErrNoDriver naming the library; the launch tests skip for that reason.
func TestNoDriver(t *testing.T) {
	d, err := OpenDevice(0)
	if err == nil {
		d.Close()
		t.Skip("a CUDA device is present")
	}
	if errors.Is(err, ErrNoDevice) {
		t.Skipf("a driver is present without a device: %v", err)
	}
	if goruntime.GOOS != "linux" {
		if !errors.Is(err, ErrNoDriver) || !errors.Is(err, ErrUnsupportedOS) || !strings.Contains(err.Error(), "unsupported on this OS") {
			t.Fatalf("OpenDevice err = %v, want ErrNoDriver and ErrUnsupportedOS", err)
		}
	} else if !errors.Is(err, ErrNoDriver) || !strings.Contains(err.Error(), "libcuda.so.1") {
		t.Fatalf("OpenDevice err = %v, want ErrNoDriver naming libcuda.so.1", err)
	}
	if err := Probe(0); !errors.Is(err, ErrNoDriver) {
		t.Errorf("Probe err = %v, want ErrNoDriver", err)
	}
}

// TestUnsupportedOS: where the backend cannot load libraries (any OS but
// Linux; simulated here on Linux), opening the driver fails with
// ErrNoDriver and NVRTC with ErrNoNVRTC, both wrapping ErrUnsupportedOS
// and saying so, before any library is tried (so --device auto falls back
// to the CPU with that reason and --device cuda fails with it:
// internal/engine TestPickBackend).
func TestUnsupportedOS(t *testing.T) {
	if errUnsupportedOS == nil {
		errUnsupportedOS = fmt.Errorf("%w (%s)", ErrUnsupportedOS, "plan9")
		defer func() { errUnsupportedOS = nil }()
	}
	_, _, err := dlopenFirst(ErrNoDriver, []string{"libcuda.so.1"})
	if !errors.Is(err, ErrNoDriver) || !errors.Is(err, ErrUnsupportedOS) || !strings.Contains(err.Error(), "unsupported on this OS") || strings.Contains(err.Error(), "searched") {
		t.Errorf("dlopenFirst: %v, want ErrNoDriver wrapping ErrUnsupportedOS, no search", err)
	}
	_, err = LoadNVRTC()
	if !errors.Is(err, ErrNoNVRTC) || !errors.Is(err, ErrUnsupportedOS) || !strings.Contains(err.Error(), "unsupported on this OS") {
		t.Errorf("LoadNVRTC: %v, want ErrNoNVRTC wrapping ErrUnsupportedOS", err)
	}
}

// TestPickArch: the newest supported arch not above the device's.
func TestPickArch(t *testing.T) {
	n := &NVRTC{Archs: []int{50, 60, 70, 75, 80, 86, 89, 90}, Path: "x", Major: 11, Minor: 8}
	for cc, want := range map[int]int{90: 90, 100: 90, 87: 86, 80: 80, 75: 75} {
		if got, err := n.PickArch(cc); err != nil || got != want {
			t.Errorf("PickArch(%d) = %d, %v; want %d", cc, got, err, want)
		}
	}
	if _, err := n.PickArch(35); err == nil {
		t.Errorf("PickArch(35) succeeded, want an error (all archs newer)")
	}
}
