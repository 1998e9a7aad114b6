package kernels

import (
	"math"
	"testing"
)

var vecLens = []int{0, 1, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 512, 1408, 4099}

func TestDot(t *testing.T) {
	bothPaths(t, func(t *testing.T) {
		r := newRand(11)
		for _, n := range vecLens {
			a, b := guarded(t, n), guarded(t, n)
			fillRand(r, a)
			fillRand(r, b)
			var want, mag float64
			for i := range a {
				v := float64(a[i]) * float64(b[i])
				want += v
				mag += math.Abs(v)
			}
			got := Dot(a, b)
			if d := math.Abs(float64(got) - want); d > matTol*mag+1e-30 {
				t.Fatalf("Dot n=%d = %v, want %v (|err| %.3g)", n, got, want, d)
			}
		}
		mustPanic(t, "len(a)=2 != len(b)=3", func() { Dot(make([]float32, 2), make([]float32, 3)) })
	})
}

func TestAxpyScale(t *testing.T) {
	bothPaths(t, func(t *testing.T) {
		r := newRand(12)
		for _, n := range vecLens {
			x, y := guarded(t, n), guarded(t, n)
			fillRand(r, x)
			fillRand(r, y)
			y0 := append([]float32(nil), y...)
			const alpha = float32(-0.7)
			Axpy(alpha, x, y)
			for i := range y {
				// One or two roundings (FMA or not): within 1 ulp of the
				// larger term.
				want := float64(y0[i]) + float64(alpha)*float64(x[i])
				tol := 0x1p-23 * (math.Abs(float64(y0[i])) + math.Abs(float64(alpha)*float64(x[i])))
				if d := math.Abs(float64(y[i]) - want); d > tol {
					t.Fatalf("Axpy n=%d: y[%d] = %v, want %v", n, i, y[i], want)
				}
			}
			x0 := append([]float32(nil), x...)
			Scale(alpha, x)
			for i := range x {
				// A float32 product rounded once equals the rounded exact
				// product, which float64 holds exactly.
				if want := float32(float64(alpha) * float64(x0[i])); x[i] != want {
					t.Fatalf("Scale n=%d: x[%d] = %v, want %v", n, i, x[i], want)
				}
			}
		}
		mustPanic(t, "Axpy: len(x)=2 != len(y)=1", func() { Axpy(1, make([]float32, 2), make([]float32, 1)) })
	})
}

// expErr returns the relative error of got against e^x, treating the
// overflow boundary and the subnormal range specially: results that
// overflow must be +Inf (or the largest float within the tolerance), and
// subnormal results must be within 2 units of 2^-149.
func expErr(x, got float32) float64 {
	want := math.Exp(float64(x))
	switch {
	case math.IsInf(float64(got), 1):
		if want >= math.MaxFloat32*(1-1e-6) {
			return 0
		}
		return math.Inf(1)
	case want < 0x1p-126:
		if math.Abs(float64(got)-want) <= 2*0x1p-149 {
			return 0
		}
		return math.Inf(1)
	}
	return math.Abs(float64(got)-want) / want
}

func TestExp(t *testing.T) {
	const expTol = 1e-6
	bothPaths(t, func(t *testing.T) {
		// A dense sweep of the whole finite range plus random points.
		const steps = 1 << 20
		x := make([]float32, 0, 2*steps+16)
		for i := 0; i <= steps; i++ {
			x = append(x, float32(-104+(88.8+104)*float64(i)/steps))
		}
		r := newRand(13)
		for i := 0; i < steps; i++ {
			x = append(x, float32(-110+200*r.Float64()))
		}
		x = append(x, 0, float32(math.Copysign(0, -1)), 1, -1, 88.72, 88.7228, -87.33, -103.9, 1e-8, -1e-8)
		in := append([]float32(nil), x...)
		Exp(x)
		worst, at := 0.0, float32(0)
		for i, v := range x {
			if e := expErr(in[i], v); e > worst {
				worst, at = e, in[i]
			}
		}
		t.Logf("max relative error %.3g at x=%v", worst, at)
		if worst > expTol {
			t.Fatalf("Exp max relative error %.3g at x=%v exceeds %g", worst, at, expTol)
		}
		// Specials, placed in the vector part and in the tail.
		sp := []float32{float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()), 89, 1000, -105, -1000, 0, float32(math.NaN())}
		Exp(sp)
		want := []float32{float32(math.Inf(1)), 0, float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(1)), 0, 0, 1, float32(math.NaN())}
		for i := range sp {
			if !(sp[i] == want[i] || sp[i] != sp[i] && want[i] != want[i]) {
				t.Fatalf("Exp specials: element %d = %v, want %v", i, sp[i], want[i])
			}
		}
	})
}

func TestSiLUMul(t *testing.T) {
	bothPaths(t, func(t *testing.T) {
		r := newRand(14)
		for _, n := range vecLens {
			g, u := guarded(t, n), guarded(t, n)
			for i := range g {
				g[i] = float32(20 * (2*r.Float64() - 1))
			}
			fillRand(r, u)
			g0 := append([]float32(nil), g...)
			SiLUMul(g, u)
			for i := range g {
				gd := float64(g0[i])
				want := gd / (1 + math.Exp(-gd)) * float64(u[i])
				// exp error plus four roundings.
				if d := math.Abs(float64(g[i]) - want); d > 1.5e-6*math.Abs(want)+1e-37 {
					t.Fatalf("SiLUMul n=%d: element %d (g=%v u=%v) = %v, want %v", n, i, g0[i], u[i], g[i], want)
				}
			}
		}
		// Large |g|: e^-g overflows to +Inf for g < -88.8 and the result is 0.
		g := []float32{-200, -90, 200, 90, -1e30, 1e30, 0, 3, -200}
		u := []float32{1, 1, 1, 1, 1, 1, 1, 1, 1}
		SiLUMul(g, u)
		want := []float32{0, -90 / float32(1+math.Exp(90)), 200, 90, 0, 1e30, 0, 3 / float32(1+math.Exp(-3)), 0}
		for i := range g {
			if math.Abs(float64(g[i]-want[i])) > 1e-6*math.Abs(float64(want[i])) {
				t.Fatalf("SiLUMul extremes: element %d = %v, want %v", i, g[i], want[i])
			}
		}
		mustPanic(t, "SiLUMul: len(gate)=3 != len(up)=2", func() { SiLUMul(make([]float32, 3), make([]float32, 2)) })
	})
}

// softmaxPaths runs f on each of SoftmaxScaled's paths this build and CPU
// have: portable Go, AVX2+FMA (with the Go tail), AVX-512 F (masked tail).
func softmaxPaths(t *testing.T, f func(t *testing.T)) {
	t.Helper()
	defer func(v bool) { hasSoftmax512 = v }(hasSoftmax512)
	have := hasSoftmax512
	for _, path := range []string{"go", "avx2", "avx512"} {
		if (path != "go" && !hasAsm) || (path == "avx512" && !have) {
			t.Logf("no %s kernels in this build or CPU; that path did not run", path)
			continue
		}
		hasSoftmax512 = path == "avx512"
		t.Run(path, func(t *testing.T) {
			setAsm(t, path != "go")
			f(t)
		})
	}
}

// TestSoftmaxScaled checks Softmax and SoftmaxScaled on every path against
// the float64 softmax of alpha·x (the products exact in float64), over
// odd lengths (the 8- and 16-lane tails, and slices that end at a guard
// page, so a tail read past the end faults), inputs up to 1e4 in
// magnitude (exp overflows without the max shift), a −Inf (masked)
// position, and alpha = 1, 1/8 (exact), 1/√7 and 1/√128 (rounded); alpha
// ≤ 0 (−1/2 and 0, without the −Inf, which they turn into +Inf or NaN)
// goes through Scale. Bound: 1e-5 relative plus 1e-40 absolute (the
// float32 subnormal results). Each exponent is rounded once, to within
// half an ulp of |alpha·x_i − m| ≤ 104 where the result is not 0 (≤ 3.8e-6
// relative), exp adds a few ulps and the float32 sum of n terms the rest.
func TestSoftmaxScaled(t *testing.T) {
	softmaxPaths(t, func(t *testing.T) {
		r := newRand(15)
		alphas := []float32{1, 0.125, float32(1 / math.Sqrt(7)), float32(1 / math.Sqrt(128)), -0.5, 0}
		for _, n := range vecLens[1:] {
			for _, scale := range []float64{1, 30, 1e4} {
				for _, alpha := range alphas {
					x := guarded(t, n)
					for i := range x {
						x[i] = float32(scale * (2*r.Float64() - 1))
					}
					if n > 2 && alpha > 0 {
						x[n/2] = float32(math.Inf(-1)) // a masked position
					}
					in := append([]float32(nil), x...)
					if alpha == 1 && scale == 30 {
						Softmax(x)
					} else {
						SoftmaxScaled(alpha, x)
					}
					a := make([]float64, n)
					mx := math.Inf(-1)
					for i, v := range in {
						a[i] = float64(alpha) * float64(v)
						mx = math.Max(mx, a[i])
					}
					var sum float64
					for _, v := range a {
						sum += math.Exp(v - mx)
					}
					for i, v := range a {
						want := math.Exp(v-mx) / sum
						if d := math.Abs(float64(x[i]) - want); !(d <= 1e-5*want+1e-40) {
							t.Fatalf("SoftmaxScaled(%g) n=%d scale=%g: element %d = %v, want %v", alpha, n, scale, i, x[i], want)
						}
					}
				}
			}
		}
		// NaN or +Inf anywhere, or all −Inf, yields NaN everywhere.
		inf, nan := float32(math.Inf(1)), float32(math.NaN())
		for _, alpha := range []float32{1, 0.125} {
			for _, in := range [][]float32{
				{1, 2, nan, 4, 5, 6, 7, 8, 9, 10},
				{1, 2, 3, 4, 5, 6, 7, 8, 9, nan},
				{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, nan},
				{1, inf, 3},
				{-inf, -inf, -inf},
				{-inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf},
			} {
				x := append([]float32(nil), in...)
				SoftmaxScaled(alpha, x)
				for i, v := range x {
					if v == v {
						t.Fatalf("SoftmaxScaled(%g, %v): element %d = %v, want NaN", alpha, in, i, v)
					}
				}
			}
		}
		Softmax(nil)
		SoftmaxScaled(0.5, nil)
	})
}

// TestSoftmaxExp512Bits checks that the AVX-512 exponential (EXP512, 2^n
// by VSCALEFPS) gives the same bits as the AVX2 EXP (2^n as two exact
// factors) over the whole float32 range it handles: normal results,
// gradual underflow below 2^-126 down to 0 at −104, overflow to +Inf
// above 88.72, ±Inf, ±0 and NaN. With alpha = 1 and m = 0 the argument is
// x itself.
func TestSoftmaxExp512Bits(t *testing.T) {
	if !hasSoftmax512 {
		t.Skip("no AVX-512 F in this build or CPU")
	}
	r := newRand(21)
	const n = 1 << 16
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(-110 + 205*r.Float64())
	}
	copy(x, []float32{float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()), 0, float32(math.Copysign(0, -1)), -87.33, -103.97, 88.72, 88.73})
	y := append([]float32(nil), x...)
	expScaleSubSum512(&x[0], n, 1, 0)
	expAVX2(&y[0], n)
	for i := range x {
		if math.Float32bits(x[i]) != math.Float32bits(y[i]) && !(x[i] != x[i] && y[i] != y[i]) {
			t.Fatalf("exp at index %d: AVX-512 %v (%#08x), AVX2 %v (%#08x)", i, x[i], math.Float32bits(x[i]), y[i], math.Float32bits(y[i]))
		}
	}
}

func TestRMSNorm(t *testing.T) {
	bothPaths(t, func(t *testing.T) {
		r := newRand(16)
		for _, n := range vecLens[1:] {
			x, wt, out := guarded(t, n), guarded(t, n), guarded(t, n)
			for i := range x {
				x[i] = float32(3 * (2*r.Float64() - 1))
				wt[i] = float32(0.5 + r.Float64())
			}
			const eps = 1e-5
			var ss float64
			for _, v := range x {
				ss += float64(v) * float64(v)
			}
			inv := 1 / math.Sqrt(ss/float64(n)+eps)
			check := func(what string, got []float32) {
				for i := range got {
					want := float64(x[i]) * inv * float64(wt[i])
					if d := math.Abs(float64(got[i]) - want); d > 1e-5*math.Abs(want)+1e-30 {
						t.Fatalf("RMSNorm %s n=%d: out[%d] = %v, want %v", what, n, i, got[i], want)
					}
				}
			}
			RMSNorm(out, x, wt, eps)
			check("out-of-place", out)
			x0 := append([]float32(nil), x...)
			RMSNorm(x, x, wt, eps) // in place
			got := append([]float32(nil), x...)
			copy(x, x0)
			check("in-place", got)
		}
		mustPanic(t, "RMSNorm: len(out)=2, len(x)=3", func() { RMSNorm(make([]float32, 2), make([]float32, 3), make([]float32, 3), 1e-5) })
	})
}

func TestImpl(t *testing.T) {
	setAsm(t, false)
	if got := Impl(); got != "generic" {
		t.Fatalf("Impl() with assembly off = %q, want generic", got)
	}
	if hasAsm {
		useAsm = true
		if got := Impl(); got != "avx2+fma" {
			t.Fatalf("Impl() with assembly on = %q, want avx2+fma", got)
		}
	}
}
