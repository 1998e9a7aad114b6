package width

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"gonum.org/v1/gonum/mat"
)

func randMat(rng *rand.Rand, rows, cols int, scale float64) []float32 {
	out := make([]float32, rows*cols)
	for i := range out {
		out[i] = float32(rng.NormFloat64() * scale)
	}
	return out
}

// matmulT returns fl32(X Wᵀ) computed in float64: x [n, F], w [D, F] → [n, D].
func matmulT(x []float32, w []float32, n, F, D int) []float32 {
	y := make([]float32, n*D)
	for t := 0; t < n; t++ {
		for r := 0; r < D; r++ {
			var s float64
			for c := 0; c < F; c++ {
				s += float64(x[t*F+c]) * float64(w[r*F+c])
			}
			y[t*D+r] = float32(s)
		}
	}
	return y
}

func relClose(a, b, tol float64) bool {
	return math.Abs(a-b) <= tol*math.Max(1, math.Max(math.Abs(a), math.Abs(b)))
}

func TestAccumulatorMatchesDirect(t *testing.T) {
	const F, D = 7, 5
	rng := rand.New(rand.NewPCG(1, 2))
	st, err := NewFFNStats(F, D)
	if err != nil {
		t.Fatal(err)
	}
	var xs, ys []float32
	for _, n := range []int{3, 0, 300, 1} { // 300 crosses the 256-row chunk
		x := randMat(rng, n, F, 1.5)
		y := randMat(rng, n, D, 0.7)
		if err := st.Add(x, y, n); err != nil {
			t.Fatal(err)
		}
		xs = append(xs, x...)
		ys = append(ys, y...)
	}
	N := len(xs) / F
	if st.Tokens() != int64(N) {
		t.Fatalf("tokens %d, want %d", st.Tokens(), N)
	}
	h, xty, e := st.H(), st.XTY(), st.Energy()
	for i := 0; i < F; i++ {
		for j := 0; j < F; j++ {
			var want float64
			for k := 0; k < N; k++ {
				want += float64(xs[k*F+i]) * float64(xs[k*F+j])
			}
			if !relClose(h[i*F+j], want, 1e-12) {
				t.Errorf("H[%d,%d] = %v, direct %v", i, j, h[i*F+j], want)
			}
		}
		for r := 0; r < D; r++ {
			var want float64
			for k := 0; k < N; k++ {
				want += float64(xs[k*F+i]) * float64(ys[k*D+r])
			}
			if !relClose(xty[i*D+r], want, 1e-12) {
				t.Errorf("XᵀY[%d,%d] = %v, direct %v", i, r, xty[i*D+r], want)
			}
		}
	}
	for r := 0; r < D; r++ {
		var want float64
		for k := 0; k < N; k++ {
			want += float64(ys[k*D+r]) * float64(ys[k*D+r])
		}
		want /= float64(N)
		if !relClose(e[r], want, 1e-12) {
			t.Errorf("energy[%d] = %v, direct %v", r, e[r], want)
		}
	}
	// Rebuilding from the moments gives the same statistics.
	st2, err := NewFFNStatsFromMoments(F, D, st.Tokens(), h, xty, e)
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range st2.H() {
		if v != h[i] {
			t.Fatalf("FromMoments H[%d] = %v, want %v", i, v, h[i])
		}
	}
	for r, v := range st2.Energy() {
		if !relClose(v, e[r], 1e-14) {
			t.Fatalf("FromMoments energy[%d] = %v, want %v", r, v, e[r])
		}
	}
}

// residual returns ‖X_p W'ᵀ − Y‖²_F in float64; wp is [D, k].
func residual(x, y, wp []float32, n, F, D int, kept []int) float64 {
	k := len(kept)
	var s float64
	for t := 0; t < n; t++ {
		for r := 0; r < D; r++ {
			var p float64
			for i, c := range kept {
				p += float64(x[t*F+c]) * float64(wp[r*k+i])
			}
			d := p - float64(y[t*D+r])
			s += d * d
		}
	}
	return s
}

func TestRefitIsLeastSquares(t *testing.T) {
	const F, D, n = 12, 6, 200
	rng := rand.New(rand.NewPCG(3, 4))
	x := randMat(rng, n, F, 1)
	w := randMat(rng, D, F, 0.5)
	y := matmulT(x, w, n, F, D)
	for i := range y { // noise: Y is not exactly representable by any kept subset
		y[i] += float32(0.1 * rng.NormFloat64())
	}
	st, _ := NewFFNStats(F, D)
	if err := st.Add(x, y, n); err != nil {
		t.Fatal(err)
	}
	kept := []int{0, 2, 3, 5, 6, 8, 10, 11}
	k := len(kept)
	refit, err := RefitDown(st, kept, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Reference: gonum's QR least-squares solve on the explicit X_p.
	xp := mat.NewDense(n, k, nil)
	for t0 := 0; t0 < n; t0++ {
		for i, c := range kept {
			xp.Set(t0, i, float64(x[t0*F+c]))
		}
	}
	ym := mat.NewDense(n, D, nil)
	for t0 := 0; t0 < n; t0++ {
		for r := 0; r < D; r++ {
			ym.Set(t0, r, float64(y[t0*D+r]))
		}
	}
	var ref mat.Dense // [k, D]
	if err := ref.Solve(xp, ym); err != nil {
		t.Fatal(err)
	}
	var maxd float64
	for r := 0; r < D; r++ {
		for i := 0; i < k; i++ {
			maxd = math.Max(maxd, math.Abs(float64(refit[r*k+i])-ref.At(i, r)))
		}
	}
	t.Logf("refit vs gonum QR least squares: max |Δw| = %.3g", maxd)
	if maxd > 1e-6 {
		t.Errorf("refit differs from least squares by %g", maxd)
	}
	sliced, err := SliceColumns(w, D, F, kept)
	if err != nil {
		t.Fatal(err)
	}
	rRefit := residual(x, y, refit, n, F, D, kept)
	rSlice := residual(x, y, sliced, n, F, D, kept)
	damped, err := RefitDown(st, kept, DefaultDamping)
	if err != nil {
		t.Fatal(err)
	}
	rDamped := residual(x, y, damped, n, F, D, kept)
	t.Logf("‖X_p W'ᵀ − Y‖²: refit(λ=0) %.6g, refit(default damping) %.6g, slice %.6g", rRefit, rDamped, rSlice)
	if !(rRefit < rSlice) {
		t.Errorf("refit residual %v not below slicing residual %v", rRefit, rSlice)
	}
	if !(rDamped < rSlice) {
		t.Errorf("damped refit residual %v not below slicing residual %v", rDamped, rSlice)
	}
	// Perturbing the refit in any column can only increase the residual.
	for i := 0; i < k; i++ {
		p := append([]float32(nil), refit...)
		p[i] += 0.01
		if rp := residual(x, y, p, n, F, D, kept); rp <= rRefit {
			t.Errorf("perturbing refit column %d lowered the residual: %v ≤ %v", i, rp, rRefit)
		}
	}
}

func TestRefitKeepAllReproducesW(t *testing.T) {
	const F, D, n = 16, 8, 400
	rng := rand.New(rand.NewPCG(5, 6))
	x := randMat(rng, n, F, 1)
	w := randMat(rng, D, F, 0.3)
	y := matmulT(x, w, n, F, D)
	st, _ := NewFFNStats(F, D)
	if err := st.Add(x, y, n); err != nil {
		t.Fatal(err)
	}
	all := make([]int, F)
	for i := range all {
		all[i] = i
	}
	tiny, err := RefitDown(st, all, 1e-12)
	if err != nil {
		t.Fatal(err)
	}
	var maxd float64
	for i := range w {
		maxd = math.Max(maxd, math.Abs(float64(tiny[i]-w[i])))
	}
	t.Logf("keep all, damping 1e-12: max |W' − W| = %.3g", maxd)
	if maxd > 1e-6 {
		t.Errorf("keep-all refit differs from W by %g > 1e-6", maxd)
	}
	// Default damping: W' = W·H(H+λI)⁻¹, so ‖W'−W‖_F ≤ λ/(σ_min+λ)·‖W‖_F.
	def, err := RefitDown(st, all, DefaultDamping)
	if err != nil {
		t.Fatal(err)
	}
	h := st.H()
	var tr float64
	for i := 0; i < F; i++ {
		tr += h[i*F+i]
	}
	lambda := DefaultDamping * tr / F
	var eig mat.EigenSym
	if !eig.Factorize(mat.NewSymDense(F, h), false) {
		t.Fatal("eigen factorisation failed")
	}
	smin := eig.Values(nil)[0]
	var dn, wn float64
	for i := range w {
		d := float64(def[i] - w[i])
		dn += d * d
		wn += float64(w[i]) * float64(w[i])
	}
	bound := lambda / (smin + lambda) * math.Sqrt(wn)
	t.Logf("keep all, default damping: ‖W'−W‖_F = %.4g, bound λ/(σmin+λ)‖W‖_F = %.4g", math.Sqrt(dn), bound)
	if math.Sqrt(dn) > bound*1.001+1e-6 {
		t.Errorf("damped keep-all error %g exceeds bound %g", math.Sqrt(dn), bound)
	}
}

func TestScoresPlantedNodes(t *testing.T) {
	const F, D, n = 10, 6, 400
	const useless, dominant = 3, 7
	rng := rand.New(rand.NewPCG(7, 8))
	x := randMat(rng, n, F, 1)
	w := randMat(rng, D, F, 0.5)
	for r := 0; r < D; r++ {
		w[r*F+useless] = 0
		w[r*F+dominant] *= 100
	}
	y := matmulT(x, w, n, F, D)
	st, _ := NewFFNStats(F, D)
	if err := st.Add(x, y, n); err != nil {
		t.Fatal(err)
	}
	kept, scores, err := SelectFFN(st, w, F-1)
	if err != nil {
		t.Fatal(err)
	}
	for c, s := range scores {
		if c != useless && !(s > scores[useless]) {
			t.Errorf("node %d score %v not above the useless node's %v", c, s, scores[useless])
		}
		if c != dominant && !(s < scores[dominant]) {
			t.Errorf("node %d score %v not below the dominant node's %v", c, s, scores[dominant])
		}
	}
	for _, c := range kept {
		if c == useless {
			t.Errorf("kept %v includes the useless node %d", kept, useless)
		}
	}
	one, _, err := SelectFFN(st, w, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(one) != 1 || one[0] != dominant {
		t.Errorf("keep 1 = %v, want [%d]", one, dominant)
	}
	// Independent reference: explicit LU inverse of H + λI.
	h := st.H()
	var tr float64
	for i := 0; i < F; i++ {
		tr += h[i*F+i]
	}
	hd := mat.NewDense(F, F, h)
	for i := 0; i < F; i++ {
		hd.Set(i, i, hd.At(i, i)+DefaultDamping*tr/F)
	}
	var inv mat.Dense
	if err := inv.Inverse(hd); err != nil {
		t.Fatal(err)
	}
	e := st.Energy()
	for c := 0; c < F; c++ {
		var want float64
		for r := 0; r < D; r++ {
			want += e[r] * float64(w[r*F+c]) * float64(w[r*F+c])
		}
		want /= inv.At(c, c) * inv.At(c, c)
		if !relClose(scores[c], want, 1e-9) {
			t.Errorf("score[%d] = %v, reference %v", c, scores[c], want)
		}
	}
}

func TestErrors(t *testing.T) {
	const F, D, n = 4, 3, 10
	rng := rand.New(rand.NewPCG(9, 10))
	if _, err := NewFFNStats(0, 3); !errors.Is(err, ErrShape) {
		t.Errorf("NewFFNStats(0,3): %v, want ErrShape", err)
	}
	st, _ := NewFFNStats(F, D)
	w := randMat(rng, D, F, 1)
	if _, _, err := SelectFFN(st, w, 2); !errors.Is(err, ErrNoData) {
		t.Errorf("select with no tokens: %v, want ErrNoData", err)
	}
	x := randMat(rng, n, F, 1)
	y := randMat(rng, n, D, 1)
	if err := st.Add(x[:len(x)-1], y, n); !errors.Is(err, ErrShape) {
		t.Errorf("short x: %v, want ErrShape", err)
	}
	if err := st.Add(x, y[:len(y)-1], n); !errors.Is(err, ErrShape) {
		t.Errorf("short y: %v, want ErrShape", err)
	}
	bad := append([]float32(nil), x...)
	bad[5] = float32(math.NaN())
	if err := st.Add(bad, y, n); !errors.Is(err, ErrNonFinite) {
		t.Errorf("NaN x: %v, want ErrNonFinite", err)
	}
	badY := append([]float32(nil), y...)
	badY[2] = float32(math.Inf(1))
	if err := st.Add(x, badY, n); !errors.Is(err, ErrNonFinite) {
		t.Errorf("Inf y: %v, want ErrNonFinite", err)
	}
	if st.Tokens() != 0 || st.H()[0] != 0 {
		t.Errorf("failed Add accumulated: tokens %d, H[0,0] %v", st.Tokens(), st.H()[0])
	}
	if err := st.Add(x, y, n); err != nil {
		t.Fatal(err)
	}
	for _, keep := range []int{0, -1, F + 1} {
		if _, _, err := SelectFFN(st, w, keep); !errors.Is(err, ErrKeep) {
			t.Errorf("keep %d: %v, want ErrKeep", keep, err)
		}
	}
	if _, _, err := SelectFFN(st, w[:len(w)-1], 2); !errors.Is(err, ErrShape) {
		t.Errorf("short W: %v, want ErrShape", err)
	}
	badW := append([]float32(nil), w...)
	badW[1] = float32(math.NaN())
	if _, _, err := SelectFFN(st, badW, 2); !errors.Is(err, ErrNonFinite) {
		t.Errorf("NaN W: %v, want ErrNonFinite", err)
	}
	for _, kept := range [][]int{nil, {1, 0}, {0, 0}, {0, F}, {-1}} {
		if _, err := RefitDown(st, kept, DefaultDamping); !errors.Is(err, ErrKeep) {
			t.Errorf("RefitDown kept %v: %v, want ErrKeep", kept, err)
		}
		if _, err := SliceColumns(w, D, F, kept); !errors.Is(err, ErrKeep) {
			t.Errorf("SliceColumns kept %v: %v, want ErrKeep", kept, err)
		}
	}
	for _, d := range []float64{-1, math.NaN(), math.Inf(1)} {
		if _, err := RefitDown(st, []int{0, 1}, d); !errors.Is(err, ErrDamping) {
			t.Errorf("damping %v: %v, want ErrDamping", d, err)
		}
	}
	// A singular H (a dead node) needs damping.
	dead, _ := NewFFNStats(F, D)
	xd := append([]float32(nil), x...)
	for t0 := 0; t0 < n; t0++ {
		xd[t0*F+2] = 0
	}
	if err := dead.Add(xd, y, n); err != nil {
		t.Fatal(err)
	}
	if _, err := Scores(dead, w, 0); !errors.Is(err, ErrNotPositiveDefinite) {
		t.Errorf("singular H undamped: %v, want ErrNotPositiveDefinite", err)
	}
	if _, err := Scores(dead, w, DefaultDamping); err != nil {
		t.Errorf("singular H with default damping: %v", err)
	}
	if _, err := RefitDown(dead, []int{2}, DefaultDamping); !errors.Is(err, ErrNoData) {
		t.Errorf("refit on a dead node only: %v, want ErrNoData", err)
	}
}

func TestSliceRowsColumns(t *testing.T) {
	w := []float32{0, 1, 2, 3, 10, 11, 12, 13} // [2, 4]
	c, err := SliceColumns(w, 2, 4, []int{1, 3})
	if err != nil {
		t.Fatal(err)
	}
	if want := []float32{1, 3, 11, 13}; !equal32(c, want) {
		t.Errorf("SliceColumns = %v, want %v", c, want)
	}
	r, err := SliceRows(w, 4, 2, []int{0, 3})
	if err != nil {
		t.Fatal(err)
	}
	if want := []float32{0, 1, 12, 13}; !equal32(r, want) {
		t.Errorf("SliceRows = %v, want %v", r, want)
	}
}

func equal32(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestAttentionUnits(t *testing.T) {
	// Llama-2-7B-like: pAttn = 4·4096², pMLP = 3·4096·11008; ratio 2.015625,
	// exponent 1.34375. s=0.25: 32·e^(1.34375·ln 0.25) = 32·0.15526 = 4.968 → 5.
	// s=0.5: 32·e^(1.34375·ln 0.5) = 32·0.39401 = 12.61 → 13.
	pAttn, pMLP := 4.0*4096*4096, 3.0*4096*11008
	cases := []struct {
		s    float64
		want int
	}{{0, 0}, {0.25, 5}, {0.5, 13}, {1, 32}}
	for _, c := range cases {
		got, err := AttentionUnits(32, c.s, pMLP, pAttn)
		if err != nil || got != c.want {
			t.Errorf("AttentionUnits(32, %v) = %d, %v; want %d", c.s, got, err, c.want)
		}
	}
	for _, bad := range []struct {
		L         int
		s, pm, pa float64
	}{{0, 0.5, 1, 1}, {4, -0.1, 1, 1}, {4, 1.1, 1, 1}, {4, math.NaN(), 1, 1}, {4, 0.5, 0, 1}, {4, 0.5, 1, math.Inf(1)}} {
		if _, err := AttentionUnits(bad.L, bad.s, bad.pm, bad.pa); !errors.Is(err, ErrBudget) {
			t.Errorf("AttentionUnits(%+v): %v, want ErrBudget", bad, err)
		}
	}
}

func TestFFNKeep(t *testing.T) {
	// L=4, F=100, D=10, pAttn=1000, s=0.5, nAttn=2:
	// total = 0.5·4·(1000+3000) = 8000; per FFN (8000−2000)/4 = 1500 = 50 nodes of 30.
	if got, err := FFNKeep(4, 100, 10, 0.5, 2, 1000); err != nil || got != 50 {
		t.Errorf("FFNKeep = %d, %v; want 50", got, err)
	}
	// Attention alone exceeds the budget (0.1·4·4000 = 1600 < 4·1000): keep all.
	if got, err := FFNKeep(4, 100, 10, 0.1, 4, 1000); err != nil || got != 100 {
		t.Errorf("FFNKeep over-budget attention = %d, %v; want 100", got, err)
	}
	// Llama-2-7B-like at s=0.25: removed parameters match the budget within
	// half a node per layer.
	L, F, D := 32, 11008, 4096
	pAttn, pMLP := 4.0*4096*4096, 3.0*float64(D*F)
	for _, s := range []float64{0.25, 0.375, 0.5} {
		nAttn, err := AttentionUnits(L, s, pMLP, pAttn)
		if err != nil {
			t.Fatal(err)
		}
		keep, err := FFNKeep(L, F, D, s, nAttn, pAttn)
		if err != nil {
			t.Fatal(err)
		}
		removed := float64(nAttn)*pAttn + float64(L*(F-keep)*3*D)
		target := s * float64(L) * (pAttn + pMLP)
		t.Logf("s=%v: n_attn=%d, FFN keep %d/%d, removed %.4g of target %.4g params", s, nAttn, keep, F, removed, target)
		if math.Abs(removed-target) > float64(L)*1.5*float64(D) {
			t.Errorf("s=%v: removed %v, target %v", s, removed, target)
		}
	}
	if _, err := FFNKeep(4, 100, 10, 0.5, 5, 1000); !errors.Is(err, ErrBudget) {
		t.Errorf("nAttn > L: %v, want ErrBudget", err)
	}
}

func benchAdd(b *testing.B, F, D, n int) {
	rng := rand.New(rand.NewPCG(11, 12))
	x := randMat(rng, n, F, 1)
	y := randMat(rng, n, D, 1)
	st, err := NewFFNStats(F, D)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(4 * n * (F + D)))
	b.ResetTimer()
	for b.Loop() {
		if err := st.Add(x, y, n); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
}

// BenchmarkAdd_F11008_D4096_n512 is Llama-2-7B's down_proj; the statistics
// take 8·(F²+F·D) ≈ 1.3 GB. Run with -benchtime=1x: one Add is ~10^11 flops.
func BenchmarkAdd_F11008_D4096_n512(b *testing.B) { benchAdd(b, 11008, 4096, 512) }

func BenchmarkAdd_F2048_D512_n512(b *testing.B) { benchAdd(b, 2048, 512, 512) }
