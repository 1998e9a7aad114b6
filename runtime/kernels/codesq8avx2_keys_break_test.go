package kernels

import (
	"fmt"
	"math"
	"testing"
)

// TestBreakQ8KeysNonFinite: a NaN query gives NaN scores for every row
// (doc of codeQ8Round); a NaN/Inf scale or zero in one row's params only
// touches that row's score (no spread across the four-row group), on the
// AVX2 path and the Go tail alike; fp16 subnormal scales score as the Go
// reference does.
func TestBreakQ8KeysNonFinite(t *testing.T) {
	if !hasQ8AVX2 {
		t.Skip("no AVX2")
	}
	defer func(v, a bool) { hasVNNI512, hasQ8AVX2 = v, a }(hasVNNI512, hasQ8AVX2)
	hasVNNI512 = false
	r := newRand(3)
	for _, sh := range [][2]int{{2, 64}, {2, 128}, {4, 64}, {4, 128}, {8, 64}, {8, 128}, {8, 512}} {
		bits, hd := sh[0], sh[1]
		rb := hd * bits / 8
		for _, n := range []int{4, 5, 7, 8, 13} {
			codes := make([]byte, n*rb)
			for i := range codes {
				codes[i] = byte(r.IntN(256))
			}
			q := make([]float32, 4*hd)
			for i := range q {
				q[i] = float32(r.NormFloat64())
			}
			for _, bad := range []int{0, 1, 3, n - 1} {
				for _, kind := range []string{"sNaN", "sInf", "zNaN", "zInf", "sSub", "qNaN"} {
					name := fmt.Sprintf("b%d/hd%d/n%d/bad%d/%s", bits, hd, n, bad, kind)
					params := make([]uint16, 2*n)
					for j := 0; j < n; j++ {
						params[2*j], params[2*j+1] = halfBits(F16, float32(0.01+0.1*r.Float64())), halfBits(F16, float32(r.IntN(1<<bits)))
					}
					qq := append([]float32(nil), q...)
					switch kind {
					case "sNaN":
						params[2*bad] = 0x7e00
					case "sInf":
						params[2*bad] = 0x7c00
					case "zNaN":
						params[2*bad+1] = 0x7e00
					case "zInf":
						params[2*bad+1] = 0xfc00
					case "sSub":
						for j := 0; j < n; j++ {
							params[2*j] = uint16(1 + r.IntN(1023))
						}
					case "qNaN":
						qq[bad%hd] = float32(math.NaN())
					}
					qb, qb4, coef := make([]byte, CodeQ8Len(hd)), make([]byte, 4*CodeQ8Len(hd)), make([]float32, 8)
					sc, sm := CodeQ8Query(qb, qq[:hd], bits)
					CodeQ8Query4(qb4, qq, bits, coef)
					out, ref, out4 := make([]float32, n), make([]float32, n), make([]float32, 4*n)
					CodeDotsQ8F16(out, qb, sc, sm, codes, bits, rb, n, params)
					CodeDotsQ8F16x4(out4, n, qb4, coef, codes, bits, rb, n, params)
					codeDotsQ8F16Go(ref, qb, 1, 0, sc, sm, codes, bits, rb, params)
					for j := 0; j < n; j++ {
						isBad := j == bad && kind != "sSub" || kind == "qNaN"
						o, w := float64(out[j]), float64(ref[j])
						if isBad {
							if !(math.IsNaN(o) || math.IsInf(o, 0)) || math.IsNaN(o) != math.IsNaN(w) {
								t.Errorf("%s row %d: %g, Go %g", name, j, o, w)
							}
						} else if math.IsNaN(o) || math.IsInf(o, 0) || math.Abs(o-w) > 1e-5*(1+math.Abs(w)) {
							t.Errorf("%s row %d: %g, Go %g", name, j, o, w)
						}
						if kind != "qNaN" && math.Float32bits(out4[j]) != math.Float32bits(out[j]) {
							t.Errorf("%s row %d: x4 %g vs one %g", name, j, out4[j], out[j])
						}
					}
				}
			}
		}
	}
}
