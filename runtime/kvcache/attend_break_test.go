package kvcache

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/runtime"
)

// Stress tests of the int8-rounded-query key scoring (codeScoresQ8,
// codeScoresQ8F16: kernels.CodeDotsQ8, CodeDotsQ8F16, CodeDotsQ8F16x4)
// through KVAttender.Scores, against the float64 products of Read's keys,
// with the bound of TestAttendCodePaths (2e-6 of the float scales plus,
// where the cache RoundsQuery, ‖q‖·√hd·‖k_j‖/254).

// breakQueries are query generators: row i of nq, head_dim hd.
var breakQueries = map[string]func(rng *rand.Rand, q []float32){
	"normal": func(rng *rand.Rand, q []float32) {
		for i := range q {
			q[i] = float32(rng.NormFloat64())
		}
	},
	"huge": func(rng *rand.Rand, q []float32) {
		for i := range q {
			q[i] = float32(1e15 * rng.NormFloat64())
		}
	},
	"tiny": func(rng *rand.Rand, q []float32) {
		for i := range q {
			q[i] = float32(1e-25 * rng.NormFloat64())
		}
	},
	"zero": func(rng *rand.Rand, q []float32) { clear(q) },
	"outlier": func(rng *rand.Rand, q []float32) {
		for i := range q {
			q[i] = float32(0.01 * rng.NormFloat64())
		}
		q[rng.IntN(len(q))] = -1000
	},
	"onehot": func(rng *rand.Rand, q []float32) {
		clear(q)
		q[rng.IntN(len(q))] = 1
	},
	// values at exact half-steps of δ = 127/127 = 1: k + 0.5
	"ties": func(rng *rand.Rand, q []float32) {
		for i := range q {
			q[i] = float32(rng.IntN(254)-127) + 0.5
		}
		q[0] = 127
	},
	"positive": func(rng *rand.Rand, q []float32) {
		for i := range q {
			q[i] = float32(1 + 0.01*rng.NormFloat64())
		}
	},
}

// breakCaches returns caches of every code-scored kind for one layer of
// head_dim hd, from New and from Pools of 32- and 17-token pages, with
// and without windows.
func breakCaches(t *testing.T, layers []Layer, capacity int) map[string]runtime.KVCache {
	t.Helper()
	return breakCachesOf(t, layers, capacity, func(m string) bool {
		return m != "fp32" && m != "fp16" && !strings.HasPrefix(m, "turboquant")
	}, []int{32, 17})
}

// breakCachesOf is breakCaches for the kinds keep accepts and Pools of
// the given page sizes (a block kind is left out of a pool whose pages
// are not whole quantization blocks).
func breakCachesOf(t *testing.T, layers []Layer, capacity int, keep func(string) bool, pages []int) map[string]runtime.KVCache {
	t.Helper()
	out := map[string]runtime.KVCache{}
	for _, m := range Methods() {
		if !keep(m) {
			continue
		}
		for _, win := range []bool{false, true} {
			opt := Options{Rotations: randRotations(rand.New(rand.NewPCG(3, 4)), layers, 0.9, 0.85)}
			w := "nowin"
			if win {
				opt.Sink, opt.Recent, w = 5, 7, "win"
			}
			c, err := New(m, layers, capacity, opt)
			if errors.Is(err, ErrBadShape) {
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			out[m+"/"+w] = c
			for _, pg := range pages {
				p, err := NewPool(m, layers, opt, 1<<30, pg)
				if err != nil && strings.Contains(err.Error(), "multiple of") {
					continue // block kinds take whole quantization blocks
				}
				if err != nil {
					t.Fatal(err)
				}
				pc, err := p.NewCache(capacity)
				if err != nil {
					t.Fatal(err)
				}
				out[fmt.Sprintf("%s/%s/pool%d", m, w, pg)] = pc
			}
		}
	}
	return out
}

// checkScoresQ compares Scores of nq rows from gen against Read's keys.
func checkScoresQ(t *testing.T, c runtime.KVCache, ka runtime.KVAttender, li int, l Layer, n, nq int, rng *rand.Rand, gen func(*rand.Rand, []float32), tol float64) {
	t.Helper()
	hd := l.HeadDim
	scratch := make([]float32, ka.AttendScratch(li, nq))
	kr, vr := make([]float32, n*hd), make([]float32, n*hd)
	rq := false
	if r, ok := c.(QueryRounder); ok {
		rq = r.RoundsQuery(li, nq)
	}
	for h := 0; h < l.NumKVHeads; h++ {
		c.Read(li, h, n, kr, vr)
		for _, r := range [][2]int{{0, n}, {3, n - 2}, {n - 5, n}, {1, 6}} {
			p0, p1 := r[0], r[1]
			w := p1 - p0
			ldq, lds := hd+1, w+3
			q := make([]float32, nq*ldq)
			for i := 0; i < nq; i++ {
				gen(rng, q[i*ldq:i*ldq+hd])
			}
			s := make([]float32, (nq-1)*lds+w) // exactly long enough
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
					bound := tol*(math.Sqrt(nq2*nk2)+abs) + 1e-30
					if rq {
						bound += math.Sqrt(nq2*nk2*float64(hd)) / 254
					}
					if !(math.Abs(got-ref) <= bound) {
						t.Fatalf("layer %d head %d [%d,%d) nq %d (rounds %v): score[%d][%d] = %g, Read gives %g (bound %.3g)", li, h, p0, p1, nq, rq, i, j, got, ref, bound)
					}
				}
			}
		}
	}
}

// TestBreakQ8Scores runs checkScoresQ over head_dims 32–256, GQA groups
// of 1–16 rows, every code-scored kind, New and paged caches, windows on
// and off, and the query shapes of breakQueries, where the cache rounds
// the query (RoundsQuery: the int8 kernels; TestAttendMatchesRead's
// float-path bound, 2e-6 relative, is too tight for one-hot and
// all-positive queries at head_dim ≥ 128 on those paths, so they are not
// run here).
func TestBreakQ8Scores(t *testing.T) {
	const tol = 2e-6
	for _, hd := range []int{32, 64, 128, 256} {
		layers := []Layer{{NumKVHeads: 2, HeadDim: hd}}
		for name, c := range breakCaches(t, layers, 400) {
			t.Run(fmt.Sprintf("hd%d/%s", hd, name), func(t *testing.T) {
				ka := c.(runtime.KVAttender)
				rng := rand.New(rand.NewPCG(uint64(hd), 5))
				pos := 0
				for _, n := range []int{37, 1, 263, 1} {
					writeTokens(c, layers[:1], rng, pos, n)
					pos += n
				}
				if !ka.AttendsKV(0) {
					t.Skip("no raw attention")
				}
				for _, nq := range []int{1, 3, 4, 8, 16} {
					if r, ok := c.(QueryRounder); !ok || !r.RoundsQuery(0, nq) {
						continue // the float paths (see above)
					}
					for _, qn := range slices.Sorted(maps.Keys(breakQueries)) {
						gen := breakQueries[qn]
						t.Run(fmt.Sprintf("nq%d/%s", nq, qn), func(t *testing.T) {
							checkScoresQ(t, c, ka, 0, layers[0], pos, nq, rng, gen, tol)
						})
					}
				}
			})
		}
	}
}

// breakFill writes n random tokens to a one-layer cache.
func breakFill(c runtime.KVCache, l Layer, rng *rand.Rand, n int) {
	writeTokens(c, []Layer{l}, rng, 0, n)
}

// TestBreakQ8RowBits checks that a GQA group's scores (nq 4 and 8:
// kernels.CodeDotsQ8F16x4; 2, 3, 6: per row) have the bits each row
// gets alone (nq 1), as codeScoresQ8F16's comment claims, on contiguous
// and paged caches with runs longer than codeQ8Piece. The oscar kinds
// are left out: their dense query rotation (MatMulNT over the nq rows)
// gives a row other bits in a group of 4 than alone even with codeQ8 off.
func TestBreakQ8RowBits(t *testing.T) {
	for _, hd := range []int{64, 80, 128} {
		layers := []Layer{{NumKVHeads: 1, HeadDim: hd}}
		for name, c := range breakCaches(t, layers, 700) {
			if r, ok := c.(QueryRounder); !ok || !r.RoundsQuery(0, 1) {
				continue
			}
			if strings.HasPrefix(name, "oscar") {
				// The dense rotation of the query (MatMulNT over nq rows)
				// already gives other bits for 4 rows than for 1 with the
				// float kernels (codeQ8 off): not the int8 kernels.
				continue
			}
			t.Run(fmt.Sprintf("hd%d/%s", hd, name), func(t *testing.T) {
				ka := c.(runtime.KVAttender)
				rng := rand.New(rand.NewPCG(uint64(hd), 77))
				n := 611
				breakFill(c, layers[0], rng, n)
				for _, nq := range []int{2, 3, 4, 6, 8} {
					if !c.(QueryRounder).RoundsQuery(0, nq) {
						continue
					}
					q := make([]float32, nq*hd)
					for i := range q {
						q[i] = float32(rng.NormFloat64())
					}
					for _, r := range [][2]int{{0, n}, {1, n - 3}, {7, 300}} {
						p0, p1 := r[0], r[1]
						w := p1 - p0
						s := make([]float32, nq*w)
						ka.Scores(0, 0, p0, p1, nq, q, hd, s, w, make([]float32, ka.AttendScratch(0, nq)))
						one := make([]float32, w)
						for i := 0; i < nq; i++ {
							ka.Scores(0, 0, p0, p1, 1, q[i*hd:], hd, one, w, make([]float32, ka.AttendScratch(0, 1)))
							for j := range one {
								if math.Float32bits(one[j]) != math.Float32bits(s[i*w+j]) {
									t.Fatalf("nq %d [%d,%d) row %d score %d: %g in the group, %g alone", nq, p0, p1, i, j+p0, s[i*w+j], one[j])
								}
							}
						}
					}
				}
			})
		}
	}
}

// TestBreakQ8NonFinite checks that a query with a NaN or an infinite
// element scores as the float path (codeQ8 off) does: NaN where it gives
// NaN, no finite score where it gives none.
func TestBreakQ8NonFinite(t *testing.T) {
	const hd = 64
	layers := []Layer{{NumKVHeads: 1, HeadDim: hd}}
	inf := float32(math.Inf(1))
	nan := float32(math.NaN())
	cases := map[string]func(q []float32){
		"one-nan": func(q []float32) { q[5] = nan },
		"all-nan": func(q []float32) {
			for i := range q {
				q[i] = nan
			}
		},
		"plus-inf":  func(q []float32) { q[5] = inf },
		"minus-inf": func(q []float32) { q[5] = -inf },
	}
	for _, kind := range []string{"int8", "int4", "int2-naive", "oscar2"} {
		opt := Options{Rotations: randRotations(rand.New(rand.NewPCG(3, 4)), layers, 0.9, 0.85)}
		c, err := New(kind, layers, 64, opt)
		if err != nil {
			t.Fatal(err)
		}
		if !c.(QueryRounder).RoundsQuery(0, 1) {
			t.Skip("no int8-rounded query on this CPU")
		}
		ka := c.(runtime.KVAttender)
		rng := rand.New(rand.NewPCG(1, 2))
		n := 40
		breakFill(c, layers[0], rng, n)
		for cn, mod := range cases {
			for _, nq := range []int{1, 4} {
				t.Run(fmt.Sprintf("%s/%s/nq%d", kind, cn, nq), func(t *testing.T) {
					q := make([]float32, nq*hd)
					for i := range q {
						q[i] = float32(rng.NormFloat64())
					}
					for i := 0; i < nq; i++ {
						mod(q[i*hd : (i+1)*hd])
					}
					scores := func(q8 bool) []float32 {
						defer func(v bool) { codeQ8 = v }(codeQ8)
						codeQ8 = q8
						s := make([]float32, nq*n)
						ka.Scores(0, 0, 0, n, nq, q, hd, s, n, make([]float32, ka.AttendScratch(0, nq)))
						return s
					}
					ref, got := scores(false), scores(true)
					for j := range ref {
						rf := math.IsNaN(float64(ref[j])) || math.IsInf(float64(ref[j]), 0)
						gf := math.IsNaN(float64(got[j])) || math.IsInf(float64(got[j]), 0)
						if rf != gf || math.IsNaN(float64(ref[j])) != math.IsNaN(float64(got[j])) {
							t.Fatalf("score %d: int8-rounded query %g, float path %g", j, got[j], ref[j])
						}
					}
				})
			}
		}
	}
}

// breakKeys are key-row generators for TestBreakQ8Keys.
var breakKeys = map[string]func(rng *rand.Rand, k []float32){
	"offset": func(rng *rand.Rand, k []float32) { // a row far from 0: zero ≫ the codes
		for i := range k {
			k[i] = float32(30 + 0.01*rng.NormFloat64())
		}
	},
	"constant": func(rng *rand.Rand, k []float32) {
		v := float32(rng.NormFloat64())
		for i := range k {
			k[i] = v
		}
	},
	"zero": func(rng *rand.Rand, k []float32) { clear(k) },
	"large": func(rng *rand.Rand, k []float32) { // large rows (1e5 would overflow the fp16 windows: Read then gives NaN)
		for i := range k {
			k[i] = float32(1e3 * rng.NormFloat64())
		}
	},
	"subnormal-scale": func(rng *rand.Rand, k []float32) {
		for i := range k {
			k[i] = float32(1e-6 * rng.NormFloat64())
		}
	},
}

// TestBreakQ8Keys is TestBreakQ8Scores with adversarial key rows (one
// generator per cache, every row), normal queries.
func TestBreakQ8Keys(t *testing.T) {
	const tol = 2e-6
	for _, hd := range []int{64, 128} {
		layers := []Layer{{NumKVHeads: 1, HeadDim: hd}}
		for kn, kg := range breakKeys {
			for name, c := range breakCaches(t, layers, 400) {
				if r, ok := c.(QueryRounder); !ok || !r.RoundsQuery(0, 1) {
					continue
				}
				t.Run(fmt.Sprintf("hd%d/%s/%s", hd, kn, name), func(t *testing.T) {
					ka := c.(runtime.KVAttender)
					rng := rand.New(rand.NewPCG(uint64(hd), 6))
					n := 301
					k, v := make([]float32, n*hd), make([]float32, n*hd)
					for r := 0; r < n; r++ {
						kg(rng, k[r*hd:(r+1)*hd])
						copy(v[r*hd:], randRow(rng, hd, 0.5))
					}
					c.Write(0, 0, n, k, v)
					c.Commit(n)
					for _, nq := range []int{1, 3, 4, 8} {
						checkScoresQ(t, c, ka, 0, layers[0], n, nq, rng, breakQueries["normal"], tol)
					}
				})
			}
		}
	}
}
