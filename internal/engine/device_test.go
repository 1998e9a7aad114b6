package engine

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/runtime/cuda"
)

// TestPickBackend: auto falls back to the CPU with exactly one log line
// carrying the probe's reason; cuda fails with it; cpu never probes; an
// unknown value is an error naming the choices.
func TestPickBackend(t *testing.T) {
	old := cudaProbe
	defer func() { cudaProbe = old }()
	probes := 0
	reason := fmt.Errorf("%w: searched libcuda.so.1 (absent)", cuda.ErrNoDriver)
	cudaProbe = func(int) error { probes++; return reason }

	var buf bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&buf, nil))
	b, err := PickBackend("auto", logger)
	if err != nil || b.Name() != "cpu" {
		t.Fatalf("auto without a GPU: backend %v, err %v; want cpu", b, err)
	}
	if n := strings.Count(buf.String(), "\n"); n != 1 || !strings.Contains(buf.String(), "running on the CPU") || !strings.Contains(buf.String(), "libcuda.so.1") {
		t.Errorf("auto fallback logged %d lines %q, want one line naming the CPU and libcuda.so.1", n, buf.String())
	}
	if _, err := PickBackend("cuda", logger); !errors.Is(err, cuda.ErrNoDriver) || !strings.Contains(err.Error(), "--device cuda") {
		t.Errorf("cuda without a GPU: err %v, want ErrNoDriver naming --device cuda", err)
	}
	probes = 0
	for _, d := range []string{"cpu", ""} {
		if b, err := PickBackend(d, logger); err != nil || b.Name() != "cpu" {
			t.Errorf("PickBackend(%q) = %v, %v; want cpu", d, b, err)
		}
	}
	if probes != 0 {
		t.Errorf("cpu probed CUDA %d times", probes)
	}
	if _, err := PickBackend("gpu", logger); err == nil || !strings.Contains(err.Error(), "auto, cpu or cuda") {
		t.Errorf("PickBackend(gpu) err %v, want the choices", err)
	}
	cudaProbe = func(int) error { return nil }
	if b, err := PickBackend("auto", logger); err != nil || b.Name() != "cuda" {
		t.Errorf("auto with a GPU: %v, %v; want cuda", b, err)
	}
}
