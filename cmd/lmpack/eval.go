package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"github.com/lmpack/lmpack/eval"
	"github.com/lmpack/lmpack/eval/kveval"
	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/internal/fsx"
	"github.com/lmpack/lmpack/runtime/kvcache"

	"github.com/lmpack/lmpack/internal/engine"
	"github.com/lmpack/lmpack/internal/field"
	"github.com/spf13/cobra"
)

func newEvalCmd(g *globalFlags) *cobra.Command {
	var (
		data    string
		opt     engine.EvalOptions
		threads int
		asJSON  bool
		device  string
		kvList  string
		kvRot   string
		kvWin   string
		plot    string
		layers  bool
		kvProto string
		kvP     int
		kvC     int
		kvServe int
	)
	var dequantize bool // --dequantize
	cmd := &cobra.Command{
		Use:   "eval MODEL --data FILE",
		Short: "Perplexity of a model on a text file (non-overlapping windows, BOS prepended); with --kv, KV-cache methods side by side",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if data == "" {
				return fmt.Errorf("--data FILE is required")
			}
			if err := zeroFlags(cmd, map[string]string{"ctx": ">= 2"}); err != nil {
				return err
			}
			// --ctx left out (0) is resolved from the model once it is
			// open; DefaultContextTokens stands in for the checks before.
			// --kv-prompt/--kv-chunk without --kv: the artifact's (or,
			// when given, the checkpoint's) windows fed decode-faithful.
			if kvList == "" && (cmd.Flags().Changed("kv-prompt") || cmd.Flags().Changed("kv-chunk")) {
				opt.Prompt, opt.Chunk = kvP, kvC
			}
			po := eval.PerplexityOptions{Ctx: cmp.Or(opt.Ctx, arch.DefaultContextTokens), MaxWindows: opt.MaxWindows, Prompt: opt.Prompt, Chunk: opt.Chunk}
			if err := po.Validate(); err != nil {
				return field.Rename(err, evalFlags)
			}
			if err := checkThreads(threads); err != nil {
				return err
			}
			if err := checkDevice(device); err != nil {
				return err
			}
			var kv *kveval.Options
			if kvList == "" && cmd.Flags().Changed("kv") {
				return fmt.Errorf("--kv \"\": want a comma-separated list of KV cache methods (lmpack eval --help lists them)")
			}
			if kvList != "" {
				o, err := parseKVFlags(kvList, kvRot, kvWin, plot)
				if err != nil {
					return err
				}
				kv = o
				if plot != "" {
					if err := checkOutput("--plot", plot, args[0], data, kvRot); err != nil {
						return err
					}
				}
				o.Protocol, o.Prompt, o.Chunk, o.ServingCtx = kvProto, kvP, kvC, kvServe
			} else if kvRot != "" || kvWin != "" || plot != "" || layers {
				return fmt.Errorf("--kv-rotations, --kv-window, --kv-layers and --plot need --kv LIST")
			} else {
				for _, name := range []string{"kv-protocol", "kv-serving-ctx"} {
					if cmd.Flags().Changed(name) {
						return fmt.Errorf("--%s needs --kv LIST", name)
					}
				}
			}
			if _, err := fsx.ReadText(data); err != nil {
				return err
			}
			if kv != nil {
				// --kv compares the CPU runtime's KV caches.
				d, err := cpuOnly(device, "eval --kv", g.logger)
				if err != nil {
					return err
				}
				device = d
			}
			e, err := engine.Open(cmd.Context(), args[0], engine.Options{Threads: threads, Device: device, Logger: g.logger, Artifacts: kv == nil, DequantizeWeights: dequantize})
			if err != nil {
				return err
			}
			defer e.Close()
			if opt.Ctx == 0 {
				opt.Ctx = arch.DefaultContext(e.Desc)
			}
			po.Ctx = opt.Ctx
			if err := po.ValidateModel(e.Desc); err != nil {
				return field.Rename(err, evalFlags)
			}
			if kv != nil {
				kv.Ctx, kv.MaxWindows = opt.Ctx, opt.MaxWindows
				if err := kv.Validate(); err != nil {
					return field.Rename(err, evalFlags)
				}
			}
			var finish func()
			opt.Progress, finish = newProgress(cmd, g, "eval windows", "eval progress", "windows")
			if kv != nil {
				kv.Ctx, kv.MaxWindows, kv.Progress, kv.Layers = opt.Ctx, opt.MaxWindows, opt.Progress, layers
				rep, err := kveval.Run(cmd.Context(), e, data, *kv)
				finish()
				if err != nil {
					return field.Rename(err, evalFlags)
				}
				if plot != "" {
					if err := writePlot(plot, rep, e.Dir); err != nil {
						return err
					}
				}
				if asJSON {
					out := struct {
						Model       string `json:"model"`
						Data        string `json:"data"`
						KVRotations string `json:"kv_rotations,omitempty"`
						KVWindow    string `json:"kv_window,omitempty"`
						*eval.KVReport
					}{e.Dir, data, kvRot, kvWin, rep}
					return json.NewEncoder(cmd.OutOrStdout()).Encode(out)
				}
				return rep.WriteTable(cmd.OutOrStdout())
			}
			r, err := e.EvalFile(cmd.Context(), data, opt)
			finish()
			if err != nil {
				return err
			}
			if asJSON {
				out := struct {
					Model   string `json:"model"`
					Data    string `json:"data"`
					KVCache string `json:"kv_cache,omitempty"`
					*resultNoWindows
				}{e.Dir, data, e.KVCache, &resultNoWindows{r.Perplexity, r.NLL, r.TokensScored, r.Windows, r.Ctx, r.Seconds, r.TokensPerSecond}}
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
	f.IntVar(&opt.Ctx, "ctx", 0, "window length in tokens (default min(512, max_position_embeddings))")
	f.IntVar(&opt.MaxWindows, "max-windows", 0, "stop after K windows (0: all)")
	f.IntVar(&threads, "threads", 0, "worker threads (default: all cores)")
	addDeviceFlag(cmd, &device)
	addDequantizeFlag(cmd, &dequantize)
	f.BoolVar(&asJSON, "json", false, "print one JSON object")
	f.StringVar(&kvList, "kv", "", "compare KV cache methods side by side, comma-separated: "+strings.Join(kvcache.Methods(), ","))
	f.StringVar(&kvRot, "kv-rotations", "", "OSCAR rotation file (lmpack quantize kv), needed by oscar2/oscar4")
	f.StringVar(&kvWin, "kv-window", "", "SINK,RECENT: fp16 windows of the first SINK and newest RECENT tokens, the same for every method (0: none, kivi2/oscars2 included; without the flag they keep their 128-token residual); adds a row per method with the windows (e.g. 16,64)")
	f.StringVar(&kvProto, "kv-protocol", eval.ProtocolDecode, "with --kv: decode (full-precision prompt, then teacher-forced decode as in generation) or fake-quant (KVQuant's: each window in one call, every token read back quantised, no windows)")
	f.IntVar(&kvP, "kv-prompt", 0, "P first tokens of each window prefilled in one call (full precision among themselves), not scored (with --kv, or for an artifact's own KV cache)")
	f.IntVar(&kvC, "kv-chunk", 1, "tokens per decode call after the prompt (with --kv, or for an artifact's own KV cache, which eval always feeds decode-faithful)")
	f.IntVar(&kvServe, "kv-serving-ctx", kveval.DefaultServingCtx, "with --kv: also report bits/element at this serving context (computed from the cache's layout)")
	f.BoolVar(&layers, "kv-layers", false, "with --kv: also print per-layer attention-logit and output errors (teacher-forced, first window)")
	f.StringVar(&plot, "plot", "", "with --kv: write KL and ΔPPL against bits/element (Pareto view, FILE.svg) or perplexity against bits/element (FILE.png)")
	return cmd
}

// evalFlags names eval.PerplexityOptions' and kveval.Options' fields as
// flags of eval (field.Rename of their Validate errors).
var evalFlags = map[string]string{
	"Ctx": "--ctx", "MaxWindows": "--max-windows", "Methods": "--kv", "Rotations": "--kv-rotations",
	"Windows": "--kv-window", "Sink": "--kv-window", "Recent": "--kv-window", "Layers": "--kv-layers",
	"Protocol": "--kv-protocol", "Prompt": "--kv-prompt", "Chunk": "--kv-chunk", "ServingCtx": "--kv-serving-ctx",
}

// parseKVFlags parses eval's --kv flags into kveval options (Validate
// checks the values).
func parseKVFlags(list, rot, win, plot string) (*kveval.Options, error) {
	o := &kveval.Options{Rotations: rot}
	for _, m := range strings.Split(list, ",") {
		m = strings.TrimSpace(m)
		if m == "" {
			return nil, fmt.Errorf("--kv %q: empty method name in the list", list)
		}
		o.Methods = append(o.Methods, m)
	}
	if win != "" {
		var s, r int
		if n, err := fmt.Sscanf(win, "%d,%d", &s, &r); n != 2 || err != nil || s < 0 || r < 0 || fmt.Sprintf("%d,%d", s, r) != win {
			return nil, fmt.Errorf("--kv-window %q: want SINK,RECENT (two non-negative token counts, e.g. 64,256)", win)
		}
		o.Windows, o.Sink, o.Recent = true, s, r
	}
	if plot != "" && !strings.HasSuffix(plot, ".svg") && !strings.HasSuffix(plot, ".png") {
		return nil, fmt.Errorf("--plot %q: want a .svg or .png file name", plot)
	}
	return o, nil
}

// writePlot writes the report's SVG or PNG plot atomically
// (fsx.WriteAtomic, mode 0644).
func writePlot(path string, rep *eval.KVReport, title string) error {
	write, what := rep.WriteSVG, "KL and ΔPPL vs KV bits/element: "
	if strings.HasSuffix(path, ".png") {
		write, what = rep.WritePNG, "perplexity vs KV bits/element: "
	}
	if err := fsx.WriteAtomic(path, 0o644, func(f *os.File) error {
		return write(f, what+title)
	}); err != nil {
		return fmt.Errorf("--plot %s: %w", path, err)
	}
	return nil
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
