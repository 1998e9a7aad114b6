package main

import (
	"fmt"
	"log/slog"
	"slices"

	"github.com/lmpack/lmpack/internal/engine"
	"github.com/spf13/cobra"
)

// deviceUsage is the help text of --device.
const deviceUsage = "backend: auto (CUDA GPU when its driver and NVRTC are present, else the CPU), cpu or cuda"

// addDeviceFlag registers --device (default auto) on cmd.
func addDeviceFlag(cmd *cobra.Command, device *string) {
	cmd.Flags().StringVar(device, "device", "auto", deviceUsage)
}

// addCPUDeviceFlag registers --device (default auto) on cmd, whose work
// (what) runs on the CPU backend only (cpuOnly).
func addCPUDeviceFlag(cmd *cobra.Command, device *string, what string) {
	cmd.Flags().StringVar(device, "device", "auto", "backend: auto or cpu ("+what+" runs on the CPU backend only; cuda is refused)")
}

// checkDevice validates --device.
func checkDevice(device string) error {
	if !slices.Contains(engine.Devices, device) {
		return fmt.Errorf("--device %q: want auto, cpu or cuda", device)
	}
	return nil
}

// cpuOnly resolves --device for a command that needs the CPU backend
// (what): cuda is an error, auto runs on the CPU with one log line.
func cpuOnly(device, what string, logger *slog.Logger) (string, error) {
	switch device {
	case "cuda":
		return "", fmt.Errorf("--device cuda: %s runs on the CPU backend only; use --device cpu", what)
	case "auto":
		logger.Info("running on the CPU", "device", "cpu", "reason", what+" runs on the CPU backend only")
	}
	return "cpu", nil
}

// addDequantizeFlag registers --dequantize on cmd
// (engine.Options.DequantizeWeights).
func addDequantizeFlag(cmd *cobra.Command, dequantize *bool) {
	cmd.Flags().BoolVar(dequantize, "dequantize", false,
		"CPU: keep float32 copies of the weights (packed quantized and BF16/F16 ones, which are otherwise used in place): 2x the memory for BF16/F16 with the same results, 4-8x for packed weights with results that differ in the last digits (the packed kernels round the activations to int8 per block, docs/QUANT.md)")
}
