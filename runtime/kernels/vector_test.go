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

func TestSoftmax(t *testing.T) {
	bothPaths(t, func(t *testing.T) {
		r := newRand(15)
		for _, n := range vecLens[1:] {
			for _, scale := range []float64{1, 30, 1e4} { // 1e4 overflows exp without the max shift
				x := guarded(t, n)
				for i := range x {
					x[i] = float32(scale * (2*r.Float64() - 1))
				}
				if n > 2 {
					x[n/2] = float32(math.Inf(-1)) // a masked position
				}
				in := append([]float32(nil), x...)
				Softmax(x)
				mx := math.Inf(-1)
				for _, v := range in {
					mx = math.Max(mx, float64(v))
				}
				var sum float64
				for _, v := range in {
					sum += math.Exp(float64(v) - mx)
				}
				for i, v := range in {
					want := math.Exp(float64(v)-mx) / sum
					if d := math.Abs(float64(x[i]) - want); d > 1e-5*want+1e-40 {
						t.Fatalf("Softmax n=%d scale=%g: element %d = %v, want %v", n, scale, i, x[i], want)
					}
				}
			}
		}
		// NaN anywhere, or all -Inf, yields NaN everywhere.
		for _, x := range [][]float32{
			{1, 2, float32(math.NaN()), 4, 5, 6, 7, 8, 9, 10},
			{1, 2, 3, 4, 5, 6, 7, 8, 9, float32(math.NaN())},
			{float32(math.Inf(-1)), float32(math.Inf(-1)), float32(math.Inf(-1))},
		} {
			Softmax(x)
			for i, v := range x {
				if v == v {
					t.Fatalf("Softmax with NaN/all -Inf input: element %d = %v, want NaN", i, v)
				}
			}
		}
		Softmax(nil)
	})
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
