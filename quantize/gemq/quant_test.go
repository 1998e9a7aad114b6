package gemq

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/quantize/weights"
)

func randW(r *rand.Rand, n int) []float32 {
	w := make([]float32, n)
	for i := range w {
		w[i] = float32(r.NormFloat64() * 0.1)
	}
	return w
}

// TestBinarize: two levels per group around the group mean; the squared
// error of each group is at most its variance times its size (up to the
// fp16 rounding of mean and scale); a group of two values split evenly is
// reproduced exactly (values exact in fp16); the input is not modified.
func TestBinarize(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 1))
	const rows, cols = 7, 96
	w := randW(r, rows*cols)
	orig := slices.Clone(w)
	for _, group := range []int{0, 32} {
		q, err := Binarize(w, rows, cols, group)
		if err != nil {
			t.Fatal(err)
		}
		g := group
		if g == 0 {
			g = cols
		}
		for row := 0; row < rows; row++ {
			for g0 := 0; g0 < cols; g0 += g {
				seg, qs := w[row*cols+g0:][:g], q[row*cols+g0:][:g]
				var mu, v, sse float64
				for _, x := range seg {
					mu += float64(x)
				}
				mu /= float64(g)
				levels := map[float32]bool{}
				for j, x := range seg {
					v += (float64(x) - mu) * (float64(x) - mu)
					sse += (float64(x) - float64(qs[j])) * (float64(x) - float64(qs[j]))
					levels[qs[j]] = true
				}
				if len(levels) > 2 {
					t.Fatalf("group %d row %d: %d levels", group, row, len(levels))
				}
				if sse > v*(1+1e-2) {
					t.Errorf("group %d row %d at %d: squared error %g above the variance sum %g", group, row, g0, sse, v)
				}
			}
		}
	}
	if !slices.Equal(w, orig) {
		t.Error("Binarize modified its input")
	}
	two := []float32{0.5, -0.25, 0.5, -0.25}
	q, err := Binarize(two, 1, 4, 0)
	if err != nil || !slices.Equal(q, two) {
		t.Errorf("two-valued row: %v, %v; want it exactly", q, err)
	}
	if _, err := Binarize([]float32{1, float32(math.NaN())}, 1, 2, 0); !errors.Is(err, weights.ErrNonFinite) || !strings.Contains(err.Error(), "[0, 1]") {
		t.Errorf("NaN: %v", err)
	}
	if _, err := Binarize(make([]float32, 6), 2, 3, 2); !errors.Is(err, weights.ErrOptions) {
		t.Errorf("group 2 of 3 cols: %v", err)
	}
	if _, err := Binarize(make([]float32, 5), 2, 3, 0); !errors.Is(err, weights.ErrShape) {
		t.Errorf("5 values for 2×3: %v", err)
	}
	if _, err := Binarize([]float32{1e6, -1e6}, 1, 2, 0); !errors.Is(err, weights.ErrRange) {
		t.Errorf("scale beyond fp16: %v", err)
	}
}

// TestRTNQuantizer: widths 1-4 are weights.QuantizeRTN dequantized (at 1
// bit within float16 rounding of Binarize); the error shrinks with the
// width.
func TestRTNQuantizer(t *testing.T) {
	r := rand.New(rand.NewPCG(2, 2))
	const rows, cols = 16, 64
	w := randW(r, rows*cols)
	q := RTN(32)
	prev := math.Inf(1)
	for b := 1; b <= 4; b++ {
		got, err := q(w, rows, cols, b)
		if err != nil {
			t.Fatal(err)
		}
		qq, err := weights.QuantizeRTN(w, rows, cols, weights.Options{Bits: b, GroupSize: 32})
		if err != nil {
			t.Fatal(err)
		}
		want := make([]float32, rows*cols)
		qq.Dequantize(want)
		if b == 1 {
			bz, _ := Binarize(w, rows, cols, 32)
			for i := range bz {
				if d := math.Abs(float64(bz[i] - got[i])); d > 2e-3*(math.Abs(float64(bz[i]))+0.05) {
					t.Fatalf("1 bit: element %d is %v, Binarize %v", i, got[i], bz[i])
				}
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("%d bits: differs from the reference quantizer", b)
		}
		var mse float64
		for i := range w {
			mse += float64(got[i]-w[i]) * float64(got[i]-w[i])
		}
		if mse >= prev {
			t.Errorf("%d bits: squared error %g, not below %g of %d bits", b, mse, prev, b-1)
		}
		prev = mse
	}
	if _, err := q(w, rows, cols, 5); !errors.Is(err, weights.ErrOptions) {
		t.Errorf("5 bits: %v", err)
	}
}

// TestGPTQExpert: with identity Hessians GPTQ is RTN; with the Hessians of
// the expert's own inputs it has a smaller output error than RTN on those
// inputs at 1, 2, 3 and 4 bits.
func TestGPTQExpert(t *testing.T) {
	in, ex := synthLayer(8, 256, 16, 24, 2, 1, true)
	x := &ex[0]
	H, I, N := 16, 24, in.N
	X := make([]float64, N*H)
	for i, v := range in.X {
		X[i] = float64(v)
	}
	eye := func(n int) []float64 {
		m := make([]float64, n*n)
		for i := 0; i < n; i++ {
			m[i*n+i] = 1
		}
		return m
	}
	// Input second moments of gate/up (x) and down (h).
	hin, hdown := make([]float64, H*H), make([]float64, I*I)
	hs := make([][]float64, N)
	for tk := 0; tk < N; tk++ {
		xs := in.X[tk*H : (tk+1)*H]
		for a := 0; a < H; a++ {
			for b := 0; b < H; b++ {
				hin[a*H+b] += float64(xs[a]) * float64(xs[b]) / float64(N)
			}
		}
		h := make([]float64, I)
		for i := 0; i < I; i++ {
			var g, u float64
			for k := 0; k < H; k++ {
				g += float64(x.Gate[i*H+k]) * float64(xs[k])
				u += float64(x.Up[i*H+k]) * float64(xs[k])
			}
			h[i] = g / (1 + math.Exp(-g)) * u
		}
		hs[tk] = h
		for a := 0; a < I; a++ {
			for b := 0; b < I; b++ {
				hdown[a*I+b] += h[a] * h[b] / float64(N)
			}
		}
	}
	y := expertForward(X, N, H, I, x.Gate, x.Up, x.Down)
	outErr := func(q Expert) float64 {
		yq := expertForward(X, N, H, I, q.Gate, q.Up, q.Down)
		var s float64
		for i := range y {
			s += (yq[i] - y[i]) * (yq[i] - y[i])
		}
		return s
	}
	for b := 1; b <= 4; b++ {
		rtn, err := FakeQuantize(x, b, RTN(0))
		if err != nil {
			t.Fatal(err)
		}
		id, err := GPTQExpert(x, b, 0, eye(H), eye(I))
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(id.Gate, rtn.Gate) || !slices.Equal(id.Up, rtn.Up) || !slices.Equal(id.Down, rtn.Down) {
			t.Errorf("%d bits: GPTQ with identity Hessians differs from RTN", b)
		}
		g, err := GPTQExpert(x, b, 0, hin, hdown)
		if err != nil {
			t.Fatal(err)
		}
		er, eg := outErr(rtn), outErr(g)
		if !(eg < er) {
			t.Errorf("%d bits: GPTQ output error %v not below RTN %v", b, eg, er)
		}
		t.Logf("%d bits: expert output squared error RTN %.4g, GPTQ %.4g", b, er, eg)
	}
	if _, err := GPTQExpert(x, 3, 0, hin[:10], hdown); err == nil || !strings.Contains(err.Error(), "gate/up_proj input Hessian") {
		t.Errorf("short Hessian: %v", err)
	}
}
