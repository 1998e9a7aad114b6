package kvcache

import (
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/runtime"
)

// avx2Caches: the kinds the int8 code kernels take, from New and Pools of
// 16-, 17- and 48-token pages, windows on and off (breakCachesOf).
func avx2Caches(t *testing.T, layers []Layer, capacity int) map[string]runtime.KVCache {
	t.Helper()
	return breakCachesOf(t, layers, capacity, func(m string) bool {
		return m == "int8" || m == "int4" || strings.HasPrefix(m, "int2") || strings.HasPrefix(m, "quarot") || strings.HasPrefix(m, "oscar")
	}, []int{16, 17, 48})
}

// TestBreakAVX2AttendQ8 compares Scores and AccumV with Read for nq 1, 2,
// 3, 4, 8 at head_dim 64 and 128 under QueryRounder's bound, and checks
// that every row of a group's AccumV has the bits that row gets alone.
func TestBreakAVX2AttendQ8(t *testing.T) {
	const tol = 2e-6
	for _, hd := range []int{64, 128} {
		layers := []Layer{{NumKVHeads: 2, HeadDim: hd}}
		caches := avx2Caches(t, layers, 200)
		for _, name := range slices.Sorted(maps.Keys(caches)) {
			c := caches[name]
			t.Run(fmt.Sprintf("hd%d/%s", hd, name), func(t *testing.T) {
				ka := c.(runtime.KVAttender)
				rng := rand.New(rand.NewPCG(uint64(hd), 7))
				pos := 0
				for _, n := range []int{37, 1, 90, 1} {
					writeTokens(c, layers, rng, pos, n)
					pos += n
				}
				if !ka.AttendsKV(0) {
					t.Skip("no raw attention")
				}
				for _, nq := range []int{1, 2, 3, 4, 8} {
					checkAttendQ(t, c, ka, layers[0], pos, nq, rng, tol)
					for _, wn := range []string{"softmax", "peaked", "signed", "huge", "zero"} {
						if wn == "peaked" && strings.HasPrefix(name, "int2-naive") {
							// pre-existing, independent of codeQ8 and of the AVX2
							// kernels: int2naive_peaked_test.go
							continue
						}
						checkAccumW(t, c, ka, layers[0], pos, nq, rng, breakWeights[wn], false, [2]int{15, 34}, [2]int{16, 33}, [2]int{1, 2}, [2]int{0, 17})
					}
					checkRowBitsV(t, c, ka, layers[0], pos, nq, rng)
				}
			})
		}
	}
}

func checkAttendQ(t *testing.T, c runtime.KVCache, ka runtime.KVAttender, l Layer, n, nq int, rng *rand.Rand, tol float64) {
	t.Helper()
	gen := func(rng *rand.Rand, q []float32) {
		for i := range q {
			q[i] = float32(rng.NormFloat64())
		}
	}
	checkScoresQ(t, c, ka, 0, l, n, nq, rng, gen, tol)
}

// checkRowBitsV: a group's AccumV rows equal each row alone (nq 1) bit
// for bit where the kernels run per row (roundsWeights for nq and 1).
func checkRowBitsV(t *testing.T, c runtime.KVCache, ka runtime.KVAttender, l Layer, n, nq int, rng *rand.Rand) {
	t.Helper()
	cc := c.(*cache)
	if !cc.roundsWeights(0, nq) || !cc.roundsWeights(0, 1) || cc.layers[0].v.rot == rotMatrix {
		return // rotMatrix: MatMulNT of nq rows may round unlike one row
	}
	hd := l.HeadDim
	p := make([]float32, nq*n)
	breakWeights["softmax"](rng, p)
	out := make([]float32, nq*hd)
	ka.AccumV(0, 1, 0, n, nq, p, n, out, hd, make([]float32, ka.AttendScratch(0, nq)))
	for i := 0; i < nq; i++ {
		one := make([]float32, hd)
		ka.AccumV(0, 1, 0, n, 1, p[i*n:], n, one, hd, make([]float32, ka.AttendScratch(0, 1)))
		for ch := range one {
			if math.Float32bits(one[ch]) != math.Float32bits(out[i*hd+ch]) {
				t.Fatalf("nq %d row %d ch %d: group %g, alone %g", nq, i, ch, out[i*hd+ch], one[ch])
			}
		}
	}
}
