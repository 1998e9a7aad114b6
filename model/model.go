// Package model is the one place that opens a model: it resolves a MODEL
// argument (a local checkpoint directory, a Hugging Face hub id through
// internal/hub, or an lmpack artifact, see IsArtifact), opens a checkpoint
// directory (config.json as an *arch.Description, the weights as a
// *safetensors.Checkpoint), checks that the two agree (Check), loads it on
// the CPU backend with its tokenizer (Load), and fingerprints it
// (Fingerprint) so that files derived from a model (calibration and
// rotation files) can be checked against it (Expect, ErrModelMismatch).
//
// The stages (calibrate, prune, quantize/..., pack) open models through
// this package and run them through runtime; internal/engine builds the
// command-line facade (device choice, artifacts, generation) on top of it.
package model

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/internal/fsx"
	"github.com/lmpack/lmpack/internal/hub"
)

// ConfigFile is the file of a checkpoint directory that describes the
// model (the Hugging Face config.json, parsed by arch.Parse).
const ConfigFile = "config.json"

// MetadataKey is the "__metadata__" key of the safetensors header of an
// lmpack file derived from a model (a calibration file, a rotation file)
// that holds the file's header as JSON, with the model_fingerprint of the
// model it was computed on.
const MetadataKey = "lmpack"

// ErrModelMismatch is wrapped by the readers of files derived from a model
// (calibrate.Read, oscar.ReadFile) when the file's model_fingerprint is not
// Expect.ModelFingerprint: the file was computed on another model.
var ErrModelMismatch = errors.New("file is from another model")

// ErrNoConfig is wrapped by Open and OpenDir when the directory has no
// config.json: it is not a Hugging Face checkpoint directory.
var ErrNoConfig = errors.New("no config.json")

// Expect is what a file derived from a model (calibration file, rotation
// file) is checked against when it is read. The zero value checks only
// the file's own consistency.
type Expect struct {
	// ModelFingerprint, when not empty, must equal the file's
	// model_fingerprint (ErrModelMismatch otherwise); see Fingerprint.
	ModelFingerprint string
	// Desc, when not nil, fixes the number of layers and each layer's
	// head_dim (and for calibration files the vocab_size and MoE shapes).
	Desc *arch.Description
}

// Resolve turns a MODEL argument into a local directory: an existing
// directory is returned unchanged; a hub id ("org/name[@revision]") is
// looked up in the Hugging Face cache and downloaded when absent
// (hub.Resolve with *h; h nil means HubOptions(nil)).
//
// Errors: a regular file (an lmpack artifact given where a checkpoint is
// needed, a corrupt or empty .lmpk, any other file; each says which); a
// path that looks local (absolute, starting with ".", or whose parent
// directory exists) but does not exist; a missing .lmpk file; those of
// hub.Resolve (hub.ErrNotModelID, hub.ErrNotCached, hub.ErrUnreachable,
// ...).
func Resolve(ctx context.Context, model string, h *hub.Options) (string, error) {
	if st, err := os.Stat(model); err == nil && st.IsDir() {
		return model, nil
	} else if err == nil {
		return "", fileModelError(model)
	}
	// A path whose parent exists locally (./x, /x, dir/x with dir present)
	// is a mistyped directory, not a hub id.
	if filepath.IsAbs(model) || strings.HasPrefix(model, ".") || dirExists(filepath.Dir(model)) && filepath.Dir(model) != "." {
		return "", fmt.Errorf("model: MODEL %q: no such directory", model)
	}
	if strings.HasSuffix(model, ".lmpk") {
		return "", fmt.Errorf("model: MODEL %q: no such artifact file", model)
	}
	if h == nil {
		h = HubOptions(nil)
	}
	return hub.Resolve(ctx, model, *h)
}

func dirExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.IsDir()
}

// HubOptions returns hub.OptionsFromEnv with download progress on stderr
// (a bar on a terminal, else log lines) and the hub's log lines sent to
// logger, so they follow --log-format; a nil logger leaves the hub's
// default (text lines on stderr).
func HubOptions(logger *slog.Logger) *hub.Options {
	o := hub.OptionsFromEnv()
	o.Progress = os.Stderr
	o.Terminal = hub.IsTerminal(os.Stderr)
	o.Logger = logger
	return &o
}

// Open resolves model (Resolve; h nil means HubOptions(nil)) and opens the
// checkpoint directory (OpenDir) without loading weights. The caller
// closes the checkpoint. Errors: those of Resolve and OpenDir.
func Open(ctx context.Context, model string, h *hub.Options) (string, *arch.Description, *safetensors.Checkpoint, error) {
	dir, err := Resolve(ctx, model, h)
	if err != nil {
		return "", nil, nil, err
	}
	d, ck, err := OpenDir(dir)
	if err != nil {
		return "", nil, nil, err
	}
	return dir, d, ck, nil
}

// OpenDir opens the checkpoint directory dir: config.json (arch.Load) and
// the safetensors weights (safetensors.OpenDir). The caller closes the
// checkpoint. Errors: ErrNoConfig naming dir when it has no config.json
// (saying what a model directory holds); arch.Load's errors (naming
// config.json and the field); safetensors.OpenDir's (a missing shard, no
// weights, malformed files).
func OpenDir(dir string) (*arch.Description, *safetensors.Checkpoint, error) {
	if _, err := os.Stat(filepath.Join(dir, ConfigFile)); errors.Is(err, os.ErrNotExist) {
		return nil, nil, fmt.Errorf("model: %s is not a model directory: it has %w (a Hugging Face checkpoint directory holds config.json, the *.safetensors weights and tokenizer.json)", dir, ErrNoConfig)
	}
	d, err := arch.Load(dir)
	if err != nil {
		return nil, nil, err
	}
	ck, err := safetensors.OpenDir(dir)
	if err != nil {
		return nil, nil, err
	}
	return d, ck, nil
}

// Check checks, without loading weights, that the checkpoint in dir and
// its description d agree: every tensor d names (StorageShapes: quantized
// weights by their storage tensors) is present with that shape (a tied
// lm_head may be absent), and no tensor is left over (CheckUnused).
// Commands that rewrite checkpoints (prune) call it so that they never
// write a checkpoint the runtime cannot load. Errors name dir, the tensor,
// its shape and the expected one; safetensors.ErrMissingTensor is wrapped
// for a missing tensor.
func Check(dir string, d *arch.Description, ck *safetensors.Checkpoint) error {
	want := d.StorageShapes()
	names := make([]string, 0, len(want))
	for n := range want {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		info, _, err := ck.Info(n)
		if err != nil {
			if n == d.LMHead && d.TieWordEmbeddings {
				continue
			}
			return fmt.Errorf("model: %s: config.json and the weights disagree: %w", dir, err)
		}
		if !slices.Equal(info.Shape, want[n]) {
			return fmt.Errorf("model: %s: config.json and the weights disagree: tensor %q has shape %v, config.json implies %v", dir, n, info.Shape, want[n])
		}
	}
	return CheckUnused(dir, d, ck)
}

// CheckUnused fails when the checkpoint holds tensors config.json does not
// describe (a config that disagrees with the weights, say fewer layers):
// running such a model would silently give wrong results. A tied lm_head
// stored explicitly and RoPE inv_freq buffers are not counted. The error
// names dir, the number of such tensors and the first one.
func CheckUnused(dir string, d *arch.Description, ck *safetensors.Checkpoint) error {
	want := d.StorageShapes() // quantized weights: their qweight/scales/... tensors
	var extra []string
	for _, n := range ck.Names() {
		if _, ok := want[n]; ok || (n == d.LMHead && d.TieWordEmbeddings) || strings.HasSuffix(n, "rotary_emb.inv_freq") {
			continue
		}
		extra = append(extra, n)
	}
	if len(extra) > 0 {
		return fmt.Errorf("model: %s: the checkpoint has %d tensors config.json does not describe (first %q); config.json and the weights disagree",
			dir, len(extra), extra[0])
	}
	return nil
}

// FingerprintTag starts every fingerprint Fingerprint returns; it names
// the fingerprint's version. Fingerprints made by older lmpack versions
// (64 hex digits without a tag, computed from config.json and the tensor
// layout only) never equal a tagged one; see OlderFingerprint.
const FingerprintTag = "v2:"

// fingerprintPrefix starts the hashed byte string of a v2 fingerprint.
const fingerprintPrefix = "lmpack-model-fingerprint-v2\n"

// Fingerprint identifies a model by its configuration and every byte of
// its weights: FingerprintTag followed by the lowercase hex sha256 of
//
//	"lmpack-model-fingerprint-v2\n"
//	uint64 little-endian len(config.json) ‖ config.json bytes
//	for each tensor, in name order:
//	    strconv.Quote(name) " " dtype " " shape " " hex(sha256(data)) "\n"
//
// where shape is formatted like [64 172] and data are the tensor's raw
// little-endian bytes as stored in the safetensors file. dir holds
// config.json; ck is the opened checkpoint. The fingerprint does not
// depend on where the files lie or how the tensors are split into shards
// (tensors are taken in name order, each hashed on its own); two
// checkpoints share it only when config.json's bytes and every tensor's
// name, dtype, shape and bytes are equal, so two checkpoints of one
// training run (same layout, other values) differ. Files derived from a
// model record it as model_fingerprint (Expect).
//
// Cost: every byte is hashed, by choice: a sample of each tensor (say its
// first, middle and last 4 KiB) would miss a checkpoint that differs
// elsewhere (a few edited rows, tokens added to an embedding), and a wrong
// match reuses another model's calibration or cached compress stages
// silently. The price is one read of every weight byte per call (through
// the mapping, so from disk when the files are not in the page cache;
// calibrate, prune, quantize and pack read every weight anyway, a fully
// cached compress rerun does not) and sha256 of it, computed per tensor on
// runtime.GOMAXPROCS(0) goroutines. BenchmarkFingerprint measured 550 MB/s
// on one core and 826 MB/s on two (a shared 2-core Xeon VM with SHA
// extensions), so a 70B-parameter BF16 checkpoint (140 GB) costs about 4
// minutes of CPU time, divided among the cores (under 20 s on 16 cores),
// usually less than reading it from disk.
//
// Errors: reading config.json (wrapped, naming the file); a tensor ck
// cannot read (naming it).
func Fingerprint(dir string, ck *safetensors.Checkpoint) (string, error) {
	cfg, err := fsx.ReadFile(filepath.Join(dir, ConfigFile))
	if err != nil {
		return "", fmt.Errorf("model: fingerprint: %w", err)
	}
	names := ck.Names()
	ts := make([]*safetensors.Tensor, len(names))
	for i, name := range names {
		if ts[i], err = ck.Tensor(name); err != nil {
			return "", fmt.Errorf("model: fingerprint: %w", err)
		}
	}
	sums := hashTensors(ts)
	h := sha256.New()
	h.Write([]byte(fingerprintPrefix))
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(cfg)))
	h.Write(n[:])
	h.Write(cfg)
	for i, t := range ts {
		fmt.Fprintf(h, "%s %s %v %x\n", strconv.Quote(t.Name), t.DType, t.Shape, sums[i])
	}
	return FingerprintTag + hex.EncodeToString(h.Sum(nil)), nil
}

// hashTensors returns the sha256 of each tensor's Data, computed on up to
// GOMAXPROCS goroutines, largest tensors first so that the work evens
// out.
func hashTensors(ts []*safetensors.Tensor) [][sha256.Size]byte {
	sums := make([][sha256.Size]byte, len(ts))
	order := make([]int, len(ts))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return len(ts[b].Data) - len(ts[a].Data) })
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), len(ts)) {
		wg.Go(func() {
			for {
				k := int(next.Add(1)) - 1
				if k >= len(order) {
					return
				}
				i := order[k]
				sums[i] = sha256.Sum256(ts[i].Data)
			}
		})
	}
	wg.Wait()
	return sums
}

// OlderFingerprint reports whether fp, a model_fingerprint read from a
// file, has the form of the fingerprints older lmpack versions made (64
// lowercase hex digits without FingerprintTag, computed from config.json
// and the tensor layout only): such a file cannot be matched against a
// model any more and must be made again. Readers use it to say so instead
// of "from another model".
func OlderFingerprint(fp string) bool {
	if len(fp) != 2*sha256.Size {
		return false
	}
	for _, c := range fp {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}
