package main

import (
	"encoding/json"

	"github.com/lmpack/lmpack/internal/engine"
	"github.com/lmpack/lmpack/model"
	"github.com/spf13/cobra"
)

func newInspectCmd(g *globalFlags) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "inspect MODEL",
		Short: "Print a checkpoint's or artifact's architecture, parameter count, bytes by dtype and per-layer shapes",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := engine.InspectModel(cmd.Context(), args[0], model.HubOptions(g.logger))
			if err != nil {
				return err
			}
			if asJSON {
				e := json.NewEncoder(cmd.OutOrStdout())
				e.SetIndent("", "  ")
				return e.Encode(r)
			}
			return r.WriteText(cmd.OutOrStdout())
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the report as JSON")
	return cmd
}
