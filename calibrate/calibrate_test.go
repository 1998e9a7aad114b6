package calibrate

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/internal/shared"
	"github.com/lmpack/lmpack/model"
)

// calibTokens keeps the real-model tests fast: 4 windows of 512.
const calibTokens, calibCtx = 2048, 512

func openEngine(t testing.TB, name string) *model.Loaded {
	t.Helper()
	e, err := model.Load(context.Background(), shared.Path(t, name), model.LoadOptions{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// qkvRecorder keeps copies of everything the QKV hook sees, per layer, in
// call order.
type qkvRecorder struct{ q, k, v [][]float32 }

func (r *qkvRecorder) QKV(l, pos, n int, q, k, v []float32) {
	r.q[l] = append(r.q[l], q...)
	r.k[l] = append(r.k[l], k...)
	r.v[l] = append(r.v[l], v...)
}

// directOSCAR is the reference: the formulas of docs/METHODS.md §1
// (compute_qqt of FutureMLS-Lab/OSCAR for C_Q; C_S weighted by the layer's
// C_Q, where compute_sst uses each head's own) written out naively from
// all captured rows of one layer (q: [T, nh*d], k, v: [T, nkv*d]), with
// the per-token weights explicitly renormalised to mean 1 per head.
func directOSCAR(q, k, v []float32, nh, nkv, d int) (cq, cs []float64) {
	T := len(k) / (nkv * d)
	g := nh / nkv
	cq, cs = make([]float64, d*d), make([]float64, d*d)
	for h := 0; h < nkv; h++ {
		for t := 0; t < T; t++ {
			for j := 0; j < g; j++ {
				row := q[t*nh*d+(h*g+j)*d:][:d]
				for a := 0; a < d; a++ {
					for b := 0; b < d; b++ {
						cq[a*d+b] += float64(row[a]) * float64(row[b]) / float64(T*g) / float64(nkv)
					}
				}
			}
		}
	}
	for h := 0; h < nkv; h++ {
		w := make([]float64, T)
		var sum float64
		for t := 0; t < T; t++ {
			kt := k[t*nkv*d+h*d:][:d]
			for a := 0; a < d; a++ {
				for b := 0; b < d; b++ {
					w[t] += float64(kt[a]) * cq[a*d+b] * float64(kt[b])
				}
			}
			sum += w[t]
		}
		for t := 0; t < T; t++ {
			wt := w[t] / sum * float64(T)
			vt := v[t*nkv*d+h*d:][:d]
			for a := 0; a < d; a++ {
				for b := 0; b < d; b++ {
					cs[a*d+b] += wt * float64(vt[a]) * float64(vt[b]) / float64(T) / float64(nkv)
				}
			}
		}
	}
	return cq, cs
}

// relErr is max|a-b| / max|b|.
func relErr(a, b []float64) float64 {
	var num, den float64
	for i := range b {
		num = max(num, math.Abs(a[i]-b[i]))
		den = max(den, math.Abs(b[i]))
	}
	return num / den
}

// TestRunMatchesDirect: Run on stories260K writes a file whose C_Q and C_S
// equal a direct float64 computation from q, k, v captured independently
// with an observer over the same windows; the header records the
// fingerprints, and Read returns exactly what was computed.
func TestRunMatchesDirect(t *testing.T) {
	dir := shared.Path(t, "stories260K-hf")
	data := shared.Path(t, "tinystories-valid", "calib.txt")
	out := filepath.Join(t.TempDir(), "calib.safetensors")
	var calls, last, total int
	s, err := Run(context.Background(), Options{Model: dir, Data: data, Tokens: calibTokens, Ctx: calibCtx, Out: out, Threads: 1, Version: "test-1",
		Progress: func(done, tot int) { calls, last, total = calls+1, done, tot }})
	if err != nil {
		t.Fatal(err)
	}
	if s.Windows != 4 || s.Tokens != calibTokens || s.TokensPerSecond <= 0 {
		t.Errorf("summary %+v: want 4 windows of %d tokens", s, calibCtx)
	}
	if calls != 8 || last != 2*calibTokens || total != 2*calibTokens {
		t.Errorf("progress: %d calls, last %d of %d; want 8 calls ending at %d", calls, last, total, 2*calibTokens)
	}

	// Independent capture.
	e := openEngine(t, "stories260K-hf")
	L := len(e.Desc.Layers)
	rec := &qkvRecorder{q: make([][]float32, L), k: make([][]float32, L), v: make([][]float32, L)}
	blk := &blockRecorder{in: make([][]float32, L+1)}
	att := &attnRecorder{att: make([][]float32, L)}
	e.Model.SetObserver(struct {
		*qkvRecorder
		*blockRecorder
		*attnRecorder
	}{rec, blk, att})
	text, err := os.ReadFile(data)
	if err != nil {
		t.Fatal(err)
	}
	ids := e.Tokenizer.Encode(string(text), true)
	if ids[0] != 1 {
		t.Fatalf("first id %d, want BOS 1", ids[0])
	}
	cache := e.Model.NewCache(calibCtx)
	logits := make([]float32, e.Desc.VocabSize)
	for lo := 0; lo < calibTokens; lo += calibCtx {
		cache.Truncate(0)
		if err := e.Model.Forward(context.Background(), ids[lo:lo+calibCtx], cache, logits, false); err != nil {
			t.Fatal(err)
		}
	}
	e.Model.SetObserver(nil)

	fp, err := model.Fingerprint(e.Dir, e.Checkpoint)
	if err != nil {
		t.Fatal(err)
	}
	c, err := Read(out, model.Expect{ModelFingerprint: fp, Desc: e.Desc})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.TokenIDs, ids[:calibTokens]) {
		t.Errorf("token ids in the file differ from the tokenized calibration text")
	}
	if w := c.CalibrationWindows(); len(w) != 4 || len(w[3]) != calibCtx || w[3][0] != ids[3*calibCtx] {
		t.Errorf("CalibrationWindows: %d windows; want 4 of %d tokens", len(w), calibCtx)
	}
	sum := sha256.Sum256(text)
	h := c.Header
	if h.Kind != Kind || h.FormatVersion != 1 || h.ModelFingerprint != fp || h.DataFingerprint != hex.EncodeToString(sum[:]) ||
		h.Tokens != calibTokens || h.Ctx != calibCtx || h.LmpackVersion != "test-1" || !slices.Equal(h.Statistics, []string{"oscar", "lorp", "tokens", "heads"}) {
		t.Errorf("header %+v", h)
	}
	if len(c.OSCAR) != L {
		t.Fatalf("%d OSCAR layers, want %d", len(c.OSCAR), L)
	}
	for l := 0; l < L; l++ {
		ly := e.Desc.Layers[l]
		if n := len(rec.q[l]); n != calibTokens*ly.QDim() {
			t.Fatalf("layer %d: captured %d q values", l, n)
		}
		cq, cs := directOSCAR(rec.q[l], rec.k[l], rec.v[l], ly.NumHeads, ly.NumKVHeads, ly.HeadDim)
		if r := relErr(c.OSCAR[l].CQ, cq); r > 1e-9 {
			t.Errorf("layer %d: C_Q relative error %.3g vs the direct computation", l, r)
		}
		if r := relErr(c.OSCAR[l].CS, cs); r > 1e-9 {
			t.Errorf("layer %d: C_S relative error %.3g vs the direct computation", l, r)
		}
		if l == 0 {
			t.Logf("layer 0: C_Q rel err %.2g, C_S rel err %.2g, C_Q[0,0] %.6g, C_S[0,0] %.6g",
				relErr(c.OSCAR[l].CQ, cq), relErr(c.OSCAR[l].CS, cs), cq[0], cs[0])
		}
	}

	// Block similarity against a naive per-token cosine of the captured
	// block inputs (and the last block's output as state L).
	H := e.Desc.HiddenSize
	direct := directSimilarity(blk.in, H)
	if len(c.Similarity) != (L+1)*(L+1) {
		t.Fatalf("similarity has %d values, want (L+1)² = %d", len(c.Similarity), (L+1)*(L+1))
	}
	var maxDiff float64
	for i := range direct {
		maxDiff = max(maxDiff, math.Abs(direct[i]-c.Similarity[i]))
	}
	if maxDiff > 1e-9 {
		t.Errorf("similarity differs from the direct computation by %.3g", maxDiff)
	}
	t.Logf("similarity max diff %.2g; S[0][1] %.6f, S[3][4] %.6f, S[4][5] %.6f", maxDiff, direct[1], direct[3*(L+1)+4], direct[4*(L+1)+5])

	// Head proxy: mean over tokens of each group's squared attention
	// output, summed naively from the captured o_proj inputs.
	if len(c.HeadProxy) != L {
		t.Fatalf("head proxy for %d layers, want %d", len(c.HeadProxy), L)
	}
	for l := 0; l < L; l++ {
		ly := e.Desc.Layers[l]
		qd, w := ly.QDim(), ly.NumHeads/ly.NumKVHeads*ly.HeadDim
		if len(att.att[l]) != calibTokens*qd || len(c.HeadProxy[l]) != ly.NumKVHeads {
			t.Fatalf("layer %d: captured %d attention values, proxy has %d groups", l, len(att.att[l]), len(c.HeadProxy[l]))
		}
		for g := 0; g < ly.NumKVHeads; g++ {
			var s float64
			for i, v := range att.att[l] {
				if (i%qd)/w == g {
					s += float64(v) * float64(v)
				}
			}
			want := s / calibTokens
			if got := c.HeadProxy[l][g]; math.Abs(got-want) > 1e-9*want || !(want > 0) {
				t.Errorf("layer %d group %d: head proxy %v, direct %v", l, g, got, want)
			}
		}
	}
	t.Logf("head proxy layer 0: %.5f", c.HeadProxy[0])

	// Round trip: writing what was read gives the same bytes.
	out2 := filepath.Join(t.TempDir(), "again.safetensors")
	if err := Write(out2, c); err != nil {
		t.Fatal(err)
	}
	b1, _ := os.ReadFile(out)
	b2, _ := os.ReadFile(out2)
	if !slices.Equal(b1, b2) {
		t.Errorf("rewriting the file read back gives different bytes (%d vs %d)", len(b1), len(b2))
	}

	// The MoE model shares every attention shape but not the fingerprint.
	moe := openEngine(t, "stories260K-moe-hf")
	fpMoE, err := model.Fingerprint(moe.Dir, moe.Checkpoint)
	if err != nil {
		t.Fatal(err)
	}
	_, err = Read(out, model.Expect{ModelFingerprint: fpMoE, Desc: moe.Desc})
	if !errors.Is(err, model.ErrModelMismatch) || !strings.Contains(err.Error(), fp) || !strings.Contains(err.Error(), fpMoE) || !strings.Contains(err.Error(), out) {
		t.Errorf("reading with the MoE model's fingerprint: %v; want model.ErrModelMismatch naming the file and both fingerprints", err)
	}
}

func TestWindows(t *testing.T) {
	ids := make([]int, 10)
	for i := range ids {
		ids[i] = i
	}
	for _, c := range []struct {
		tokens, ctx int
		want        []int // window lengths
		err         string
	}{
		{10, 5, []int{5, 5}, ""},
		{7, 3, []int{3, 3, 1}, ""},
		{4, 8, []int{4}, ""},
		{11, 4, nil, "10 tokens, fewer than the 11 requested"},
		{0, 4, nil, "want both > 0"},
		{4, 0, nil, "want both > 0"},
	} {
		w, err := Windows(ids, c.tokens, c.ctx)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("Windows(%d, %d): error %v, want %q", c.tokens, c.ctx, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		var lens, flat []int
		for _, x := range w {
			lens = append(lens, len(x))
			flat = append(flat, x...)
		}
		if !slices.Equal(lens, c.want) || !slices.Equal(flat, ids[:c.tokens]) {
			t.Errorf("Windows(%d, %d): lengths %v, tokens %v", c.tokens, c.ctx, lens, flat)
		}
	}
}

// TestRunOptions: invalid options and data fail before any work, naming
// the problem.
func TestRunOptions(t *testing.T) {
	dir := shared.Path(t, "stories260K-hf")
	data := shared.Path(t, "tinystories-valid", "calib.txt")
	tmp := t.TempDir()
	short := filepath.Join(tmp, "short.txt")
	os.WriteFile(short, []byte("Once upon a time."), 0o644)
	ok := Options{Model: dir, Data: data, Tokens: 64, Ctx: 32, Out: filepath.Join(tmp, "c.safetensors"), Threads: 1}
	for _, c := range []struct {
		name string
		mod  func(*Options)
		want string
	}{
		{"tokens", func(o *Options) { o.Tokens = 0 }, "Tokens 0: want 1 to 1073741824"},
		{"ctx", func(o *Options) { o.Ctx = -1 }, "Ctx -1: want >= 2"},
		{"ctx too long", func(o *Options) { o.Ctx, o.Tokens = 1024, 2048 }, "Ctx 1024: want at most the model's max_position_embeddings 512"},
		{"no out", func(o *Options) { o.Out = "" }, "Out: want the calibration file to write"},
		{"out dir missing", func(o *Options) { o.Out = filepath.Join(tmp, "nope", "c.safetensors") }, "no such file or directory"},
		{"out is dir", func(o *Options) { o.Out = tmp }, "is a directory"},
		{"data missing", func(o *Options) { o.Data = filepath.Join(tmp, "missing.txt") }, "missing.txt"},
		{"data short", func(o *Options) { o.Data = short }, "fewer than the 64 requested"},
		{"out is another file", func(o *Options) { o.Out = short }, "is not an lmpack calibration file; refusing to overwrite"},
		{"negative expert memory", func(o *Options) { o.MaxExpertBytes = -1 }, "MaxExpertBytes -1: want bytes >= 0"},
		{"all experts on a dense model", func(o *Options) { o.AllExperts = true }, dir + ": AllExperts: want a mixture-of-experts model"},
	} {
		o := ok
		c.mod(&o)
		_, err := Run(context.Background(), o)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want %q", c.name, err, c.want)
		}
	}
	if _, err := os.Stat(ok.Out); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a failed run left %s behind", ok.Out)
	}
	if b, _ := os.ReadFile(short); string(b) != "Once upon a time." {
		t.Errorf("a refused output was overwritten")
	}
	// An earlier calibration file is replaced.
	if _, err := Run(context.Background(), ok); err != nil {
		t.Fatal(err)
	}
	if _, err := Run(context.Background(), ok); err != nil {
		t.Errorf("rerun onto an existing calibration file: %v", err)
	}
}

// blockRecorder keeps copies of every block input (states 0..L−1) and of
// the last block's output (state L), in call order.
type blockRecorder struct{ in [][]float32 }

func (r *blockRecorder) BlockInput(l, pos, n int, x []float32) { r.in[l] = append(r.in[l], x...) }
func (r *blockRecorder) BlockOutput(l, pos, n int, x []float32) {
	if l == len(r.in)-2 {
		r.in[l+1] = append(r.in[l+1], x...)
	}
}

// directSimilarity is S_ij = mean_t cos(h_i(t), h_j(t)) written out
// naively in float64 over all captured tokens.
func directSimilarity(states [][]float32, H int) []float64 {
	m := len(states)
	T := len(states[0]) / H
	S := make([]float64, m*m)
	for i := 0; i < m; i++ {
		for j := 0; j < m; j++ {
			var sum float64
			for t := 0; t < T; t++ {
				a, b := states[i][t*H:(t+1)*H], states[j][t*H:(t+1)*H]
				var ab, aa, bb float64
				for k := range a {
					ab += float64(a[k]) * float64(b[k])
					aa += float64(a[k]) * float64(a[k])
					bb += float64(b[k]) * float64(b[k])
				}
				sum += ab / math.Sqrt(aa*bb)
			}
			S[i*m+j] = sum / float64(T)
		}
	}
	return S
}

// attnRecorder keeps every o_proj input the AttnOutput hook sees, per
// layer, in call order.
type attnRecorder struct{ att [][]float32 }

func (r *attnRecorder) AttnOutput(l, pos, n int, att []float32) { r.att[l] = append(r.att[l], att...) }
