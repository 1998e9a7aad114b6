package engine

import (
	"fmt"
	"log/slog"

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
