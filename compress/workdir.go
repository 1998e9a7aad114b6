package compress

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
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
	if log != nil {
		log.Info("stage started", "stage", s.name, "key", key[:12])
	}
	// A failed or interrupted stage leaves nothing behind (after a kill
	// the next run removes the temporary directory: removeStale).
	var out outputs
	var rb []byte
	err = fsx.WriteDir(final, func(tmp string) error {
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
		log.Info("stage finished", "stage", s.name, "seconds", rec.Seconds)
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
	f, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR, 0o644)
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

// removeStale deletes temporary stage directories (fsx.WriteDir's) left
// by killed runs.
func removeStale(dir string) error {
	es, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("compress: work dir: %w", err)
	}
	for _, e := range es {
		if fsx.IsTemp(e.Name()) {
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
