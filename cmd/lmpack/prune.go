package main

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/lmpack/lmpack/prune"
	"github.com/spf13/cobra"
)

func newPruneCmd(g *globalFlags) *cobra.Command {
	var (
		opt    prune.Options
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "prune MODEL --calib CALIB -o OUT (--layers N | --layer-ratio r) [--layer-method lorp|shortgpt|list:3,7]",
		Short: "Remove whole decoder blocks (LoRP, ShortGPT or a list) and write a smaller checkpoint",
		Long: `prune removes decoder blocks from MODEL and writes OUT, a new Hugging Face
checkpoint directory (model.safetensors with the kept blocks renumbered
0..L'-1, config.json with num_hidden_layers updated, tokenizer files copied)
that stock loaders read. MODEL is never modified; OUT must not exist and
must not lie inside MODEL.

--layer-method lorp (LoRP: spectral clusters of the block-input similarity)
and shortgpt (lowest Block Influence) read the block similarity from the
calibration file written by "lmpack calibrate"; list:3,7 removes the given
blocks (--calib optional). Blocks 0 and L-1 are never removed.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if opt.Out == "" {
				return fmt.Errorf("-o OUT is required (the directory to create)")
			}
			isList := strings.HasPrefix(opt.Method, "list:")
			if !isList {
				if opt.Calib == "" {
					return fmt.Errorf("--calib CALIB is required for --layer-method %s", opt.Method)
				}
				if (opt.Layers != 0) == (opt.LayerRatio != 0) {
					return fmt.Errorf("give exactly one of --layers N and --layer-ratio r")
				}
				if cmd.Flags().Changed("layers") && opt.Layers <= 0 {
					return fmt.Errorf("--layers %d: want > 0", opt.Layers)
				}
				if cmd.Flags().Changed("layer-ratio") && !(opt.LayerRatio > 0 && opt.LayerRatio < 1) {
					return fmt.Errorf("--layer-ratio %v: want in (0, 1)", opt.LayerRatio)
				}
			}
			opt.Model = args[0]
			r, err := prune.Run(cmd.Context(), opt)
			if err != nil {
				return err
			}
			g.logger.Info("pruned checkpoint written", "out", r.Out, "layers", r.LayersAfter)
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(r)
			}
			return writePruneReport(cmd, r)
		},
	}
	f := cmd.Flags()
	f.StringVar(&opt.Calib, "calib", "", "calibration file (lmpack calibrate)")
	f.StringVarP(&opt.Out, "output", "o", "", "directory to create for the pruned checkpoint")
	f.IntVar(&opt.Layers, "layers", 0, "number of decoder blocks to remove")
	f.Float64Var(&opt.LayerRatio, "layer-ratio", 0, "fraction of decoder blocks to remove, in (0, 1): removes round(r·L) blocks, at least 1")
	f.StringVar(&opt.Method, "layer-method", "lorp", "lorp, shortgpt or list:L1,L2,...")
	f.BoolVar(&asJSON, "json", false, "print the report as one JSON object")
	return cmd
}

func writePruneReport(cmd *cobra.Command, r *prune.Report) error {
	var b strings.Builder
	fmt.Fprintf(&b, "wrote %s: %d -> %d layers (method %s)\n", r.Out, r.LayersBefore, r.LayersAfter, r.Method)
	if r.K > 0 {
		fmt.Fprintf(&b, "RLS %.4f, K %d clusters, labels %v\n", r.RLS, r.K, r.Labels)
	}
	fmt.Fprintf(&b, "%-6s %11s %16s\n", "layer", "redundancy", "block_influence")
	for _, l := range r.Removed {
		red, bi := "-", "-"
		// A layer alone in its LoRP cluster has no redundancy (the plan
		// stores −1 as a sentinel): print "-" (singleton).
		if l.Redundancy != nil && *l.Redundancy >= -1+1e-12 {
			red = fmt.Sprintf("%.4f", *l.Redundancy)
		} else if l.Redundancy != nil {
			red = "- (alone)"
		}
		if l.BlockInfluence != nil {
			bi = fmt.Sprintf("%.4f", *l.BlockInfluence)
		}
		fmt.Fprintf(&b, "%-6d %11s %16s\n", l.Layer, red, bi)
	}
	fmt.Fprintf(&b, "kept layers %v\n", r.Kept)
	fmt.Fprintf(&b, "parameters %d -> %d (%.1f%%), bytes %d -> %d\n", r.Before.Params, r.After.Params,
		100*float64(r.After.Params)/float64(r.Before.Params), r.Before.Bytes, r.After.Bytes)
	_, err := fmt.Fprint(cmd.OutOrStdout(), b.String())
	return err
}
