package kernels

import (
	"fmt"
	"math"
	"testing"
	"unsafe"

	"github.com/lmpack/lmpack/formats/safetensors"
)

// guardedU16 returns a uint16 slice of length n > 0 ending right before an
// inaccessible page (guarded).
func guardedU16(t *testing.T, n int) []uint16 {
	g := guarded(t, (n+1)/2)
	u := unsafe.Slice((*uint16)(unsafe.Pointer(&g[0])), 2*len(g))
	return u[2*len(g)-n:]
}

// halfBits rounds v to kind's nearest value (safetensors' converters) and
// returns the bits.
func halfBits(kind HalfKind, v float32) uint16 {
	if kind == BF16 {
		return safetensors.BF16FromFloat32(v)
	}
	return safetensors.F16FromFloat32(v)
}

// halfCase runs MatMulNTHalf on [m,k]·[n,k]ᵀ with w of kind and checks it
// against the float64 reference of the widened w (independent of the
// kernels: safetensors' converters), then that it equals, bit for bit,
// MatMulNTRows on the widened w, every row computed alone, column ranges
// computed apart, and the pool's split on 2 and 3 threads.
func halfCase(t *testing.T, kind HalfKind, seed uint64, m, n, k, padX, padW, padY int) {
	t.Helper()
	r := newRand(seed)
	ldx, ldw, ldy := k+padX, k+padW, n+padY
	x := guarded(t, (m-1)*ldx+k)
	w := guardedU16(t, (n-1)*ldw+k)
	wf := make([]float32, len(w)) // the widening, by safetensors
	y := guarded(t, (m-1)*ldy+n)
	fillRand(r, x)
	for i := range w {
		w[i] = halfBits(kind, float32(2*r.Float64()-1))
		if kind == BF16 {
			wf[i] = safetensors.BF16ToFloat32(w[i])
		} else {
			wf[i] = safetensors.F16ToFloat32(w[i])
		}
	}
	fill(y, sentinel)
	what := fmt.Sprintf("MatMulNTHalf %v m=%d n=%d k=%d ld=(%d,%d,%d)", kind, m, n, k, ldx, ldw, ldy)
	MatMulNTHalf(kind, m, n, k, x, ldx, w, ldw, y, ldy)
	ref, mag := refNT(m, n, k, x, ldx, wf, ldw)
	checkMatResult(t, what, m, n, y, ldy, ref, mag)
	same := func(how string, i, j int, got float32) {
		t.Helper()
		if want := y[i*ldy+j]; math.Float32bits(got) != math.Float32bits(want) {
			t.Fatalf("%s: %s: y[%d,%d] = %v, want %v (the full product's)", what, how, i, j, got, want)
		}
	}
	wide := make([]float32, m*n)
	MatMulNTRows(m, n, k, x, ldx, wf, ldw, wide, n)
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			same("MatMulNTRows on the widened w", i, j, wide[i*n+j])
		}
	}
	one := make([]float32, n)
	for i := 0; i < m; i++ {
		MatMulNTHalf(kind, 1, n, k, x[i*ldx:], ldx, w, ldw, one, n)
		for j := range one {
			same("row alone", i, j, one[j])
		}
	}
	for _, cut := range [][2]int{{0, 1}, {1, min(3, n)}, {n / 2, n}, {n - 1, n}} {
		for _, rows := range [][2]int{{0, m}, {m / 2, m}, {m - 1, m}} {
			j0, j1, i0, i1 := cut[0], cut[1], rows[0], rows[1]
			if j1 <= j0 || i1 <= i0 {
				continue
			}
			part := make([]float32, (i1-i0)*(j1-j0))
			MatMulNTHalf(kind, i1-i0, j1-j0, k, x[i0*ldx:], ldx, w[j0*ldw:], ldw, part, j1-j0)
			for i := i0; i < i1; i++ {
				for j := j0; j < j1; j++ {
					same(fmt.Sprintf("rows [%d,%d) columns [%d,%d)", i0, i1, j0, j1), i, j, part[(i-i0)*(j1-j0)+j-j0])
				}
			}
		}
	}
	for _, th := range []int{2, 3} {
		p := NewPool(th)
		got := make([]float32, m*n)
		p.MatMulNTHalf(kind, m, n, k, x, ldx, w, ldw, got, n)
		p.Close()
		for i := 0; i < m; i++ {
			for j := 0; j < n; j++ {
				same(fmt.Sprintf("pool of %d threads", th), i, j, got[i*n+j])
			}
		}
	}
}

func TestMatMulNTHalfSmall(t *testing.T) {
	ms := []int{1, 2, 4, 5, 7}
	ns := []int{1, 3, 5, 8, 13, 17}
	ks := []int{1, 5, 7, 8, 9, 16, 23, 65}
	for _, kind := range []HalfKind{BF16, F16} {
		bothPaths(t, func(t *testing.T) {
			seed := uint64(11)
			for _, m := range ms {
				for _, n := range ns {
					for _, k := range ks {
						seed++
						halfCase(t, kind, seed, m, n, k, int(seed%3), int(seed/3%3), int(seed/9%3))
					}
				}
			}
		})
	}
}

func TestMatMulNTHalfLarge(t *testing.T) {
	cases := []struct{ m, n, k int }{
		{1, 1409, 512}, // decode, n odd
		{7, 515, 1541}, // k slices of 770 and 771 with tails; 4-row group + 3 rows
		{4, 37, 2000},  // three k slices, n%3 = 1, several stack tiles
		{1, 61, 777},   // two slices, tails of 4 and 5
	}
	for _, kind := range []HalfKind{BF16, F16} {
		bothPaths(t, func(t *testing.T) {
			for i, c := range cases {
				halfCase(t, kind, uint64(500+i), c.m, c.n, c.k, i%2*5, i%3, 7*(i%2))
			}
		})
	}
}

// TestMatMulNTHalfBadKind checks the panic naming an unknown kind.
func TestMatMulNTHalfBadKind(t *testing.T) {
	defer func() {
		if r := recover(); r == nil || !containsStr(fmt.Sprint(r), "unknown HalfKind 9") {
			t.Fatalf("panic %v, want one naming unknown HalfKind 9", r)
		}
	}()
	MatMulNTHalf(HalfKind(9), 1, 1, 1, []float32{1}, 1, []uint16{1}, 1, []float32{0}, 1)
}

func containsStr(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}

// BenchmarkMatMulNTHalf measures the decode GEMV (m = 1) and a 7-row GEMM
// on W [2816, 512] (the 22M model's fused gate/up) stored as bf16, f16
// and float32 (MatMulNTRows), one thread, in GB/s of weights read
// (W's bytes per call / time).
func BenchmarkMatMulNTHalf(b *testing.B) {
	const n, k = 2816, 512
	r := newRand(3)
	wf := randSlice(r, n*k)
	wb, wh := make([]uint16, n*k), make([]uint16, n*k)
	for i, v := range wf {
		wb[i], wh[i] = halfBits(BF16, v), halfBits(F16, v)
	}
	for _, m := range []int{1, 7} {
		x := randSlice(r, m*k)
		y := make([]float32, m*n)
		for _, c := range []struct {
			name  string
			bytes int
			run   func()
		}{
			{"bf16", 2, func() { MatMulNTHalf(BF16, m, n, k, x, k, wb, k, y, n) }},
			{"f16", 2, func() { MatMulNTHalf(F16, m, n, k, x, k, wh, k, y, n) }},
			{"f32", 4, func() { MatMulNTRows(m, n, k, x, k, wf, k, y, n) }},
		} {
			b.Run(fmt.Sprintf("m=%d/%s", m, c.name), func(b *testing.B) {
				for i := 0; i < b.N; i++ {
					c.run()
				}
				b.ReportMetric(float64(c.bytes*n*k)*float64(b.N)/b.Elapsed().Seconds()/1e9, "weight_GB/s")
			})
		}
	}
}

// TestWidenHalf: WidenHalf widens every bf16 and f16 bit pattern as
// safetensors' converters do (bit for bit for finite values and ±Inf;
// NaN to a NaN), at lengths with and without a tail of 1..7.
func TestWidenHalf(t *testing.T) {
	src := make([]uint16, 1<<16)
	for i := range src {
		src[i] = uint16(i)
	}
	for _, kind := range []HalfKind{BF16, F16} {
		ref := safetensors.BF16ToFloat32
		if kind == F16 {
			ref = safetensors.F16ToFloat32
		}
		bothPaths(t, func(t *testing.T) {
			for _, n := range []int{len(src), len(src) - 3, 7, 9} {
				s := src[len(src)-n:]
				dst := make([]float32, n+1)
				dst[n] = sentinel
				WidenHalf(kind, dst, s)
				if dst[n] != sentinel {
					t.Fatalf("%v n=%d: wrote past len(src)", kind, n)
				}
				for i, v := range s {
					got, want := dst[i], ref(v)
					if want != want {
						if got == got {
							t.Fatalf("%v %#04x: %v, want NaN", kind, v, got)
						}
						continue
					}
					if math.Float32bits(got) != math.Float32bits(want) {
						t.Fatalf("%v %#04x: %v (%#08x), want %v (%#08x)", kind, v, got, math.Float32bits(got), want, math.Float32bits(want))
					}
				}
			}
		})
	}
}

// TestPoolMatMulNTHalfNoAlloc: the pool's MatMulNTHalf allocates nothing
// per call, split over threads (decode and a 7-row batch) or inline.
func TestPoolMatMulNTHalfNoAlloc(t *testing.T) {
	const n, k = 300, 200
	r := newRand(5)
	w := make([]uint16, n*k)
	for i := range w {
		w[i] = halfBits(BF16, float32(2*r.Float64()-1))
	}
	x := randSlice(r, 7*k)
	y := make([]float32, 7*n)
	for _, th := range []int{1, 3} {
		p := NewPool(th)
		for _, m := range []int{1, 7} {
			if a := testing.AllocsPerRun(20, func() { p.MatMulNTHalf(BF16, m, n, k, x, k, w, k, y, n) }); a != 0 {
				t.Errorf("threads %d m=%d: %v allocations per call", th, m, a)
			}
		}
		p.Close()
	}
}
