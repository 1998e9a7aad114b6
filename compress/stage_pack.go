package compress

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/internal/engine"
	"github.com/lmpack/lmpack/pack"
)

// packStage is the pack stage. Its cache key is the recipe up to and
// including pack (eval excluded), which the artifact records as its
// provenance. Its report hook copies the content hash the artifact's
// header stores into the Report.
func (p *pipeline) packStage() stage {
	packed := *p.r
	packed.Eval = nil
	p.packedRecipeJSON = section(&packed)
	return stage{name: "pack", params: p.packedRecipeJSON, run: p.pack,
		report: func(rep *Report, res json.RawMessage) error {
			var ps pack.Stats
			if err := json.Unmarshal(res, &ps); err != nil {
				return err
			}
			rep.ContentSHA256 = ps.ContentSHA256
			return nil
		}}
}

// pack writes the current model with the KV scheme as an artifact.
func (p *pipeline) pack(ctx context.Context, dir string) (outputs, any, error) {
	a, err := pack.FromCheckpoint(p.st.model, pack.FromOptions{KVRotations: p.st.kvRot, KVCache: p.st.kvName,
		KVSink: p.st.kvSink, KVRecent: p.st.kvRecent, Recipe: p.packedRecipeJSON, LmpackVersion: p.opt.Version,
		SourceModelFingerprint: p.srcFP})
	if err != nil {
		return outputs{}, nil, err
	}
	defer a.Close()
	if err := ctx.Err(); err != nil {
		return outputs{}, nil, err
	}
	st, err := pack.Write(filepath.Join(dir, "model.lmpk"), a, pack.WriteOptions{NoCompress: !*p.r.Pack.LZ4})
	if err != nil {
		return outputs{}, nil, err
	}
	if _, err := pack.Verify(filepath.Join(dir, "model.lmpk")); err != nil {
		return outputs{}, nil, err
	}
	st.Path, st.Sections = "model.lmpk", nil
	return outputs{Artifact: "model.lmpk"}, st, nil
}

// sizes fills rep.Sizes and rep.SHA256 from the source checkpoint and the
// artifact's manifest and section table.
func (p *pipeline) sizes(rep *Report) error {
	ck, err := safetensors.OpenDir(p.srcDir)
	if err != nil {
		return fmt.Errorf("compress: %w", err)
	}
	defer ck.Close()
	s := &rep.Sizes
	for _, n := range ck.Names() {
		t, err := ck.Tensor(n)
		if err != nil {
			return fmt.Errorf("compress: %w", err)
		}
		s.SourceTensorBytes += int64(len(t.Data))
	}
	// Parameters as lmpack inspect counts them: no tied lm_head copy, no
	// RoPE buffers.
	srcDesc, err := arch.Load(p.srcDir)
	if err != nil {
		return fmt.Errorf("compress: %w", err)
	}
	ins, err := engine.Inspect(p.srcDir, srcDesc, ck)
	if err != nil {
		return fmt.Errorf("compress: %w", err)
	}
	s.SourceParams = ins.Params
	r, err := pack.Open(p.st.artifact)
	if err != nil {
		return err
	}
	defer r.Close()
	var tensorRaw int64
	mm := &r.Manifest().Model
	for _, t := range r.Manifest().Tensors {
		if r.IsKVRotation(t.Name) || (mm.TieWordEmbeddings && t.Name == cmpOr(mm.LMHead, "lm_head.weight")) || strings.HasSuffix(t.Name, "rotary_emb.inv_freq") {
			continue
		}
		secs := []string{t.Section}
		if q := t.Quant; q != nil {
			secs = append(secs, q.ScaleSection, q.ZeroSection, q.PermSection)
		}
		for _, sec := range secs {
			if sec == "" {
				continue
			}
			_, raw, _, err := r.SectionInfo(sec)
			if err != nil {
				return err
			}
			tensorRaw += raw
		}
		s.Params += numel(t.Shape)
	}
	for _, n := range r.Names() {
		_, raw, stored, err := r.SectionInfo(n)
		if err != nil {
			return err
		}
		s.LZ4SavedBytes += raw - stored
	}
	st, err := os.Stat(p.st.artifact)
	if err != nil {
		return fmt.Errorf("compress: %w", err)
	}
	s.ArtifactBytes = st.Size()
	if s.Params > 0 {
		s.BitsPerWeight = 8 * float64(tensorRaw) / float64(s.Params)
	}
	if s.SourceParams > 0 {
		s.FileBitsPerSourceWeight = 8 * float64(s.ArtifactBytes) / float64(s.SourceParams)
	}
	s.Ratio = float64(s.SourceTensorBytes) / float64(s.ArtifactBytes)
	sum, err := fileFingerprint(p.st.artifact)
	if err != nil {
		return fmt.Errorf("compress: %w", err)
	}
	rep.SHA256 = sum
	return nil
}

func numel(shape []int) int64 {
	n := int64(1)
	for _, d := range shape {
		n *= int64(d)
	}
	return n
}
