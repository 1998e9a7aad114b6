package prune

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/internal/fsx"
	"github.com/lmpack/lmpack/prune/depth"
)

// Sentinel errors, wrapped with the path or field.
var (
	// ErrOutput: OUT is the model directory, lies inside it, or exists.
	ErrOutput = errors.New("prune: bad output directory")
	// ErrConfig: config.json is unreadable or inconsistent with the plan.
	ErrConfig = errors.New("prune: bad config.json")
	// ErrNoStatistic: the calibration file lacks the statistic a method
	// needs.
	ErrNoStatistic = errors.New("prune: calibration statistic missing")
)

// layerRE matches the decoder-block component of a tensor name, e.g.
// "model.layers.12." in "model.layers.12.mlp.up_proj.weight".
var layerRE = regexp.MustCompile(`(^|\.)layers\.(\d+)\.`)

// Sizes counts a checkpoint's stored tensors: Params is the number of
// model parameters, the elements of every tensor in the files except a
// tied lm_head.weight copy (as `lmpack inspect` counts them), Bytes the
// bytes of all stored tensor data in its dtype, that copy included (file
// headers not counted).
type Sizes struct {
	Params int64 `json:"params"`
	Bytes  int64 `json:"bytes"`
}

// ApplyDepth writes to out a copy of the checkpoint ck (opened from
// modelDir) without the decoder blocks plan.Removed:
//
//   - out/model.safetensors holds every tensor of ck except those of removed
//     blocks; tensors of kept block k (names containing "layers.k.") are
//     renamed to the block's new index (the position of k in plan.Kept()),
//     everything else keeps its name; data and dtype are copied byte for
//     byte, streamed by safetensors.WriteFile (one file, whatever the input
//     sharding; no index file).
//   - out/config.json is modelDir/config.json rewritten by
//     arch.RewriteConfig for the kept layers: num_hidden_layers set to
//     len(plan.Kept()), per-layer lists (layer_types, layer_configs, ...)
//     sliced, mlp_only_layers renumbered, max_window_layers and
//     decoder_sparse_step rewritten (or layer_types written) so that every
//     kept layer keeps its attention type and FFN kind; other fields are
//     kept (keys sorted, numbers verbatim).
//   - every other regular file of modelDir (tokenizer, generation config, …)
//     is copied, except weight files (*.safetensors, *.bin, …) and
//     model.safetensors.index.json; subdirectories are not copied.
//
// The directory is built in a temporary directory beside out and renamed to
// out at the end, so out appears complete or not at all; modelDir is only
// read. It returns the sizes before (all of ck) and after.
//
// Errors: ErrOutput when out is modelDir, lies inside it or exists;
// ErrConfig when config.json is unreadable, not a JSON object, its
// num_hidden_layers differs from plan.Layers, or a kept layer could not
// keep its attention type or FFN kind (arch.ErrRewrite); a tensor naming a block
// index >= plan.Layers; I/O errors (wrapped, naming the file).
func ApplyDepth(modelDir string, ck *safetensors.Checkpoint, plan *depth.Plan, out, tiedLMHead string) (before, after Sizes, err error) {
	if err := checkOut(modelDir, out); err != nil {
		return before, after, err
	}
	kept := plan.Kept()
	newIndex := make(map[int]int, len(kept))
	for i, l := range kept {
		newIndex[l] = i
	}
	cfgPath := filepath.Join(modelDir, "config.json")
	cfg, err := prunedConfig(cfgPath, plan, kept)
	if err != nil {
		return before, after, err
	}
	var ts []safetensors.WriteTensor
	for _, name := range ck.Names() {
		t, err := ck.Tensor(name)
		if err != nil {
			return before, after, fmt.Errorf("prune: %w", err)
		}
		n := int64(t.NumElements())
		if name == tiedLMHead {
			n = 0 // a copy of the embedding, not a parameter
		}
		before.Params += n
		before.Bytes += int64(len(t.Data))
		newName := name
		if m := layerRE.FindStringSubmatchIndex(name); m != nil {
			l, err := strconv.Atoi(name[m[4]:m[5]])
			if err != nil || l >= plan.Layers {
				return before, after, fmt.Errorf("prune: %s: tensor %q names block %s, the plan has %d blocks: %w", ck.Dir(), name, name[m[4]:m[5]], plan.Layers, ErrConfig)
			}
			ni, ok := newIndex[l]
			if !ok {
				continue
			}
			newName = name[:m[4]] + strconv.Itoa(ni) + name[m[5]:]
		}
		after.Params += n
		after.Bytes += int64(len(t.Data))
		ts = append(ts, safetensors.WriteTensor{Name: newName, DType: t.DType, Shape: t.Shape, Data: t.Data})
	}
	slices.SortFunc(ts, func(a, b safetensors.WriteTensor) int { return strings.Compare(a.Name, b.Name) })

	if err := writeDir(modelDir, out, ts, cfg); err != nil {
		return before, after, err
	}
	return before, after, nil
}

// writeDir builds out in a temporary directory beside it (model.safetensors
// from ts, config.json from cfg, modelDir's side files) and renames it into
// place (fsx.WriteDir), so out appears complete or not at all.
func writeDir(modelDir, out string, ts []safetensors.WriteTensor, cfg []byte) error {
	var buildErr error // already prefixed "prune: "
	err := fsx.WriteDir(out, func(tmp string) error {
		buildErr = writeFiles(modelDir, tmp, ts, cfg)
		return buildErr
	})
	if err != nil && err != buildErr {
		return fmt.Errorf("prune: output %s: %w", out, err)
	}
	return err
}

// writeFiles writes model.safetensors, config.json and the side files
// into dir.
func writeFiles(modelDir, dir string, ts []safetensors.WriteTensor, cfg []byte) error {
	if err := safetensors.WriteFile(filepath.Join(dir, "model.safetensors"), ts, map[string]string{"format": "pt"}); err != nil {
		return fmt.Errorf("prune: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), cfg, 0o644); err != nil {
		return fmt.Errorf("prune: %w", err)
	}
	return copySideFiles(modelDir, dir)
}

// prunedConfig returns config.json (at path) rewritten for the kept
// layers (arch.RewriteConfig). Errors: ErrConfig naming path.
func prunedConfig(path string, plan *depth.Plan, kept []int) ([]byte, error) {
	return rewriteConfig(path, arch.ConfigEdit{Layers: plan.Layers, Keep: kept})
}

// rewriteConfig reads config.json at path and returns it with e applied
// (arch.RewriteConfig). Errors: ErrConfig naming path.
func rewriteConfig(path string, e arch.ConfigEdit) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	out, err := arch.RewriteConfig(b, e)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrConfig, path, err)
	}
	return out, nil
}

// checkOut refuses an out that is modelDir, inside it, or already exists
// (fsx.CheckNewDir). Errors: ErrOutput.
func checkOut(modelDir, out string) error {
	if err := fsx.CheckNewDir(modelDir, out, "the pruned checkpoint"); err != nil {
		return fmt.Errorf("%w: %v", ErrOutput, err)
	}
	return nil
}

// copySideFiles copies the tokenizer and other side files (fsx.CopySideFiles).
func copySideFiles(src, dst string) error {
	if err := fsx.CopySideFiles(src, dst); err != nil {
		return fmt.Errorf("prune: %w", err)
	}
	return nil
}
