package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/lmpack/lmpack/internal/field"
	"github.com/lmpack/lmpack/model"
	"github.com/lmpack/lmpack/pack"
	"github.com/lmpack/lmpack/quantize/oscar"
	"github.com/spf13/cobra"
)

// packFlags names pack.FromOptions' fields as flags of pack
// (field.Rename of Validate's errors).
var packFlags = map[string]string{"KVRotations": "--kv-rotations", "KVCache": "--kv-cache", "KVSink": "--kv-window sink", "KVRecent": "--kv-window recent"}

func newPackCmd(g *globalFlags) *cobra.Command {
	var (
		out, rot, kvCache  string
		kvWin              string
		noCompress, asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "pack INPUT -o FILE.lmpk [--kv-rotations ROT] [--kv-cache METHOD] [--kv-window SINK,RECENT] [--no-compress]",
		Short: "Pack a checkpoint directory into one verified .lmpk artifact",
		Long: `pack writes INPUT (a checkpoint directory, or a Hugging Face hub id
resolved as for the other commands) as one .lmpk artifact
(docs/FORMAT.md): every tensor in a 64-byte aligned section (the quantized
weights of a checkpoint from "lmpack quantize weights" as packed codes,
scales, zero-points and permutations, with their format per tensor in the
manifest; run and eval keep them packed), the config and
tokenizer files, width-pruned per-layer sizes, the KV-cache scheme (--kv-cache, with the rotations of
--kv-rotations for oscar2/oscar4: run and eval then use that cache), and a
JSON manifest with the model description and provenance. Sections are lz4-compressed (bf16/f16
also as byte planes) only where that saves at least 10%; --no-compress
stores all raw. The file is written atomically; INPUT is never modified.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if out == "" {
				return fmt.Errorf("-o FILE.lmpk is required")
			}
			if st, err := os.Stat(args[0]); err == nil && !st.IsDir() {
				if model.IsArtifact(args[0]) {
					return fmt.Errorf("INPUT %s is already an lmpack artifact; pack needs a checkpoint directory (config.json and *.safetensors)", args[0])
				}
				hint := ""
				if b := filepath.Base(args[0]); b == "config.json" || strings.HasSuffix(b, ".safetensors") {
					hint = fmt.Sprintf(" (its directory %s?)", filepath.Dir(args[0]))
				}
				return fmt.Errorf("INPUT %s is a file; pack needs a checkpoint directory (config.json and *.safetensors)%s", args[0], hint)
			}
			// A hub id resolves to its Hugging Face cache snapshot, as for
			// the other commands; -o must not land in it.
			dir, err := model.Resolve(cmd.Context(), args[0], model.HubOptions(g.logger))
			if err != nil {
				return err
			}
			if err := checkOutput("-o", out, dir, rot); err != nil {
				return err
			}
			// Replacing an earlier artifact (a rerun) is fine; replacing any
			// other existing file is refused, so a mistyped -o cannot destroy
			// an unrelated file.
			if _, err := os.Stat(out); err == nil {
				if !model.IsArtifact(out) {
					return fmt.Errorf("-o %s: exists and is not an lmpack artifact; refusing to overwrite it", out)
				}
			}
			var sink, recent int
			if kvWin != "" {
				if n, err := fmt.Sscanf(kvWin, "%d,%d", &sink, &recent); n != 2 || err != nil || fmt.Sprintf("%d,%d", sink, recent) != kvWin {
					return fmt.Errorf("--kv-window %q: want SINK,RECENT (two non-negative token counts, e.g. 64,256)", kvWin)
				}
			}
			fo := pack.FromOptions{KVRotations: rot, KVCache: kvCache, KVSink: sink, KVRecent: recent, LmpackVersion: version}
			if err := fo.Validate(); err != nil {
				return field.Rename(err, packFlags)
			}
			a, err := pack.FromCheckpoint(dir, fo)
			if err != nil {
				return field.Rename(err, packFlags)
			}
			// Per-layer widths (quantize kv --kv-bits) were chosen within a
			// budget that counts the windows given then.
			if rot != "" {
				if _, h, err := oscar.ReadFile(rot, model.Expect{}); err == nil && h.KVBits > 0 && (h.KVSink != sink || h.KVRecent != recent) {
					g.logger.Warn("the rotation file's per-layer KV widths were chosen for other fp16 windows: the --kv-bits budget no longer holds as stated",
						"kv_rotations", rot, "kv_bits", h.KVBits, "chosen_for_window", fmt.Sprintf("%d,%d", h.KVSink, h.KVRecent), "kv_window", fmt.Sprintf("%d,%d", sink, recent))
				}
			}
			defer a.Close()
			st, err := pack.Write(out, a, pack.WriteOptions{NoCompress: noCompress})
			if err != nil {
				return err
			}
			g.logger.Info("artifact written", "out", st.Path, "bytes", st.FileSize)
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(st)
			}
			var b strings.Builder
			fmt.Fprintf(&b, "wrote %s: %d bytes, sha256 %s\n", st.Path, st.FileSize, st.SHA256)
			fmt.Fprintf(&b, "%-6s %8s %10s %12s %12s %7s\n", "dtype", "sections", "compressed", "raw_bytes", "stored_bytes", "ratio")
			for _, d := range st.ByDType {
				fmt.Fprintf(&b, "%-6s %8d %10d %12d %12d %7.3f\n", d.DType, d.Sections, d.Compressed, d.Raw, d.Stored, d.Ratio)
			}
			_, err = fmt.Fprint(cmd.OutOrStdout(), b.String())
			return err
		},
	}
	f := cmd.Flags()
	f.StringVarP(&out, "output", "o", "", "artifact file to write (.lmpk)")
	f.StringVar(&rot, "kv-rotations", "", "OSCAR KV rotation file to embed (lmpack quantize kv)")
	f.StringVar(&kvCache, "kv-cache", "", "KV cache method run and eval use for the artifact (default oscar2 with --kv-rotations, else fp32)")
	f.StringVar(&kvWin, "kv-window", "", "SINK,RECENT: fp16 windows of the KV cache in tokens")
	f.BoolVar(&noCompress, "no-compress", false, "store every section raw")
	f.BoolVar(&asJSON, "json", false, "print the statistics as one JSON object")
	return cmd
}

func newVerifyCmd(g *globalFlags) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "verify FILE.lmpk",
		Short: "Check every checksum of an artifact and that its manifest and sections agree",
		Long: `verify checks FILE.lmpk: header, section table and manifest checksums, each
section's CRC-32C and lz4 decoding, the header's content sha256, that every
manifest entry has its section and every section is named by the manifest,
and what a loader checks of the manifest (model description, tensor set,
float dtypes of the plain weights, KV scheme and windows, quantized
values, the embedded tokenizer.json and tokenizer_config.json) and that no
float tensor holds NaN or Inf: an artifact that verifies is one run and
eval load. It prints the file's sha256 (as sha256sum does; content_sha256
in --json is the header's hash) and exits non-zero on any problem, listing
every problem found (on stderr, or under "problems" with --json), each
naming its section or tensor.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			rep, err := pack.Verify(args[0])
			if rep != nil && asJSON {
				if jerr := json.NewEncoder(cmd.OutOrStdout()).Encode(rep); jerr != nil {
					return errors.Join(err, jerr)
				}
			}
			if err != nil {
				if rep != nil && len(rep.Problems) > 1 {
					// Every problem, one line each on stderr; the error
					// line names the first.
					for i, p := range rep.Problems {
						where := ""
						if p.Section != "" {
							where = fmt.Sprintf("section %q: ", p.Section)
						}
						fmt.Fprintf(cmd.ErrOrStderr(), "problem %d of %d: %s%s\n", i+1, len(rep.Problems), where, p.Error)
					}
					return fmt.Errorf("%w (and %d more problems, all %d listed above)", err, len(rep.Problems)-1, len(rep.Problems))
				}
				return err
			}
			if !asJSON {
				_, err = fmt.Fprintf(cmd.OutOrStdout(), "ok %s: %d sections, %d tensors, %d bytes, sha256 %s\n",
					rep.Path, rep.Sections, rep.Tensors, rep.Bytes, rep.SHA256)
			}
			return err
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the report as one JSON object")
	return cmd
}
