package main

import (
	"fmt"
	"io"
	"math"

	"github.com/lmpack/lmpack/internal/engine"
	"github.com/spf13/cobra"
)

func newRunCmd(g *globalFlags) *cobra.Command {
	var (
		prompt  string
		opt     engine.GenerateOptions
		threads int
		noStop  bool
		device  string
	)
	var dequantize bool // --dequantize
	cmd := &cobra.Command{
		Use:   "run MODEL",
		Short: "Generate text from a prompt, streamed to stdout",
		Long: `run encodes --prompt (BOS first for tokenizers that add it; an empty
prompt is BOS alone) and streams the generated text to stdout. The text
continues the prompt: a first generated " park" after "the" keeps its
space. --echo prints the prompt first, so stdout holds the whole text.
A prompt that is not valid UTF-8 is refused, as eval refuses such a data
file.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if opt.MaxTokens <= 0 {
				return fmt.Errorf("--max-tokens %d: want > 0", opt.MaxTokens)
			}
			if !(opt.Temperature >= 0) || math.IsInf(opt.Temperature, 0) {
				return fmt.Errorf("--temperature %g: want a finite value >= 0", opt.Temperature)
			}
			if !(opt.TopP > 0 && opt.TopP <= 1) {
				return fmt.Errorf("--top-p %g: want in (0, 1]", opt.TopP)
			}
			if err := checkThreads(threads); err != nil {
				return err
			}
			if err := checkDevice(device); err != nil {
				return err
			}
			// Refused before the model loads, as eval refuses a data
			// file that is not UTF-8.
			if err := engine.CheckPromptUTF8(prompt); err != nil {
				return err
			}
			opt.StopAtEOS = !noStop
			e, err := engine.Open(cmd.Context(), args[0], engine.Options{Threads: threads, Device: device, Logger: g.logger, Artifacts: true, DequantizeWeights: dequantize})
			if err != nil {
				return err
			}
			defer e.Close()
			out := cmd.OutOrStdout()
			wrote := false
			st, err := e.Generate(cmd.Context(), prompt, opt, func(s string) error {
				wrote = true
				_, err := io.WriteString(out, s)
				return err
			})
			if err == nil || wrote {
				// End the streamed text with a newline; print nothing when
				// generation failed before any text.
				fmt.Fprintln(out)
			}
			if err != nil {
				return err
			}
			if st.ContextLimited {
				g.logger.Warn("generation stopped at the model's context", "prompt_tokens", st.PromptTokens, "generated_tokens", st.GeneratedTokens, "max_tokens", opt.MaxTokens)
			}
			g.logger.Info("generation done", "prompt_tokens", st.PromptTokens, "generated_tokens", st.GeneratedTokens,
				"prefill_tokens_per_second", round1(st.PrefillTPS), "decode_tokens_per_second", round1(st.DecodeTPS))
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&prompt, "prompt", "", "prompt text; empty means BOS only")
	f.IntVar(&opt.MaxTokens, "max-tokens", 256, "number of tokens to generate (generation stops at the model's context)")
	f.Float64Var(&opt.Temperature, "temperature", 0.8, "sampling temperature; 0 is greedy")
	f.Float64Var(&opt.TopP, "top-p", 0.9, "nucleus sampling: sample from the smallest set of tokens whose probability sums to P, in (0,1]; 1 disables")
	f.Uint64Var(&opt.Seed, "seed", 1, "random seed for sampling")
	f.IntVar(&threads, "threads", 0, "worker threads (default: all cores)")
	f.BoolVar(&noStop, "ignore-eos", false, "keep generating past end-of-sequence tokens")
	f.BoolVar(&opt.Echo, "echo", false, "print the prompt (as the tokenizer decodes it) before the generated text")
	addDeviceFlag(cmd, &device)
	addDequantizeFlag(cmd, &dequantize)
	return cmd
}

func round1(x float64) float64 { return float64(int64(x*10+0.5)) / 10 }
