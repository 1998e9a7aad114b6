package main

import (
	"encoding/json"
	"fmt"

	"github.com/lmpack/lmpack/quantize/oscar"
	"github.com/spf13/cobra"
)

func newQuantizeCmd(g *globalFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "quantize",
		Short: "Compute quantization transforms from a calibration file",
	}
	cmd.AddCommand(newQuantizeKVCmd(g))
	return cmd
}

func newQuantizeKVCmd(g *globalFlags) *cobra.Command {
	var (
		opt    oscar.KVOptions
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "kv MODEL --calib CALIB -o ROT",
		Short: "KV-cache rotations for a 2-bit cache (OSCAR) from a calibration file",
		Long: `kv computes, per layer, the OSCAR rotations of keys and values (eigenvectors of
the calibrated covariances, a Walsh–Hadamard transform, a bit-reversal
permutation) and writes them with the clipping ratios to a rotation file.
CALIB must come from "lmpack calibrate" on the same MODEL.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if opt.Calib == "" {
				return fmt.Errorf("--calib CALIB is required (from lmpack calibrate)")
			}
			if opt.Out == "" {
				return fmt.Errorf("-o ROT is required (the rotation file to write)")
			}
			if err := checkOutput("-o", opt.Out, args[0], opt.Calib); err != nil {
				return err
			}
			if opt.Method != oscar.Method {
				return fmt.Errorf("--method %q: want %q", opt.Method, oscar.Method)
			}
			if !(opt.ClipK > 0 && opt.ClipK <= 1) {
				return fmt.Errorf("--clip-k %g: want a ratio in (0, 1]", opt.ClipK)
			}
			if !(opt.ClipV > 0 && opt.ClipV <= 1) {
				return fmt.Errorf("--clip-v %g: want a ratio in (0, 1]", opt.ClipV)
			}
			opt.Model, opt.Version, opt.Logger = args[0], version, g.logger
			s, err := oscar.QuantizeKV(cmd.Context(), opt)
			if err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(s)
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "wrote %s: %s rotations for %d layers, clip_k %g, clip_v %g\n",
				s.Path, opt.Method, s.Layers, opt.ClipK, opt.ClipV)
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&opt.Calib, "calib", "", "calibration file from lmpack calibrate")
	f.StringVar(&opt.Method, "method", oscar.Method, "rotation method: oscar")
	f.Float64Var(&opt.ClipK, "clip-k", oscar.DefaultClipK, "key clipping ratio in (0, 1]")
	f.Float64Var(&opt.ClipV, "clip-v", oscar.DefaultClipV, "value clipping ratio in (0, 1]")
	f.StringVarP(&opt.Out, "output", "o", "", "rotation file to write")
	f.BoolVar(&asJSON, "json", false, "print one JSON object")
	return cmd
}
