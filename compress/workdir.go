package compress

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/internal/fsx"
	"github.com/lmpack/lmpack/model"
	"github.com/lmpack/lmpack/pack"
)

// outputs are the files a stage produced (paths relative to its
// directory in done.json) and what it changes in the pipeline state.
type outputs struct {
	Model       string `json:"model,omitempty"`
	Calib       string `json:"calib,omitempty"`
	ClearCalib  bool   `json:"clear_calib,omitempty"`
	KVRotations string `json:"kv_rotations,omitempty"`
	KVCache     string `json:"kv_cache,omitempty"`
	KVSink      int    `json:"kv_sink,omitempty"`
	KVRecent    int    `json:"kv_recent,omitempty"`
	Artifact    string `json:"artifact,omitempty"`
}

// present reports whether every output file or directory exists in dir
// (a finished stage whose files were deleted is recomputed).
func (o outputs) present(dir string) bool {
	for _, p := range []string{o.Model, o.Calib, o.KVRotations, o.Artifact} {
		if p == "" {
			continue
		}
		if _, err := os.Stat(filepath.Join(dir, p)); err != nil {
			return false
		}
	}
	return true
}

// validate checks that a cached stage's outputs in dir are usable: an
// artifact passes pack.Verify (every CRC-32C and the whole-file sha256);
// a model directory's config.json parses and agrees with its tensors
// (model.Check, which also catches a deleted or truncated
// shard); calibration and rotation files open as safetensors. The error
// names the file and what is wrong.
func (o outputs) validate(dir string) error {
	if o.Artifact != "" {
		if _, err := pack.Verify(filepath.Join(dir, o.Artifact)); err != nil {
			return err
		}
	}
	if o.Model != "" {
		m := filepath.Join(dir, o.Model)
		d, err := arch.Load(m)
		if err != nil {
			return err
		}
		ck, err := safetensors.OpenDir(m)
		if err != nil {
			return err
		}
		err = model.Check(m, d, ck)
		ck.Close()
		if err != nil {
			return err
		}
	}
	for _, f := range []string{o.Calib, o.KVRotations} {
		if f == "" {
			continue
		}
		ck, err := safetensors.OpenPath(filepath.Join(dir, f))
		if err != nil {
			return err
		}
		ck.Close()
	}
	return nil
}

// record is a stage's completion marker, done.json, written last.
type record struct {
	Stage   string          `json:"stage"`
	Key     string          `json:"key"`
	Seconds float64         `json:"seconds"`
	Outputs outputs         `json:"outputs"`
	Result  json.RawMessage `json:"result"`
}

// state is what the stages hand on: absolute paths.
type state struct {
	model, calib  string
	kvRot, kvName string
	kvSink        int
	kvRecent      int
	artifact      string
}

func (s *state) apply(dir string, o outputs) {
	abs := func(p string) string { return filepath.Join(dir, p) }
	if o.ClearCalib {
		s.calib = ""
	}
	if o.Model != "" {
		s.model = abs(o.Model)
	}
	if o.Calib != "" {
		s.calib = abs(o.Calib)
	}
	if o.KVCache != "" {
		s.kvName, s.kvSink, s.kvRecent, s.kvRot = o.KVCache, o.KVSink, o.KVRecent, ""
		if o.KVRotations != "" {
			s.kvRot = abs(o.KVRotations)
		}
	}
	if o.Artifact != "" {
		s.artifact = abs(o.Artifact)
	}
}

// runStage reuses the stage's directory when its completion marker holds
// the key, and otherwise runs it in a temporary directory that is renamed
// into place after done.json is written.
func (p *pipeline) runStage(ctx context.Context, s stage, key string) (*StageReport, error) {
	t0 := time.Now()
	if !slices.Contains(stageNames, s.name) {
		return nil, fmt.Errorf("compress: stage %q is missing from stageNames (removeStale would not clean its temporaries)", s.name)
	}
	final := filepath.Join(p.work, s.name+"-"+key[:24])
	log := p.opt.Logger
	rec, err := readRecord(final)
	cached := err == nil && rec.Key == key && rec.Stage == s.name && rec.Outputs.present(final)
	if cached && p.invalidated {
		cached = false // an earlier stage was recomputed after a failed check
	}
	if cached {
		if verr := rec.Outputs.validate(final); verr != nil {
			cached, p.invalidated = false, true
			if log != nil {
				log.Warn("stage cache invalid; recomputing", "stage", s.name, "dir", final, "error", verr.Error())
			}
		}
	}
	if cached {
		p.st.apply(final, rec.Outputs)
		if log != nil {
			log.Info("stage cached", "stage", s.name, "key", key[:12], "dir", final)
		}
		return &StageReport{Name: s.name, Key: key, Cached: true, Seconds: time.Since(t0).Seconds(), ComputeSeconds: rec.Seconds, Result: rec.Result}, nil
	}
	if err := os.RemoveAll(final); err != nil {
		return nil, fmt.Errorf("compress: stage %s: %w", s.name, err)
	}
	// A failed or interrupted stage leaves nothing behind (after a kill
	// the next run removes the temporary directory: removeStale).
	var out outputs
	var rb []byte
	err = fsx.WriteDir(final, func(tmp string) error {
		// Logged once the temporary directory exists: a kill after this
		// line leaves it for the next run to remove.
		if log != nil {
			log.Info("stage started", "stage", s.name, "key", key[:12])
		}
		o, res, err := s.run(ctx, tmp)
		if err != nil {
			return err
		}
		if rb, err = json.Marshal(res); err != nil {
			return fmt.Errorf("result: %w", err)
		}
		out = o
		rec = &record{Stage: s.name, Key: key, Seconds: time.Since(t0).Seconds(), Outputs: out, Result: rb}
		return writeRecord(tmp, rec)
	})
	if err != nil {
		return nil, fmt.Errorf("compress: stage %s: %w", s.name, err)
	}
	p.st.apply(final, out)
	if log != nil {
		// The stage's own lines name files in its temporary directory;
		// this one names where they are now.
		log.Info("stage finished", "stage", s.name, "seconds", rec.Seconds, "dir", final)
	}
	return &StageReport{Name: s.name, Key: key, Seconds: rec.Seconds, ComputeSeconds: rec.Seconds, Result: rb}, nil
}

const doneFile = "done.json"

func readRecord(dir string) (*record, error) {
	b, err := os.ReadFile(filepath.Join(dir, doneFile))
	if err != nil {
		return nil, err
	}
	var r record
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// writeRecord writes dir/done.json (fsx.WriteDir syncs it).
func writeRecord(dir string, r *record) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, doneFile), append(b, '\n'), 0o644)
}

// lockDir takes an exclusive flock on dir/lock, so that two compress runs
// cannot share a work directory. Errors: the lock is held (naming dir).
func lockDir(dir string) (func(), error) {
	f, err := os.OpenFile(filepath.Join(dir, lockFile), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("compress: work dir: %w", err)
	}
	if err := fsx.TryLock(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("compress: work dir %s is in use by another lmpack compress (%v)", dir, err)
	}
	return func() {
		fsx.Unlock(f)
		f.Close()
	}, nil
}

// stageNames are the names of all stages (stage.name): a work directory
// holds "<name>-<24 hex digits>" stage directories (stageDir), their
// temporaries while a stage runs (fsx.WriteDir), lockFile and workMarker.
var stageNames = []string{"calibrate", "prune-layers", "prune-width", "quantize-weights", "quantize-kv", "pack", "eval"}

// workMarker is the file that marks a directory as an lmpack compress
// work directory; prepareWorkDir refuses a non-empty directory without it
// (unless it holds only what a work directory holds), and Run writes it.
const workMarker = "lmpack-work-dir"

// workMarkerText is workMarker's content, for a person who finds it.
const workMarkerText = "This directory is the stage cache of lmpack compress (one directory per finished stage).\n" +
	"lmpack removes its own temporaries here; delete the whole directory when no lmpack compress uses it.\n"

// lockFile is the file lockDir locks.
const lockFile = "lock"

// stageDir reports whether name is a stage directory's name: a stage
// name, "-" and 24 lowercase hex digits (runStage).
func stageDir(name string) bool {
	for _, s := range stageNames {
		if rest, ok := strings.CutPrefix(name, s+"-"); ok && len(rest) == 24 && strings.Trim(rest, "0123456789abcdef") == "" {
			return true
		}
	}
	return false
}

// prepareWorkDir makes sure dir can serve as the work directory: it
// creates it (and its parents) when missing; an existing directory must
// be empty, hold workMarker, or hold only what a work directory of an
// lmpack before the marker held (lockFile, stage directories and their
// temporaries), so that compress never sweeps or fills a directory of
// other files. Errors: dir is not a directory; dir holds other entries
// (naming dir and the first one); os errors.
func prepareWorkDir(dir string) error {
	es, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("compress: work dir: %w", err)
		}
		return nil
	}
	if err != nil {
		if st, serr := os.Stat(dir); serr == nil && !st.IsDir() {
			return fmt.Errorf("compress: work dir %s is a file, not a directory; choose another --work-dir", dir)
		}
		return fmt.Errorf("compress: work dir: %w", err)
	}
	for _, e := range es {
		if e.Name() == workMarker {
			return nil
		}
	}
	for _, e := range es {
		n := e.Name()
		if n == lockFile || e.IsDir() && stageDir(n) {
			continue
		}
		if b, ok := fsx.TempOf(n); ok && stageDir(b) {
			continue
		}
		return fmt.Errorf("compress: work dir %s is not empty and is not an lmpack work directory (it has no %s file and holds %q); choose a new or empty --work-dir, or the work directory of an earlier lmpack compress",
			dir, workMarker, n)
	}
	return nil
}

// markWorkDir writes dir/workMarker when it is missing (atomically,
// fsx.WriteBytes). Errors: os errors, naming the file.
func markWorkDir(dir string) error {
	p := filepath.Join(dir, workMarker)
	if _, err := os.Lstat(p); err == nil {
		return nil
	}
	if err := fsx.WriteBytes(p, []byte(workMarkerText), 0o644); err != nil {
		return fmt.Errorf("compress: work dir: %w", err)
	}
	return nil
}

// removeStale deletes the temporary stage directories (fsx.WriteDir's,
// named after a stage directory: fsx.TempOf, stageDir) that killed runs
// left in the work directory dir, which Run has locked. Nothing else is
// touched.
func removeStale(dir string) error {
	es, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("compress: work dir: %w", err)
	}
	for _, e := range es {
		if b, ok := fsx.TempOf(e.Name()); ok && stageDir(b) {
			if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
				return fmt.Errorf("compress: work dir: %w", err)
			}
		}
	}
	return nil
}

// copyAtomic copies src to dst atomically (fsx.WriteAtomic, mode 0644).
func copyAtomic(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("compress: %w", err)
	}
	defer in.Close()
	if err := fsx.WriteAtomic(dst, 0o644, func(f *os.File) error {
		_, err := io.Copy(f, in)
		return err
	}); err != nil {
		return fmt.Errorf("compress: output %s: %w", dst, err)
	}
	return nil
}
