package main

import (
	"encoding/json"
	"fmt"

	"github.com/lmpack/lmpack/internal/engine"
	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
)

func newEvalCmd(g *globalFlags) *cobra.Command {
	var (
		data    string
		opt     engine.EvalOptions
		threads int
		asJSON  bool
	)
	cmd := &cobra.Command{
		Use:   "eval MODEL --data FILE",
		Short: "Perplexity of a model on a text file (non-overlapping windows, BOS prepended)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if data == "" {
				return fmt.Errorf("--data FILE is required")
			}
			if opt.Ctx < 2 {
				return fmt.Errorf("--ctx %d: want >= 2", opt.Ctx)
			}
			if opt.MaxWindows < 0 {
				return fmt.Errorf("--max-windows %d: want >= 0", opt.MaxWindows)
			}
			if err := checkThreads(threads); err != nil {
				return err
			}
			if _, err := engine.ReadText(data); err != nil {
				return err
			}
			e, err := engine.Open(cmd.Context(), args[0], engine.Options{Threads: threads, Logger: g.logger})
			if err != nil {
				return err
			}
			defer e.Close()
			var bar *progressbar.ProgressBar
			opt.Progress = func(done, total int) {
				if isTerminal(cmd.ErrOrStderr()) {
					if bar == nil {
						bar = progressbar.NewOptions(total, progressbar.OptionSetWriter(cmd.ErrOrStderr()),
							progressbar.OptionSetDescription("eval windows"), progressbar.OptionShowCount(), progressbar.OptionClearOnFinish())
					}
					bar.Set(done)
				} else if done == total || done%max(1, total/10) == 0 {
					g.logger.Info("eval progress", "windows_done", done, "windows", total)
				}
			}
			r, err := e.EvalFile(cmd.Context(), data, opt)
			if bar != nil {
				bar.Finish()
			}
			if err != nil {
				return err
			}
			if asJSON {
				out := struct {
					Model string `json:"model"`
					Data  string `json:"data"`
					*resultNoWindows
				}{e.Dir, data, &resultNoWindows{r.Perplexity, r.NLL, r.TokensScored, r.Windows, r.Ctx, r.Seconds, r.TokensPerSecond}}
				enc := json.NewEncoder(cmd.OutOrStdout())
				return enc.Encode(out)
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "perplexity %.4f  nll %.6f  tokens scored %d  windows %d x %d  %.1f tokens/s\n",
				r.Perplexity, r.NLL, r.TokensScored, r.Windows, r.Ctx, r.TokensPerSecond)
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&data, "data", "", "UTF-8 text file to score")
	f.IntVar(&opt.Ctx, "ctx", 512, "window length in tokens")
	f.IntVar(&opt.MaxWindows, "max-windows", 0, "stop after K windows (0: all)")
	f.IntVar(&threads, "threads", 0, "worker threads (default: all cores)")
	f.BoolVar(&asJSON, "json", false, "print one JSON object")
	return cmd
}

type resultNoWindows struct {
	Perplexity      float64 `json:"perplexity"`
	NLL             float64 `json:"nll"`
	TokensScored    int     `json:"tokens_scored"`
	Windows         int     `json:"windows"`
	Ctx             int     `json:"ctx"`
	Seconds         float64 `json:"seconds"`
	TokensPerSecond float64 `json:"tokens_per_second"`
}
