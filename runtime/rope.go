package runtime

import (
	"math"

	"github.com/lmpack/lmpack/formats/arch"
)

// InvFreq returns the RoPE inverse frequencies θ^(−2i/d) for i in [0, d/2),
// float64, with rope_scaling applied: "linear" divides every frequency by
// factor (positions / factor); "llama3" keeps high frequencies, divides
// low ones by factor and interpolates between (Llama 3.1,
// transformers' _compute_llama3_parameters).
func InvFreq(r arch.RoPE, headDim int) []float64 {
	half := headDim / 2
	f := make([]float64, half)
	for i := range f {
		f[i] = 1 / math.Pow(r.Theta, float64(2*i)/float64(headDim))
	}
	s := r.Scaling
	if s == nil {
		return f
	}
	switch s.Type {
	case "linear":
		for i := range f {
			f[i] /= s.Factor
		}
	case "llama3":
		old := float64(s.OriginalMaxPositionEmbeddings)
		lowWave := old / s.LowFreqFactor
		highWave := old / s.HighFreqFactor
		for i, inv := range f {
			wave := 2 * math.Pi / inv
			switch {
			case wave < highWave:
			case wave > lowWave:
				f[i] = inv / s.Factor
			default:
				smooth := (old/wave - s.LowFreqFactor) / (s.HighFreqFactor - s.LowFreqFactor)
				f[i] = (1-smooth)*inv/s.Factor + smooth*inv
			}
		}
	}
	return f
}

// ropeTable caches cos and sin for positions [0, n): [n, head_dim/2] each.
type ropeTable struct {
	inv      []float64
	half     int
	cos, sin []float32
	n        int
}

func newRopeTable(r arch.RoPE, headDim int) *ropeTable {
	return &ropeTable{inv: InvFreq(r, headDim), half: headDim / 2}
}

// ensure grows the table to cover positions [0, n).
func (t *ropeTable) ensure(n int) {
	if n <= t.n {
		return
	}
	m := max(n, 2*t.n, 64)
	cos := make([]float32, m*t.half)
	sin := make([]float32, m*t.half)
	for p := 0; p < m; p++ {
		for i, inv := range t.inv {
			a := float64(p) * inv
			cos[p*t.half+i] = float32(math.Cos(a))
			sin[p*t.half+i] = float32(math.Sin(a))
		}
	}
	t.cos, t.sin, t.n = cos, sin, m
}

// apply rotates x: [heads, head_dim] for position pos in place
// (rotate_half: pairs (i, i+d/2)).
func (t *ropeTable) apply(x []float32, heads, pos int) {
	h := t.half
	c := t.cos[pos*h : (pos+1)*h]
	s := t.sin[pos*h : (pos+1)*h]
	for k := 0; k < heads; k++ {
		v := x[k*2*h : (k+1)*2*h]
		a, b := v[:h], v[h:2*h]
		for i := 0; i < h; i++ {
			x1, x2 := a[i], b[i]
			a[i] = x1*c[i] - x2*s[i]
			b[i] = x2*c[i] + x1*s[i]
		}
	}
}
