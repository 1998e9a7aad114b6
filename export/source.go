package export

import (
	"context"
	"errors"
	"fmt"
	"github.com/lmpack/lmpack/internal/fsx"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/model"
	"github.com/lmpack/lmpack/pack"
	"github.com/lmpack/lmpack/quantize/weights"
	"github.com/lmpack/lmpack/runtime"
)

// source is an opened model: a checkpoint directory (plain or lmpack-wq)
// or an .lmpk artifact, seen through the same interface.
type source struct {
	// path is the MODEL argument; name the model's name (the directory's
	// or artifact's base name without extension).
	path, name string
	desc       *arch.Description
	// tensors serves plain tensors by name and, for quantized weights,
	// their storage tensors (docs/QUANT.md names).
	tensors runtime.TensorSource
	// file reads an auxiliary file (tokenizer.json, tokenizer_config.json,
	// config.json); fs.ErrNotExist when absent.
	file func(name string) ([]byte, error)
	// infos maps every (storage) tensor name to its dtype and shape, so
	// that planning reads no data.
	infos map[string]safetensors.TensorInfo
	// kv is the artifact's KV-cache scheme (nil for checkpoints).
	kv    *pack.KVScheme
	close func() error
}

// openSource opens model (an artifact when model.IsArtifact, else a
// checkpoint directory through model.Open).
func openSource(ctx context.Context, path string) (*source, error) {
	if model.IsArtifact(path) {
		r, d, err := openArtifact(path)
		if err != nil {
			return nil, err
		}
		return &source{
			path: path, name: strings.TrimSuffix(filepath.Base(path), filepath.Ext(path)),
			desc: d, tensors: r, file: r.File, kv: r.Manifest().KV, close: r.Close, infos: infoMap(r.TensorInfos()),
		}, nil
	}
	dir, d, ck, err := openCheckpoint(ctx, path)
	if err != nil {
		return nil, err
	}
	name := filepath.Base(filepath.Clean(dir))
	if _, err := os.Stat(path); err != nil {
		// A hub id "org/name[@revision]": the name, not the snapshot hash.
		name, _, _ = strings.Cut(filepath.Base(path), "@")
	}
	var infos []safetensors.TensorInfo
	for _, n := range ck.Names() {
		if ti, _, err := ck.Info(n); err == nil {
			infos = append(infos, ti)
		}
	}
	return &source{
		path: path, name: name, desc: d, tensors: ck, infos: infoMap(infos),
		file: func(name string) ([]byte, error) {
			b, err := fsx.ReadFile(filepath.Join(dir, name))
			if errors.Is(err, fs.ErrNotExist) {
				return nil, fmt.Errorf("export: %s has no %s: %w", dir, name, fs.ErrNotExist)
			}
			return b, err
		},
		close: ck.Close,
	}, nil
}

// openArtifact verifies the artifact at path (every section's CRC-32C, the
// file's sha256 and the loader's checks: export reads only some sections,
// and a corrupt artifact must not become a file another runtime loads),
// then opens it and reads its description. Errors: pack.Verify's (wrapped,
// saying to run lmpack verify), pack.Open's and Description's.
func openArtifact(path string) (*pack.Reader, *arch.Description, error) {
	if _, err := pack.Verify(path); err != nil {
		return nil, nil, fmt.Errorf("export: %s does not verify (run lmpack verify): %w", path, err)
	}
	r, err := pack.Open(path)
	if err != nil {
		return nil, nil, err
	}
	d, err := r.Description()
	if err != nil {
		r.Close()
		return nil, nil, err
	}
	return r, d, nil
}

// openCheckpoint opens a checkpoint directory or hub id (model.Open) and
// runs the loader's checks on it (model.Check: every tensor config.json
// describes, at its shape and dtype, and none it does not; a dropped
// qzeros or bias would change the model silently). Errors: those of
// model.Open and model.Check.
func openCheckpoint(ctx context.Context, path string) (string, *arch.Description, *safetensors.Checkpoint, error) {
	dir, d, ck, err := model.Open(ctx, path, nil)
	if err != nil {
		return "", nil, nil, err
	}
	if err := model.Check(dir, d, ck); err != nil {
		ck.Close()
		return "", nil, nil, err
	}
	return dir, d, ck, nil
}

func infoMap(ts []safetensors.TensorInfo) map[string]safetensors.TensorInfo {
	m := make(map[string]safetensors.TensorInfo, len(ts))
	for _, t := range ts {
		m[t.Name] = t
	}
	return m
}

// info returns the dtype and shape of tensor name without reading it.
// Errors: no such tensor (naming the model).
func (s *source) info(name string) (safetensors.TensorInfo, error) {
	if t, ok := s.infos[name]; ok {
		return t, nil
	}
	return safetensors.TensorInfo{}, fmt.Errorf("export: %s: tensor %q: %w", s.path, name, safetensors.ErrMissingTensor)
}

// weight is one 2-D (or 1-D) tensor of the model as export sees it:
// either float (t set) or quantized (q set).
type weight struct {
	name  string
	shape []int // row-major
	t     *safetensors.Tensor
	q     *weights.Quantized
	tq    arch.TensorQuant
}

// from describes the weight's lmpack storage for the report.
func (w *weight) from() string {
	if w.q == nil {
		return string(w.t.DType)
	}
	return quantDesc(w.tq)
}

func quantDesc(tq arch.TensorQuant) string {
	s := fmt.Sprintf("int%d g%d", tq.Bits, tq.GroupSize)
	if tq.Symmetric {
		s += " sym"
	} else {
		s += " asym"
	}
	if tq.Perm {
		s += " act-order"
	}
	return s
}

// quantOf returns the quantization of tensor name (ok false for a float
// tensor).
func (s *source) quantOf(name string) (arch.TensorQuant, bool) {
	if s.desc.Quant == nil {
		return arch.TensorQuant{}, false
	}
	tq, ok := s.desc.Quant.Tensors[name]
	return tq, ok
}

// shapeOf returns the logical row-major shape of tensor name without
// reading its data.
func (s *source) shapeOf(name string) ([]int, error) {
	if tq, ok := s.quantOf(name); ok {
		sc, err := s.info(arch.QuantPrefix(name) + arch.SuffixScales)
		if err != nil {
			return nil, err
		}
		if len(sc.Shape) != 2 {
			return nil, fmt.Errorf("export: %s: scales of %q: shape %v, want 2-D", s.path, name, sc.Shape)
		}
		return []int{sc.Shape[0], sc.Shape[1] * tq.GroupSize}, nil
	}
	t, err := s.info(name)
	if err != nil {
		return nil, err
	}
	return t.Shape, nil
}

// load reads the weight name (float or quantized storage).
func (s *source) load(name string) (*weight, error) {
	if tq, ok := s.quantOf(name); ok {
		q, _, err := runtime.ReadQuantized(s.tensors, name, tq)
		if err != nil {
			return nil, err
		}
		return &weight{name: name, shape: []int{q.Rows, q.Cols}, q: q, tq: tq}, nil
	}
	t, err := s.tensors.Tensor(name)
	if err != nil {
		return nil, err
	}
	switch t.DType {
	case safetensors.F32, safetensors.F16, safetensors.BF16:
	default:
		return nil, fmt.Errorf("export: %s: tensor %q has dtype %s, want F32, F16 or BF16", s.path, name, t.DType)
	}
	if len(t.Data) != t.NumElements()*t.DType.Size() {
		return nil, fmt.Errorf("export: %s: tensor %q: %d bytes for shape %v %s", s.path, name, len(t.Data), t.Shape, t.DType)
	}
	if i, what := safetensors.FirstNonFinite(t.DType, t.Data); i >= 0 {
		return nil, fmt.Errorf("export: %s: tensor %q (%s): element %d (row-major) is %s; lmpack's runtime refuses non-finite weights and another runtime would run them silently", s.path, name, t.DType, i, what)
	}
	return &weight{name: name, shape: t.Shape, t: t}, nil
}

// floats returns the weight's values (dequantized when quantized),
// row-major.
func (w *weight) floats() ([]float32, error) {
	if w.q != nil {
		out := make([]float32, w.q.Rows*w.q.Cols)
		w.q.Dequantize(out)
		return out, nil
	}
	return w.t.Float32()
}
