package depth

import (
	"encoding/json"
	"errors"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// blockS builds an L×L similarity matrix from contiguous blocks: within a
// block S_ij = base + e_i + e_j, across blocks S_ij = across, diagonal 1.
// With this form the LoRP redundancy is r(l) = base + e_l + (E_B − e_l)/(|B|−1)
// and a cluster's mean pairwise similarity is base + 2·mean(e) over its
// remaining members, so selections can be derived by hand.
func blockS(sizes []int, base, across float64, e []float64) ([]float64, int) {
	L := 0
	var block []int
	for b, s := range sizes {
		for range s {
			block = append(block, b)
		}
		L += s
	}
	S := make([]float64, L*L)
	for i := 0; i < L; i++ {
		for j := 0; j < L; j++ {
			switch {
			case i == j:
				S[i*L+j] = 1
			case block[i] == block[j]:
				S[i*L+j] = base + e[i] + e[j]
			default:
				S[i*L+j] = across
			}
		}
	}
	return S, L
}

// Three blocks {0..3} {4..7} {8..11}; within 0.9 + e_i + e_j, across 0.4.
var threeE = []float64{
	0.00, 0.03, 0.01, 0.02, // block 0: ranking (0 protected) 1, 3, 2
	0.015, 0.00, 0.04, 0.02, // block 1: ranking 6, 7, 4, 5
	0.02, 0.03, 0.00, 0.04, // block 2: ranking (11 protected) 9, 8, 10
}

func TestLoRPThreeBlocks(t *testing.T) {
	S, L := blockS([]int{4, 4, 4}, 0.9, 0.4, threeE)
	// Hand sum over i<j: 18 within-block pairs give 18·0.9 + 3·Σe
	// (each e_i sits in 3 pairs), Σe = 0.06 + 0.075 + 0.09 = 0.225;
	// 48 cross pairs give 48·0.4. Mean = (16.2 + 0.675 + 19.2)/66.
	wantRLS := -math.Log2(36.075 / 66)
	// Stage 1: 1, 6, 9. Remaining means (0.9 + 2·mean e): B0 {0,2,3} 0.92,
	// B1 {4,5,7} 0.92333, B2 {8,10,11} 0.94 → 8; B2 {10,11} 0.94 → 10
	// (B2 exhausted); B1 0.92333 > B0 0.92 → 7; B1 {4,5} 0.915 < B0 0.92 → 3;
	// B1 {4,5} 0.915 > B0 {0,2} 0.91 → 4; B1 {5} alone scores −∞ → B0 → 2;
	// only 5 is left.
	order := []int{1, 6, 9, 8, 10, 7, 3, 4, 2, 5}
	for n := 0; n <= L-2; n++ {
		p, err := LoRP(S, L, n)
		if err != nil {
			t.Fatalf("n=%d: %v", n, err)
		}
		if math.Abs(p.RLS-wantRLS) > 1e-12 {
			t.Fatalf("RLS = %.15g, want %.15g", p.RLS, wantRLS)
		}
		if p.K != 3 {
			t.Fatalf("K = %d, want 3 (RLS %.4f)", p.K, p.RLS)
		}
		if want := []int{0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2}; !slices.Equal(p.Labels, want) {
			t.Fatalf("labels %v, want the three blocks %v", p.Labels, want)
		}
		want := slices.Clone(order[:n])
		slices.Sort(want)
		if !slices.Equal(p.Removed, want) {
			t.Errorf("n=%d: removed %v, want %v", n, p.Removed, want)
		}
		// r(l) = 0.9 + e_l + (E_B − e_l)/3.
		for l := 0; l < L; l++ {
			b := l / 4
			var eb float64
			for m := 4 * b; m < 4*b+4; m++ {
				eb += threeE[m]
			}
			if w := 0.9 + threeE[l] + (eb-threeE[l])/3; math.Abs(p.Redundancy[l]-w) > 1e-12 {
				t.Errorf("r(%d) = %.15g, want %.15g", l, p.Redundancy[l], w)
			}
		}
	}
}

func TestLoRPTwoAndFourClusters(t *testing.T) {
	t.Run("K=2", func(t *testing.T) {
		e := []float64{0.01, 0.00, 0.05, 0.02, 0.03, 0.00, 0.04, 0.01, 0.02, 0.03}
		S, L := blockS([]int{5, 5}, 0.9, 0.1, e)
		// Σe: block 0 0.11, block 1 0.10; 20 within pairs (each e in 4),
		// 25 cross pairs.
		wantRLS := -math.Log2((20*0.9 + 4*0.21 + 25*0.1) / 45)
		p, err := LoRP(S, L, 2)
		if err != nil {
			t.Fatal(err)
		}
		if math.Abs(p.RLS-wantRLS) > 1e-12 || p.K != 2 {
			t.Fatalf("RLS %.15g K %d, want %.15g and 2", p.RLS, p.K, wantRLS)
		}
		// Stage 1: argmax e in each block: 2 (0.05) and 6 (0.04).
		if !slices.Equal(p.Removed, []int{2, 6}) {
			t.Errorf("removed %v, want [2 6]", p.Removed)
		}
	})
	t.Run("K=4", func(t *testing.T) {
		e := make([]float64, 16)
		top := []int{2, 5, 9, 13} // most redundant eligible layer per block
		for _, l := range top {
			e[l] = 0.03
		}
		S, L := blockS([]int{4, 4, 4, 4}, 0.9, 0.55, e)
		// 24 within pairs (each e in 3, Σe = 0.12), 96 cross pairs.
		wantRLS := -math.Log2((24*0.9 + 3*0.12 + 96*0.55) / 120)
		p, err := LoRP(S, L, 4)
		if err != nil {
			t.Fatal(err)
		}
		if math.Abs(p.RLS-wantRLS) > 1e-12 || p.K != 4 {
			t.Fatalf("RLS %.15g K %d, want %.15g and 4", p.RLS, p.K, wantRLS)
		}
		if !slices.Equal(p.Removed, top) {
			t.Errorf("removed %v, want %v", p.Removed, top)
		}
	})
}

func TestClustersForRLSThresholds(t *testing.T) {
	for _, c := range []struct {
		rls float64
		k   int
	}{
		{1.0, 2}, {math.Nextafter(1.0, 0), 3}, {0.7, 3}, {math.Nextafter(0.7, 0), 4},
		{3, 2}, {0, 4}, {-0.5, 4},
	} {
		if got := ClustersForRLS(c.rls); got != c.k {
			t.Errorf("ClustersForRLS(%v) = %d, want %d", c.rls, got, c.k)
		}
	}
	// Uniform off-diagonal c gives RLS = −log2(c); 0.5 is exactly 1.0.
	for _, c := range []struct {
		off float64
		k   int
	}{
		{0.5, 2}, {0.5000001, 3}, {0.61, 3}, {0.62, 4}, {0.3, 2}, {0.9, 4},
	} {
		const L = 8
		S := make([]float64, L*L)
		for i := range S {
			S[i] = c.off
		}
		for i := 0; i < L; i++ {
			S[i*L+i] = 1
		}
		p, err := LoRP(S, L, 3)
		if err != nil {
			t.Fatalf("off %v: %v", c.off, err)
		}
		if want := -math.Log2(c.off); math.Abs(p.RLS-want) > 1e-12 || p.K != c.k {
			t.Errorf("off %v: RLS %.15g K %d, want %.15g and %d", c.off, p.RLS, p.K, want, c.k)
		}
		if len(p.Removed) != 3 || slices.Contains(p.Removed, 0) || slices.Contains(p.Removed, L-1) {
			t.Errorf("off %v: removed %v: want 3 layers, none of 0 and %d", c.off, p.Removed, L-1)
		}
	}
}

// randomS returns the similarity matrix of random hidden states whose
// direction drifts slowly with depth.
func randomS(t testing.TB, L, d, tokens int, seed uint64) []float64 {
	rng := rand.New(rand.NewPCG(seed, 1))
	acc, err := NewSimilarity(L, d)
	if err != nil {
		t.Fatal(err)
	}
	h := make([][]float32, L)
	for i := range h {
		h[i] = make([]float32, d)
	}
	for range tokens {
		for k := 0; k < d; k++ {
			h[0][k] = float32(rng.NormFloat64())
		}
		for i := 1; i < L; i++ {
			for k := 0; k < d; k++ {
				h[i][k] = h[i-1][k] + float32(0.4*rng.NormFloat64())
			}
		}
		if err := acc.Add(h); err != nil {
			t.Fatal(err)
		}
	}
	S, err := acc.Matrix()
	if err != nil {
		t.Fatal(err)
	}
	return S
}

func TestLoRPProtectsEndsAndIsDeterministic(t *testing.T) {
	for seed := uint64(1); seed <= 5; seed++ {
		const L = 14
		S := randomS(t, L, 24, 40, seed)
		for n := 0; n <= L-2; n++ {
			p, err := LoRP(S, L, n)
			if err != nil {
				t.Fatal(err)
			}
			if len(p.Removed) != n || slices.Contains(p.Removed, 0) || slices.Contains(p.Removed, L-1) {
				t.Fatalf("seed %d n %d: removed %v", seed, n, p.Removed)
			}
			if !slices.IsSorted(p.Removed) || len(slices.Compact(slices.Clone(p.Removed))) != n {
				t.Fatalf("seed %d n %d: removed %v not sorted and distinct", seed, n, p.Removed)
			}
			q, err := LoRP(slices.Clone(S), L, n)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(p, q) {
				t.Fatalf("seed %d n %d: two runs differ:\n%+v\n%+v", seed, n, p, q)
			}
			if p.Labels[0] != 0 {
				t.Fatalf("layer 0 has label %d", p.Labels[0])
			}
			for l, c := range p.Labels {
				if c > 0 && !slices.Contains(p.Labels[:l], c-1) {
					t.Fatalf("labels %v not numbered by first appearance", p.Labels)
				}
			}
		}
	}
}

func TestShortGPT(t *testing.T) {
	const L = 6
	S := make([]float64, L*L)
	for i := range S {
		S[i] = 0.2
	}
	adj := []float64{0.99, 0.9, 0.7, 0.95, 0.6} // S_{i,i+1}
	for i := 0; i < L; i++ {
		S[i*L+i] = 1
	}
	for i, v := range adj {
		S[i*L+i+1], S[(i+1)*L+i] = v, v
	}
	// BI = 0.01, 0.1, 0.3, 0.05, 0.4; layer 0 has the lowest but is
	// protected; eligible 1..4 ordered 3, 1, 2, 4.
	for n, want := range [][]int{{}, {3}, {1, 3}, {1, 2, 3}, {1, 2, 3, 4}} {
		p, err := ShortGPT(S, L, n)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(p.Removed, want) {
			t.Errorf("n=%d: removed %v, want %v", n, p.Removed, want)
		}
		for i, v := range adj {
			if math.Abs(p.BlockInfluence[i]-(1-v)) > 1e-15 {
				t.Errorf("BI[%d] = %v, want %v", i, p.BlockInfluence[i], 1-v)
			}
		}
		if len(p.BlockInfluence) != L-1 {
			t.Errorf("len(BI) = %d, want %d", len(p.BlockInfluence), L-1)
		}
	}
	// With the final-norm input as state L, the last block gets a score.
	S7 := make([]float64, (L+1)*(L+1))
	for i := 0; i <= L; i++ {
		for j := 0; j <= L; j++ {
			if i < L && j < L {
				S7[i*(L+1)+j] = S[i*L+j]
			} else if i == j {
				S7[i*(L+1)+j] = 1
			} else {
				S7[i*(L+1)+j] = 0.2
			}
		}
	}
	S7[(L-1)*(L+1)+L], S7[L*(L+1)+L-1] = 0.999, 0.999
	p, err := ShortGPT(S7, L, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.BlockInfluence) != L || math.Abs(p.BlockInfluence[L-1]-0.001) > 1e-15 {
		t.Errorf("BI = %v, want %d entries ending in 0.001", p.BlockInfluence, L)
	}
	if !slices.Equal(p.Removed, []int{3}) {
		t.Errorf("removed %v, want [3] (last block protected)", p.Removed)
	}
}

func TestSimilarityMatchesDirect(tt *testing.T) {
	const L, d, T = 5, 33, 21
	rng := rand.New(rand.NewPCG(7, 7))
	tok := make([][][]float32, T) // [T][L][d]
	for t := range tok {
		tok[t] = make([][]float32, L)
		for i := range tok[t] {
			tok[t][i] = make([]float32, d)
			if t == 3 && i == 2 {
				continue // a zero vector: cosine 0 with everything
			}
			for k := range tok[t][i] {
				tok[t][i][k] = float32(rng.NormFloat64() + 0.3*float64(i))
			}
		}
	}
	// Direct float64 reference.
	want := make([]float64, L*L)
	for i := 0; i < L; i++ {
		for j := 0; j < L; j++ {
			if i == j {
				want[i*L+j] = 1
				continue
			}
			var s float64
			for t := 0; t < T; t++ {
				var dot, ni, nj float64
				for k := 0; k < d; k++ {
					a, b := float64(tok[t][i][k]), float64(tok[t][j][k])
					dot += a * b
					ni += a * a
					nj += b * b
				}
				if ni > 0 && nj > 0 {
					s += dot / math.Sqrt(ni*nj)
				}
			}
			want[i*L+j] = s / T
		}
	}
	// Tokens 0..9 one at a time into a, 10..20 as one batch into b, merged.
	a, _ := NewSimilarity(L, d)
	b, _ := NewSimilarity(L, d)
	for t := 0; t < 10; t++ {
		if err := a.Add(tok[t]); err != nil {
			tt.Fatal(err)
		}
	}
	batch := make([][]float32, L)
	for i := range batch {
		for t := 10; t < T; t++ {
			batch[i] = append(batch[i], tok[t][i]...)
		}
	}
	if err := b.AddBatch(batch, T-10); err != nil {
		tt.Fatal(err)
	}
	if err := a.Merge(b); err != nil {
		tt.Fatal(err)
	}
	if a.Tokens() != T {
		tt.Fatalf("tokens %d, want %d", a.Tokens(), T)
	}
	got, err := a.Matrix()
	if err != nil {
		tt.Fatal(err)
	}
	for i := range want {
		if math.Abs(got[i]-want[i]) > 1e-12 {
			tt.Fatalf("S[%d][%d] = %.15g, want %.15g", i/L, i%L, got[i], want[i])
		}
	}
}

func TestSimilarityErrors(t *testing.T) {
	if _, err := NewSimilarity(0, 4); !errors.Is(err, ErrShape) {
		t.Errorf("NewSimilarity(0,4): %v, want ErrShape", err)
	}
	a, _ := NewSimilarity(2, 3)
	if _, err := a.Matrix(); !errors.Is(err, ErrNoTokens) {
		t.Errorf("empty Matrix: %v, want ErrNoTokens", err)
	}
	if err := a.Add([][]float32{{1, 2, 3}}); !errors.Is(err, ErrShape) {
		t.Errorf("one state: %v, want ErrShape", err)
	}
	if err := a.Add([][]float32{{1, 2, 3}, {1, 2}}); !errors.Is(err, ErrShape) {
		t.Errorf("short state: %v, want ErrShape", err)
	}
	if err := a.Add([][]float32{{1, 2, 3}, {1, float32(math.NaN()), 3}}); !errors.Is(err, ErrNonFinite) {
		t.Errorf("NaN: %v, want ErrNonFinite", err)
	}
	if a.Tokens() != 0 {
		t.Errorf("failed Adds counted %d tokens", a.Tokens())
	}
	b, _ := NewSimilarity(3, 3)
	if err := a.Merge(b); !errors.Is(err, ErrShape) {
		t.Errorf("merge 3 into 2: %v, want ErrShape", err)
	}
}

func TestPlanErrors(t *testing.T) {
	S, L := blockS([]int{4, 4, 4}, 0.9, 0.4, threeE)
	for _, n := range []int{L - 1, L, -1} {
		if _, err := LoRP(S, L, n); !errors.Is(err, ErrTooManyLayers) {
			t.Errorf("LoRP n=%d: %v, want ErrTooManyLayers", n, err)
		}
		if _, err := ShortGPT(S, L, n); !errors.Is(err, ErrTooManyLayers) {
			t.Errorf("ShortGPT n=%d: %v, want ErrTooManyLayers", n, err)
		}
	}
	if _, err := LoRP(S[:L*L-1], L, 2); !errors.Is(err, ErrShape) {
		t.Errorf("short S: %v, want ErrShape", err)
	}
	if _, err := LoRP(S, L+1, 2); !errors.Is(err, ErrShape) {
		t.Errorf("L+1: %v, want ErrShape", err)
	}
	bad := slices.Clone(S)
	bad[5] = math.NaN()
	if _, err := LoRP(bad, L, 2); !errors.Is(err, ErrNonFinite) {
		t.Errorf("NaN: %v, want ErrNonFinite", err)
	}
	if _, err := ShortGPT(bad, L, 2); !errors.Is(err, ErrNonFinite) {
		t.Errorf("ShortGPT NaN: %v, want ErrNonFinite", err)
	}
	bad = slices.Clone(S)
	bad[1*L+2] = 0.1 // S[2][1] stays 0.94
	if _, err := LoRP(bad, L, 2); !errors.Is(err, ErrNotSimilarity) {
		t.Errorf("asymmetric: %v, want ErrNotSimilarity", err)
	}
	neg := make([]float64, 9)
	for i := range neg {
		neg[i] = -0.2
	}
	neg[0], neg[4], neg[8] = 1, 1, 1
	if _, err := LoRP(neg, 3, 1); !errors.Is(err, ErrUndefinedRLS) {
		t.Errorf("negative mean: %v, want ErrUndefinedRLS", err)
	}

	if _, err := ListPlan([]int{0, 3}, 6); !errors.Is(err, ErrProtectedLayer) {
		t.Errorf("list with 0: %v, want ErrProtectedLayer", err)
	}
	if _, err := ListPlan([]int{5}, 6); !errors.Is(err, ErrProtectedLayer) {
		t.Errorf("list with L-1: %v, want ErrProtectedLayer", err)
	}
	if _, err := ListPlan([]int{2, 2}, 6); !errors.Is(err, ErrLayerRange) {
		t.Errorf("duplicate: %v, want ErrLayerRange", err)
	}
	if _, err := ListPlan([]int{7}, 6); !errors.Is(err, ErrLayerRange) {
		t.Errorf("out of range: %v, want ErrLayerRange", err)
	}
	if _, err := ListPlan([]int{1, 2, 3, 4, 5}, 6); !errors.Is(err, ErrTooManyLayers) {
		t.Errorf("too many: %v, want ErrTooManyLayers", err)
	}
	p, err := ListPlan([]int{4, 1, 3}, 6)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(p.Removed, []int{1, 3, 4}) || !slices.Equal(p.Kept(), []int{0, 2, 5}) || p.Method != MethodList {
		t.Errorf("list plan %+v kept %v", p, p.Kept())
	}
}

func TestPlanJSONRoundTrip(t *testing.T) {
	S, L := blockS([]int{4, 4, 4}, 0.9, 0.4, threeE)
	lorp, err := LoRP(S, L, 5)
	if err != nil {
		t.Fatal(err)
	}
	sg, err := ShortGPT(S, L, 3)
	if err != nil {
		t.Fatal(err)
	}
	list, err := ListPlan([]int{2, 7}, L)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []*Plan{lorp, sg, list} {
		b, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		var q Plan
		if err := json.Unmarshal(b, &q); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(*p, q) {
			t.Errorf("%s: round trip changed the plan:\n%+v\n%+v\n%s", p.Method, *p, q, b)
		}
	}
}

func BenchmarkSimilarityAdd(b *testing.B) {
	const L, d, n = 36, 4096, 8
	rng := rand.New(rand.NewPCG(3, 3))
	h := make([][]float32, L)
	for i := range h {
		h[i] = make([]float32, n*d)
		for k := range h[i] {
			h[i][k] = float32(rng.NormFloat64())
		}
	}
	acc, _ := NewSimilarity(L, d)
	b.SetBytes(int64(L * n * d * 4))
	b.ResetTimer()
	for b.Loop() {
		if err := acc.AddBatch(h, n); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "tokens/s")
}

// TestLoRPDegenerateFallsBackToBlockInfluence: with 4 layers and a high
// mean similarity, RLS gives K = 4 = L singleton clusters, so every
// redundancy is −1 and LoRP's own allocation would remove layer 1 by index
// alone. The plan must instead remove the eligible layer of lowest block
// influence (layer 2: BI_2 = 1 − S_23 = 0.05 < BI_1 = 1 − S_12 = 0.3) and
// say so.
func TestLoRPDegenerateFallsBackToBlockInfluence(t *testing.T) {
	const L = 4
	up := map[[2]int]float64{{0, 1}: 0.9, {0, 2}: 0.8, {0, 3}: 0.65, {1, 2}: 0.7, {1, 3}: 0.7, {2, 3}: 0.95}
	S := make([]float64, L*L)
	for i := 0; i < L; i++ {
		S[i*L+i] = 1
	}
	for ij, v := range up {
		S[ij[0]*L+ij[1]], S[ij[1]*L+ij[0]] = v, v
	}
	p, err := LoRP(S, L, 1)
	if err != nil {
		t.Fatal(err)
	}
	// mean_{i<j} S = 4.7/6, RLS = −log2(0.7833) = 0.352 < 0.7 → K = 4.
	if want := -math.Log2(4.7 / 6); math.Abs(p.RLS-want) > 1e-12 || p.K != L {
		t.Fatalf("RLS %.15g K %d, want %.15g and %d", p.RLS, p.K, want, L)
	}
	if !slices.Equal(p.Labels, []int{0, 1, 2, 3}) {
		t.Fatalf("labels %v, want four singletons", p.Labels)
	}
	if !slices.Equal(p.Removed, []int{2}) {
		t.Errorf("removed %v, want [2] (lowest block influence)", p.Removed)
	}
	if p.Fallback != FallbackBlockInfluence || !strings.Contains(p.FallbackReason, "K = 4 clusters for 4 layers") || !strings.Contains(p.FallbackReason, "would have removed [1]") {
		t.Errorf("fallback %q reason %q", p.Fallback, p.FallbackReason)
	}
	if want := []float64{0.1, 0.3, 0.05}; len(p.BlockInfluence) != 3 || math.Abs(p.BlockInfluence[1]-want[1]) > 1e-12 || math.Abs(p.BlockInfluence[2]-want[2]) > 1e-12 {
		t.Errorf("block influence %v, want %v", p.BlockInfluence, want)
	}
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"fallback":"block_influence"`) || !strings.Contains(string(b), `"fallback_reason":"degenerate LoRP clustering`) {
		t.Errorf("JSON %s lacks the fallback", b)
	}
	// A clustering with peers for every removed layer keeps LoRP's choice.
	S3, L3 := blockS([]int{4, 4, 4}, 0.9, 0.4, threeE)
	q, err := LoRP(S3, L3, 3)
	if err != nil {
		t.Fatal(err)
	}
	if q.Fallback != "" || q.FallbackReason != "" || q.BlockInfluence != nil {
		t.Errorf("three blocks: fallback %q %q %v, want none", q.Fallback, q.FallbackReason, q.BlockInfluence)
	}
}
