package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/runtime"
	"github.com/lmpack/lmpack/runtime/cuda"
)

// Devices are the values of --device: "auto" (CUDA when a GPU, its
// driver and NVRTC are present, else the CPU), "cpu" and "cuda".
var Devices = []string{"auto", "cpu", "cuda"}

// cudaProbe is cuda.Probe; tests replace it.
var cudaProbe = cuda.Probe

// PickBackend returns the backend for a --device value. "auto" falls back
// to the CPU, logging one line with the reason, when CUDA is unusable;
// "cuda" then fails with the reason (which names the libraries searched).
// "" means "cpu". Errors: an unknown value, CUDA unavailable for "cuda".
func PickBackend(device string, logger *slog.Logger) (runtime.Backend, error) {
	switch device {
	case "", "cpu":
		return runtime.NewCPU(), nil
	case "cuda":
		if err := cudaProbe(0); err != nil {
			return nil, fmt.Errorf("--device cuda: %w", err)
		}
		return cuda.New(), nil
	case "auto":
		if err := cudaProbe(0); err != nil {
			if logger != nil {
				logger.Info("no usable CUDA GPU, running on the CPU", "device", "cpu", "reason", err.Error())
			}
			return runtime.NewCPU(), nil
		}
		return cuda.New(), nil
	}
	return nil, fmt.Errorf("--device %q: want auto, cpu or cuda", device)
}

// loadModel loads d from src on the backend --device selects
// (PickBackend). blocker, when not empty, says why the CUDA backend cannot
// run this model as asked (a KV-cache scheme it does not implement): then
// "auto" runs on the CPU with one log line and "cuda" fails with it. A
// CUDA load failing with cuda.ErrUnsupported (say, a head_dim above 256)
// also falls back to the CPU under "auto". Errors: PickBackend's, the
// backend's Load errors.
func loadModel(ctx context.Context, device string, logger *slog.Logger, d *arch.Description, src runtime.TensorSource, threads int, blocker string) (runtime.Backend, runtime.Model, error) {
	return loadModelOpts(ctx, device, logger, d, src, runtime.LoadOptions{Threads: threads}, blocker)
}

// loadModelOpts is loadModel with the backend's load options lo.
func loadModelOpts(ctx context.Context, device string, logger *slog.Logger, d *arch.Description, src runtime.TensorSource, lo runtime.LoadOptions, blocker string) (runtime.Backend, runtime.Model, error) {
	be, err := PickBackend(device, logger)
	if err != nil {
		return nil, nil, err
	}
	cpu := func(reason string) (runtime.Backend, runtime.Model, error) {
		if logger != nil {
			logger.Info("the CUDA backend cannot run this model, running on the CPU", "device", "cpu", "reason", reason)
		}
		be := runtime.NewCPU()
		m, err := be.Load(ctx, d, src, lo)
		return be, m, err
	}
	if be.Name() == "cuda" && blocker != "" {
		if device == "cuda" {
			return nil, nil, fmt.Errorf("--device cuda: %s", blocker)
		}
		return cpu(blocker)
	}
	m, err := be.Load(ctx, d, src, lo)
	if err != nil && be.Name() == "cuda" && device == "auto" && errors.Is(err, cuda.ErrUnsupported) {
		return cpu(err.Error())
	}
	return be, m, err
}
