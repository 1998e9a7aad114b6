package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/lmpack/lmpack/internal/shared"
	"log/slog"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/model"
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

// TestLoadModelBlocker: a model the CUDA backend cannot run as asked runs
// on the CPU under auto (one log line with the reason) and fails under
// cuda, even when a GPU is present (probe faked).
func TestLoadModelBlocker(t *testing.T) {
	old := cudaProbe
	defer func() { cudaProbe = old }()
	cudaProbe = func(int) error { return nil }
	dir, d, ck, err := model.Open(context.Background(), shared.Path(t, "stories260K-hf"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	const why = "the artifact's KV cache scheme oscar2 runs on the CPU backend only"
	var buf bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&buf, nil))
	be, m, err := loadModel(context.Background(), "auto", logger, d, ck, 1, why)
	if err != nil || be.Name() != "cpu" {
		t.Fatalf("auto with a blocker (%s): backend %v, err %v; want cpu", dir, be, err)
	}
	m.Close()
	if n := strings.Count(buf.String(), "\n"); n != 1 || !strings.Contains(buf.String(), "oscar2") {
		t.Errorf("auto fallback logged %q, want one line with the reason", buf.String())
	}
	if _, _, err := loadModel(context.Background(), "cuda", logger, d, ck, 1, why); err == nil || !strings.Contains(err.Error(), "--device cuda: "+why) {
		t.Errorf("cuda with a blocker: %v", err)
	}
}

// TestPickBackendUnsupportedOS: off Linux the probe fails with
// cuda.ErrUnsupportedOS (runtime/cuda TestUnsupportedOS); auto then runs
// on the CPU with one log line saying so, and cuda fails with it.
func TestPickBackendUnsupportedOS(t *testing.T) {
	old := cudaProbe
	defer func() { cudaProbe = old }()
	cudaProbe = func(int) error { return fmt.Errorf("%w: %w (windows)", cuda.ErrNoDriver, cuda.ErrUnsupportedOS) }
	var buf bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&buf, nil))
	if b, err := PickBackend("auto", logger); err != nil || b.Name() != "cpu" {
		t.Fatalf("auto: backend %v, err %v; want cpu", b, err)
	}
	if n := strings.Count(buf.String(), "\n"); n != 1 || !strings.Contains(buf.String(), "unsupported on this OS") {
		t.Errorf("auto logged %d lines %q, want one saying unsupported on this OS", n, buf.String())
	}
	if _, err := PickBackend("cuda", logger); !errors.Is(err, cuda.ErrUnsupportedOS) || !strings.Contains(err.Error(), "--device cuda") {
		t.Errorf("cuda: err %v, want ErrUnsupportedOS naming --device cuda", err)
	}
}
