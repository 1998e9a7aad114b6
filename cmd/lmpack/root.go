package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
)

type globalFlags struct {
	logFormat string
	logger    *slog.Logger
}

func newRoot() (*cobra.Command, *globalFlags) {
	g := &globalFlags{}
	root := &cobra.Command{
		Use:   "lmpack",
		Short: "Offline compression toolchain for large language models",
		Long: `lmpack compresses Hugging Face checkpoints offline and runs them on its bundled runtime.

MODEL is a local directory (config.json, *.safetensors, tokenizer.json) or a
Hugging Face hub id org/name[@revision], resolved through the hub cache
($HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub) and
downloaded from $HF_ENDPOINT with $HF_TOKEN when absent; HF_HUB_OFFLINE=1
forbids the network.`,
		Version:       version,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			var h slog.Handler
			switch g.logFormat {
			case "text":
				h = slog.NewTextHandler(cmd.ErrOrStderr(), nil)
			case "json":
				h = slog.NewJSONHandler(cmd.ErrOrStderr(), nil)
			default:
				return fmt.Errorf("--log-format %q: want text or json", g.logFormat)
			}
			g.logger = slog.New(h)
			return nil
		},
	}
	root.PersistentFlags().StringVar(&g.logFormat, "log-format", "text", "log line format: text or json")
	root.AddCommand(newInspectCmd(g), newRunCmd(g), newEvalCmd(g), newCalibrateCmd(g), newQuantizeCmd(g), newPruneCmd(g), newPackCmd(g), newVerifyCmd(g), newCompressCmd(g), newExportCmd(g), newServeCmd(g))
	return root, g
}

// maxThreads bounds --threads: each worker holds a goroutine and scratch.
const maxThreads = 1024

// checkThreads validates --threads: 0 means all cores.
func checkThreads(n int) error {
	if n < 0 || n > maxThreads {
		return fmt.Errorf("--threads %d: want 0 (all cores) to %d", n, maxThreads)
	}
	return nil
}

// newProgress returns a progress callback for long work: a bar on a
// terminal, else a log line per tenth (and at the end) with the given
// message and unit; finish ends the bar. A total that changes between
// calls (width pruning refines its estimate) resizes the bar.
func newProgress(cmd *cobra.Command, g *globalFlags, desc, msg, unit string) (report func(done, total int), finish func()) {
	var bar *progressbar.ProgressBar
	logged := -1 // last tenth logged
	report = func(done, total int) {
		if total <= 0 {
			return
		}
		if isTerminal(cmd.ErrOrStderr()) {
			if bar == nil {
				bar = progressbar.NewOptions(total, progressbar.OptionSetWriter(cmd.ErrOrStderr()),
					progressbar.OptionSetDescription(desc), progressbar.OptionShowCount(),
					progressbar.OptionShowIts(), progressbar.OptionSetItsString(unit), progressbar.OptionClearOnFinish())
			} else if int64(total) != bar.GetMax64() {
				bar.ChangeMax(total)
			}
			bar.Set(done)
		} else if tenth := done * 10 / total; tenth != logged {
			logged = tenth
			g.logger.Info(msg, unit+"_done", done, unit, total)
		}
	}
	finish = func() {
		if bar != nil {
			bar.Finish()
		}
	}
	return report, finish
}

// checkOutput refuses an output path that would overwrite an input (inputs
// are never modified): one of the given input files, or any file inside
// the model directory when it is local. It also refuses a directory and a
// parent directory that does not exist, naming the path.
func checkOutput(flag, out string, model string, inputs ...string) error {
	abs, err := filepath.Abs(out)
	if err != nil {
		return fmt.Errorf("%s %s: %w", flag, out, err)
	}
	if st, err := os.Stat(abs); err == nil && st.IsDir() {
		return fmt.Errorf("%s %s: is a directory, want a file path", flag, out)
	}
	if st, err := os.Stat(filepath.Dir(abs)); err != nil || !st.IsDir() {
		return fmt.Errorf("%s %s: directory %s does not exist", flag, out, filepath.Dir(abs))
	}
	outSt, outErr := os.Stat(abs)
	for _, in := range inputs {
		if in == "" {
			continue
		}
		if inSt, err := os.Stat(in); err == nil && outErr == nil && os.SameFile(inSt, outSt) {
			return fmt.Errorf("%s %s: is the input %s; refusing to overwrite an input", flag, out, in)
		}
	}
	if st, err := os.Stat(model); err == nil && st.IsDir() {
		if md, err := filepath.Abs(model); err == nil {
			if real, err := filepath.EvalSymlinks(md); err == nil {
				md = real
			}
			dir := filepath.Dir(abs)
			if real, err := filepath.EvalSymlinks(dir); err == nil {
				dir = real
			}
			if dir == md {
				return fmt.Errorf("%s %s: inside the model directory %s; write outputs elsewhere (inputs are never modified)", flag, out, model)
			}
		}
	}
	return nil
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
