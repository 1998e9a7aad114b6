package wquant

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/lmpack/lmpack/calibrate"
	"github.com/lmpack/lmpack/eval"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/internal/engine"
	"github.com/lmpack/lmpack/internal/shared"
	"github.com/lmpack/lmpack/runtime"
)

const (
	calibTokens = 4096 // 8 windows of 512 from calib.txt
	calibCtx    = 512
	evalWindows = 32 // heldout windows of 512 tokens for the PPL table
)

func model260K(t testing.TB) string { return shared.Path(t, "stories260K-hf") }

// calibFile writes a calibration file (with token ids) of stories260K on
// calib.txt into a temp dir.
func calibFile(t testing.TB) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "calib.safetensors")
	_, err := calibrate.Run(context.Background(), calibrate.Options{Model: model260K(t), Data: shared.Path(t, "tinystories-valid", "calib.txt"),
		Tokens: calibTokens, Ctx: calibCtx, Out: out, Threads: 1, Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// overlay serves float32 replacements over a checkpoint.
type overlay struct {
	base runtime.TensorSource
	repl map[string][]float32
	rows map[string][2]int
}

func (o *overlay) Tensor(name string) (*safetensors.Tensor, error) {
	if w, ok := o.repl[name]; ok {
		s := o.rows[name]
		return &safetensors.Tensor{Name: name, File: "(test)", DType: safetensors.F32, Shape: []int{s[0], s[1]}, Data: safetensors.F32Bytes(w)}, nil
	}
	return o.base.Tensor(name)
}

// heldoutIDs tokenizes heldout.txt with the model's tokenizer (BOS first).
func heldoutIDs(t testing.TB, e *engine.Engine) []int {
	t.Helper()
	b, err := os.ReadFile(shared.Path(t, "tinystories-valid", "heldout.txt"))
	if err != nil {
		t.Fatal(err)
	}
	ids := e.Tokenizer.Encode(string(b), false)
	if bos := e.Desc.BOSTokenID; bos >= 0 && (len(ids) == 0 || ids[0] != bos) {
		ids = append([]int{bos}, ids...)
	}
	return ids
}

// ppl returns the heldout perplexity of m over evalWindows windows of 512.
func ppl(t testing.TB, m runtime.Model, ids []int) float64 {
	t.Helper()
	r, err := eval.Perplexity(context.Background(), m, ids, eval.PerplexityOptions{Ctx: 512, MaxWindows: evalWindows})
	if err != nil {
		t.Fatal(err)
	}
	return r.Perplexity
}

func logits(t testing.TB, m runtime.Model, ids []int) []float32 {
	t.Helper()
	V := m.Description().VocabSize
	out := make([]float32, len(ids)*V)
	if err := m.Forward(context.Background(), ids, m.NewCache(len(ids)), out, true); err != nil {
		t.Fatal(err)
	}
	return out
}

func maxAbsDiff(a, b []float32) float64 {
	d := 0.0
	for i := range a {
		d = math.Max(d, math.Abs(float64(a[i]-b[i])))
	}
	return d
}
