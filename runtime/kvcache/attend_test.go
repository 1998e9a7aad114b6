package kvcache

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/runtime"
	"github.com/lmpack/lmpack/runtime/kernels"
)

// attendLayerSets are the shapes of the attention parity test: GQA-like
// head counts (odd ones included), head_dims 64/32/8 and the odd 12 and 6
// (12: the 2-bit code kernels with 3 bytes per row; 6: 2-bit rows that
// split a byte, served by the block path).
var attendLayerSets = [][]Layer{
	{{NumKVHeads: 3, HeadDim: 64}, {NumKVHeads: 1, HeadDim: 32}},
	{{NumKVHeads: 2, HeadDim: 8}, {NumKVHeads: 1, HeadDim: 12}, {NumKVHeads: 3, HeadDim: 6}},
}

// writeTokens writes n tokens at position pos to every layer of c, for
// each layer and KV row a key of N(0, 1) elements then a value of
// N(0, 0.25) (randRow, from rng), and commits them.
func writeTokens(c runtime.KVCache, layers []Layer, rng *rand.Rand, pos, n int) {
	for li, l := range layers {
		d := l.NumKVHeads * l.HeadDim
		k, v := make([]float32, n*d), make([]float32, n*d)
		for r := 0; r < n*l.NumKVHeads; r++ {
			copy(k[r*l.HeadDim:], randRow(rng, l.HeadDim, 1))
			copy(v[r*l.HeadDim:], randRow(rng, l.HeadDim, 0.5))
		}
		c.Write(li, pos, n, k, v)
	}
	c.Commit(n)
}

// attendCaches returns the caches of every method that takes layers:
// from New and from a Pool with 32-token pages (so that runs cross
// pages), with sink 5 and recent 7 (odd windows), random rotations with
// clipping for oscar2/oscar4.
func attendCaches(t *testing.T, layers []Layer, capacity int) map[string]runtime.KVCache {
	t.Helper()
	out := map[string]runtime.KVCache{}
	for _, m := range Methods() {
		if m == "fp32" {
			continue
		}
		opt := Options{Sink: 5, Recent: 7, Rotations: randRotations(rand.New(rand.NewPCG(3, 4)), layers, 0.9, 0.85)}
		c, err := New(m, layers, capacity, opt)
		if errors.Is(err, ErrBadShape) {
			continue // a head_dim the kind refuses
		}
		if err != nil {
			t.Fatal(err)
		}
		out[m] = c
		p, err := NewPool(m, layers, opt, 1<<30, 32)
		if err != nil {
			t.Fatal(err)
		}
		pc, err := p.NewCache(capacity)
		if err != nil {
			t.Fatal(err)
		}
		out[m+"/pool"] = pc
	}
	return out
}

// TestAttendMatchesRead checks KVAttender's Scores and AccumV of every
// kind against the float64 products of Read's keys and values over
// random query rows (1, 3 and 7 rows) and position ranges, after writes
// of odd sizes (prefill 37, then 1, 50, 1, 68 tokens) that move tokens
// through the sink, the quantized stores and the fp16 window. Bound
// (float32 sums in another order, the rotation applied to q instead of
// every key): for every score
//
//	|s − s_ref| ≤ 2e-6·(‖q‖·‖k‖ + Σ_c |q_c·k_c|)
//
// and for every output element |o − o_ref| ≤ 2e-6·Σ_j |p_j|·(‖v_j‖ +
// ‖v_j‖∞) + 2⁻²³·|o| (the last term: rounding the sum onto out). The
// largest errors seen are logged (below 5e-7 of those scales).
// TurboQuant's quantized layers have no raw form: AttendsKV is false
// there, and true on every other layer of every kind.
func TestAttendMatchesRead(t *testing.T) {
	const tol = 2e-6
	defer func(v bool) { codeQ8 = v }(codeQ8)
	codeQ8 = false // float kernels only; TestAttendCodePaths checks the int8-query scores
	for si, layers := range attendLayerSets {
		caches := attendCaches(t, layers, 200)
		for name, c := range caches {
			t.Run(fmt.Sprintf("set%d/%s", si, name), func(t *testing.T) {
				ka, ok := c.(runtime.KVAttender)
				if !ok {
					t.Fatalf("%s does not implement runtime.KVAttender", name)
				}
				rng := rand.New(rand.NewPCG(uint64(si), 9))
				pos := 0
				for _, n := range []int{37, 1, 50, 1, 68} {
					writeTokens(c, layers, rng, pos, n)
					pos += n
					for li, l := range layers {
						turbo := strings.HasPrefix(name, "turboquant")
						want := !turbo || (!strings.Contains(name, "-all") && turboBoundary(li, len(layers)))
						if got := ka.AttendsKV(li); got != want {
							t.Fatalf("layer %d: AttendsKV %v, want %v", li, got, want)
						}
						if !want {
							continue
						}
						for _, nq := range []int{1, 3, 4, 7} {
							checkAttend(t, c, ka, li, l, pos, nq, rng, tol)
						}
					}
				}
				t.Logf("worst score error %.3g, output error %.3g (relative to the bounds' scales)", worstS, worstV)
				worstS, worstV = 0, 0
			})
		}
	}
}

// worstS and worstV are the largest error ratios seen (logged); worstQ8
// the largest score error over the int8-query bound when codeQ8 is on,
// worstQ8V the largest value error over the int8-weight bound.
var worstS, worstV, worstQ8, worstQ8V float64

func checkAttend(t *testing.T, c runtime.KVCache, ka runtime.KVAttender, li int, l Layer, n, nq int, rng *rand.Rand, tol float64) {
	t.Helper()
	hd := l.HeadDim
	scratch := make([]float32, ka.AttendScratch(li, nq))
	kr, vr := make([]float32, n*hd), make([]float32, n*hd)
	ranges := [][2]int{{0, n}, {3, n - 2}, {4, 6}, {n - 1, n}, {n / 2, n / 2}}
	vmag := make([]float64, n) // ‖v_j‖ + ‖v_j‖∞
	for h := 0; h < l.NumKVHeads; h++ {
		c.Read(li, h, n, kr, vr)
		valueMags(vmag, vr, hd)
		for _, r := range ranges {
			p0, p1 := r[0], r[1]
			w := p1 - p0
			ldq, lds := hd+3, w+5
			q := make([]float32, nq*ldq)
			for i := range q {
				q[i] = float32(rng.NormFloat64())
			}
			s := make([]float32, nq*lds)
			for i := range s {
				s[i] = float32(math.NaN()) // must be overwritten in range, kept outside
			}
			ka.Scores(li, h, p0, p1, nq, q, ldq, s, lds, scratch)
			for i := 0; i < nq; i++ {
				qi := q[i*ldq : i*ldq+hd]
				for j := p0; j < p1; j++ {
					kj := kr[j*hd : (j+1)*hd]
					var ref, abs, nq2, nk2 float64
					for c := range qi {
						ref += float64(qi[c]) * float64(kj[c])
						abs += math.Abs(float64(qi[c]) * float64(kj[c]))
						nq2 += float64(qi[c]) * float64(qi[c])
						nk2 += float64(kj[c]) * float64(kj[c])
					}
					got := float64(s[i*lds+j-p0])
					worstS = max(worstS, math.Abs(got-ref)/(math.Sqrt(nq2*nk2)+abs))
					bound := tol * (math.Sqrt(nq2*nk2) + abs)
					if codeQ8 {
						// codeScoresQ8's rounding of the side-space query x
						// (‖x‖ = ‖q‖ under the kinds' orthogonal rotations):
						// ≤ (max|x|/254)·‖x̂_j‖₁ ≤ ‖q‖·√hd·‖k_j‖/254.
						q8 := math.Sqrt(nq2*nk2*float64(hd)) / 254
						worstQ8 = max(worstQ8, math.Abs(got-ref)/q8)
						bound += q8
					}
					if !(math.Abs(got-ref) <= bound) {
						t.Fatalf("layer %d head %d [%d,%d) nq %d: score[%d][%d] = %g, Read gives %g (bound %.3g)", li, h, p0, p1, nq, i, j, got, ref, bound)
					}
				}
				for j := w; j < lds; j++ {
					if !math.IsNaN(float64(s[i*lds+j])) {
						t.Fatalf("layer %d head %d: Scores wrote column %d past the range of %d", li, h, j, w)
					}
				}
			}
			// AccumV onto a non-zero output: it adds.
			ldp, ldo := w+2, hd+1
			p := make([]float32, nq*ldp)
			for i := range p {
				p[i] = float32(rng.Float64())
			}
			out := make([]float32, nq*ldo)
			for i := range out {
				out[i] = float32(rng.NormFloat64())
			}
			base := append([]float32(nil), out...)
			ka.AccumV(li, h, p0, p1, nq, p, ldp, out, ldo, scratch)
			rw := false
			if cc, ok := c.(*cache); ok {
				rw = cc.roundsWeights(li, nq)
			}
			for i := 0; i < nq; i++ {
				// With int8-rounded weights (kernels.CodeAccumQ8), each
				// p_j·s_j moves by at most 1/254 of its block's largest
				// (16 rows from a start the test does not know: the 31
				// rows around j); in value terms ≤ κ·max_i |p_i|·‖v̂_i‖/254
				// per row, κ = 4 allowing for the ratio of the rows' scales
				// within a block (these rows are drawn alike).
				var q8v float64
				if rw {
					q8v = q8WeightBound(p[i*ldp:i*ldp+w], vmag[p0:p1])
				}
				for ch := 0; ch < hd; ch++ {
					ref, mag := float64(base[i*ldo+ch]), 0.0
					for j := p0; j < p1; j++ {
						pj := float64(p[i*ldp+j-p0])
						ref += pj * float64(vr[j*hd+ch])
						mag += math.Abs(pj) * vmag[j]
					}
					got := float64(out[i*ldo+ch])
					ulp := 0x1p-23 * math.Abs(got) // the rounding of the sum onto out
					if mag > 0 && !rw {
						worstV = max(worstV, (math.Abs(got-ref)-ulp)/mag)
					}
					if rw && q8v > 0 {
						worstQ8V = max(worstQ8V, math.Abs(got-ref)/q8v)
					}
					if bound := tol*mag + ulp + q8v; !(math.Abs(got-ref) <= bound) {
						t.Fatalf("layer %d head %d [%d,%d) nq %d: out[%d][%d] = %g, Read gives %g (bound %.3g)", li, h, p0, p1, nq, i, ch, got, ref, bound)
					}
				}
				if got := out[i*ldo+hd]; got != base[i*ldo+hd] {
					t.Fatalf("layer %d head %d: AccumV changed element %d past head_dim", li, h, hd)
				}
			}
		}
	}
}

// TestAttendCodePaths checks the two code paths of the per-row and
// per-channel code kinds against Read's float64 products, with the bound
// of TestAttendMatchesRead (the row kernels sum the same exact products
// in float32, in another order): the row kernels (kernels.CodeDots,
// CodeAxpy; forced for every row count, so GQA groups of 8 and 16 rows
// too) and the block path (codes expanded to float32, forced off the row
// kernels), for 1, 7, 8 and 16 query rows, after writes of odd sizes
// (token counts not a multiple of the 64-token block or of the 32-token
// pages of the Pool caches).
func TestAttendCodePaths(t *testing.T) {
	const tol = 2e-6
	layers := []Layer{{NumKVHeads: 2, HeadDim: 64}, {NumKVHeads: 1, HeadDim: 96}}
	kinds := map[string]bool{"int8": true, "int4": true, "int2-naive": true, "quarot2": true, "oscar2": true, "oscar4": true, "kivi2": true, "q8_0": true, "q4_0": true}
	for _, path := range []string{"rows", "rows-q8", "block"} {
		func() {
			defer func(a, b int, q bool) { codeRowsMaxNQ, codeRowsMaxNQ2, codeQ8 = a, b, q }(codeRowsMaxNQ, codeRowsMaxNQ2, codeQ8)
			codeRowsMaxNQ, codeRowsMaxNQ2, codeQ8 = 0, 0, path == "rows-q8"
			if path != "block" {
				codeRowsMaxNQ, codeRowsMaxNQ2 = 1<<30, 1<<30
			}
			for name, c := range attendCaches(t, layers, 300) {
				if !kinds[strings.TrimSuffix(name, "/pool")] {
					continue
				}
				t.Run(path+"/"+name, func(t *testing.T) {
					ka := c.(runtime.KVAttender)
					rng := rand.New(rand.NewPCG(7, 9))
					pos := 0
					for _, n := range []int{131, 1, 70} {
						writeTokens(c, layers, rng, pos, n)
						pos += n
						for li, l := range layers {
							for _, nq := range []int{1, 4, 7, 8, 16} {
								checkAttend(t, c, ka, li, l, pos, nq, rng, tol)
							}
						}
					}
				})
			}
		}()
	}
	t.Logf("worst score error %.3g, output error %.3g (relative to the bounds' scales); int8-query scores: worst error %.3g of their bound; int8-weight values: %.3g", worstS, worstV, worstQ8, worstQ8V)
	if kernels.CodeAccumQ8Fast(64, 2, 16) && !(worstQ8V > 1e-3) {
		t.Errorf("int8-weight values: worst error %.3g of the bound: the path did not run, or the bound is vacuous", worstQ8V)
	}
	if kernels.CodeQ8Fast(64, 4) && !(worstQ8 > 1e-3) {
		t.Errorf("int8-query scores: worst error %.3g of the bound: the q8 path did not run, or the bound is vacuous", worstQ8)
	}
	worstS, worstV, worstQ8 = 0, 0, 0
}

// TestAttendAfterTruncate checks Scores and AccumV of every kind against
// Read (TestAttendMatchesRead's bound) after truncations that move the
// head-major fp16 ring back: a cancelled step (90 tokens, back to 87,
// then 3 rewritten), a truncation into the quantized history that the
// ring still covers (back to 80), and one past it (back to 20, then 41
// written), on head_dims 64 and 40 (the fp16 kernels' 64- and 8-column
// loops) with 1 and 7 query rows.
func TestAttendAfterTruncate(t *testing.T) {
	const tol = 2e-6
	layers := []Layer{{NumKVHeads: 2, HeadDim: 64}, {NumKVHeads: 3, HeadDim: 40}}
	for name, c := range attendCaches(t, layers, 200) {
		t.Run(name, func(t *testing.T) {
			ka := c.(runtime.KVAttender)
			rng := rand.New(rand.NewPCG(11, 12))
			write := func(pos, n int) { writeTokens(c, layers, rng, pos, n) }
			check := func() {
				for li, l := range layers {
					if !ka.AttendsKV(li) {
						continue
					}
					for _, nq := range []int{1, 7} {
						checkAttend(t, c, ka, li, l, c.Len(), nq, rng, tol)
					}
				}
			}
			write(0, 90)
			check()
			c.Truncate(87)
			write(87, 3)
			check()
			c.Truncate(80)
			check()
			c.Truncate(20)
			write(20, 41)
			check()
		})
	}
}

// valueMags sets vmag[j] = ‖v_j‖ + ‖v_j‖∞ for the rows v_j of vr
// ([len(vmag), hd]): the scale of checkAttend's value bounds.
func valueMags(vmag []float64, vr []float32, hd int) {
	for j := range vmag {
		var n2, mx float64
		for _, e := range vr[j*hd : (j+1)*hd] {
			n2 += float64(e) * float64(e)
			mx = max(mx, math.Abs(float64(e)))
		}
		vmag[j] = math.Sqrt(n2) + mx
	}
}

// q8WeightBound is checkAttend's allowance for int8-rounded value weights
// (kernels.CodeAccumQ8) for one query row of weights p over rows of
// value scales vmag: Σ_j κ·max_{|a−j|<16} |p_a|·vmag[a]/254, κ = 4 (see
// checkAttend).
func q8WeightBound(p []float32, vmag []float64) float64 {
	var b float64
	for j := range p {
		var m float64
		for a := max(0, j-15); a < min(len(p), j+16); a++ {
			m = max(m, math.Abs(float64(p[a]))*vmag[a])
		}
		b += 4 * m / 254
	}
	return b
}
