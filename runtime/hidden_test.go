package runtime

import (
	"math"
	"testing"

	"github.com/lmpack/lmpack/internal/shared"
)

type hiddenRecorder struct {
	blockIn, blockOut, attnX, oIn, ffnX [][]float32
}

func cp(x []float32) []float32 { return append([]float32(nil), x...) }

func (r *hiddenRecorder) BlockInput(l, _, _ int, x []float32)  { r.blockIn[l] = cp(x) }
func (r *hiddenRecorder) BlockOutput(l, _, _ int, x []float32) { r.blockOut[l] = cp(x) }
func (r *hiddenRecorder) AttnInput(l, _, _ int, x []float32)   { r.attnX[l] = cp(x) }
func (r *hiddenRecorder) OProjInput(l, _, _ int, a []float32)  { r.oIn[l] = cp(a) }
func (r *hiddenRecorder) FFNInput(l, _, _ int, x, _ []float32) { r.ffnX[l] = cp(x) }

func newAttnRecorder(L int) *hiddenRecorder {
	return &hiddenRecorder{make([][]float32, L), make([][]float32, L), make([][]float32, L), make([][]float32, L), make([][]float32, L)}
}

// rmsNorm64 is an independent float64 RMSNorm of each row of x [n, H].
func rmsNorm64(x []float32, w []float32, eps float64) []float64 {
	H := len(w)
	out := make([]float64, len(x))
	for r := 0; r < len(x)/H; r++ {
		s := 0.0
		for _, v := range x[r*H : (r+1)*H] {
			s += float64(v) * float64(v)
		}
		inv := 1 / math.Sqrt(s/float64(H)+eps)
		for j := 0; j < H; j++ {
			out[r*H+j] = float64(x[r*H+j]) * inv * float64(w[j])
		}
	}
	return out
}

// TestAttnObserverAndForwardHidden: AttnInput is input_layernorm(block
// input); the o_proj input a satisfies post_attention_layernorm(x + W_o·a)
// = the FFN input (recomputed in float64 from the checkpoint's weights);
// and ForwardHidden on the embedding rows reproduces Forward's last block
// output exactly.
func TestAttnObserverAndForwardHidden(t *testing.T) {
	dir := shared.Path(t, "stories260K-hf")
	m, d := loadDir(t, dir, 1)
	ck := loadCheckpoint(t, dir)
	L, H := len(d.Layers), d.HiddenSize
	r := newAttnRecorder(L)
	m.SetObserver(r)
	toks := []int{1, 403, 407, 261, 300, 5}
	n := len(toks)
	if err := m.Forward(t.Context(), toks, m.NewCache(n), make([]float32, d.VocabSize), false); err != nil {
		t.Fatal(err)
	}
	f32 := func(name string) []float32 {
		tt, err := ck.Tensor(name)
		if err != nil {
			t.Fatal(err)
		}
		v, _ := tt.Float32()
		return v
	}
	for l := 0; l < L; l++ {
		spec := &d.Layers[l]
		want := rmsNorm64(r.blockIn[l], f32(spec.Attn.Norm), d.RMSNormEps)
		if e := maxAbsDiff(r.attnX[l], want); e > 1e-5 || len(r.attnX[l]) != n*H {
			t.Errorf("layer %d: AttnInput differs from input_layernorm(x) by %g", l, e)
		}
		qd := spec.QDim()
		if len(r.oIn[l]) != n*qd {
			t.Fatalf("layer %d: OProjInput has %d values, want %d", l, len(r.oIn[l]), n*qd)
		}
		wo := f32(spec.Attn.O)
		x2 := make([]float32, n*H)
		for i := 0; i < n; i++ {
			for j := 0; j < H; j++ {
				s := float64(r.blockIn[l][i*H+j])
				for k := 0; k < qd; k++ {
					s += float64(wo[j*qd+k]) * float64(r.oIn[l][i*qd+k])
				}
				x2[i*H+j] = float32(s)
			}
		}
		want = rmsNorm64(x2, f32(spec.FFNNorm), d.RMSNormEps)
		if e := maxAbsDiff(r.ffnX[l], want); e > 1e-4 {
			t.Errorf("layer %d: post_attention_layernorm(x + W_o·a) differs from the FFN input by %g", l, e)
		}
	}
	emb := f32(d.Embedding)
	x := make([]float32, n*H)
	for i, id := range toks {
		copy(x[i*H:], emb[id*H:(id+1)*H])
	}
	m.SetObserver(nil)
	hf := m.(HiddenForwarder)
	if err := hf.ForwardHidden(t.Context(), x, n, m.NewCache(n)); err != nil {
		t.Fatal(err)
	}
	for i := range x {
		if x[i] != r.blockOut[L-1][i] {
			t.Fatalf("ForwardHidden differs from Forward's last block output at %d: %v vs %v", i, x[i], r.blockOut[L-1][i])
		}
	}
	if err := hf.ForwardHidden(t.Context(), x[:H+1], 1, m.NewCache(1)); err == nil {
		t.Error("ForwardHidden accepted a wrong-length x")
	}
}
