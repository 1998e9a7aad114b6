package cuda

import (
	"math/rand/v2"
	"testing"

	"github.com/lmpack/lmpack/quantize/weights"
)

// TestGPUMoEKernelsQ: moe_gemv_q on packed experts of mixed widths (1, 2,
// 3, 4, 8 bits), groups (32, per channel, 20), symmetry and act-order —
// gate/up shape (P = 2, Kd = 320, input per token) and down shape
// (P = 1, Kd = 100, input per pair) for 300 tokens, top 2 — and
// moe_shared with and without a gate, against their Go ports
// (moe_port_test.go), to 2e-5·(1+|ref|).
func TestGPUMoEKernelsQ(t *testing.T) {
	d, k := gpuOrSkip(t)
	r := rand.New(rand.NewPCG(91, 92))
	for _, c := range []struct {
		name           string
		segs           []moeSeg
		E, P, rows, Kd int
		xsel           int
	}{
		{"gate/up", []moeSeg{{1, 32, false, false}, {2, 0, false, false}, {3, 32, true, false}, {3, 32, false, true},
			{4, 0, true, true}, {8, 32, false, false}, {8, 20, true, false}, {2, 20, false, true}}, 4, 2, 6, 320, 0},
		{"down", []moeSeg{{1, 0, false, false}, {3, 0, true, false}, {4, 20, false, true}, {8, 0, false, true}, {2, 0, false, false}}, 5, 1, 7, 100, 1},
	} {
		var qs []*weights.Quantized
		for _, s := range c.segs {
			g := s.group
			if g == 0 {
				g = c.Kd
			}
			qs = append(qs, randQuantized(r, c.rows, c.Kd, s.bits, g, s.sym, s.perm))
		}
		h := moePack(qs)
		const T, K = 300, 2
		N := c.rows * c.P
		xrows := T
		if c.xsel == 1 {
			xrows = T * K
		}
		x := randVec(r, xrows*c.Kd, 1)
		sel := make([]int32, T*K)
		for i := range sel {
			sel[i] = int32(r.IntN(c.E))
		}
		q := &moeQW{codes: devBuf(t, d, h.codes), scales: devBuf(t, d, h.scales), tab: devBuf(t, d, i64Words(h.tab)), parts: c.P}
		if len(h.zeros) > 0 {
			q.zeros = devBuf(t, d, h.zeros)
		}
		if len(h.perm) > 0 {
			q.perm = devBuf(t, d, h.perm)
		}
		yp := devBuf(t, d, make([]float32, T*K*N))
		name, args := moeGemvArgs(yp, N, devBuf(t, d, x), c.Kd, c.xsel, dw{}, q, devBuf(t, d, sel), K, N, c.Kd)
		if err := k.Launch(name, moeGemvGrid(T, K, N), Dim{128, 1, 1}, args...); err != nil {
			t.Fatal(err)
		}
		got := download[float32](t, d, yp, T*K*N)
		want := make([]float32, T*K*N)
		moeGemvQPort(want, N, x, c.Kd, c.xsel, h, sel, T, K, N, c.P, c.Kd)
		checkClose(t, "moe_gemv_q "+c.name, got, want, 2e-5)
	}
	const T, H = 37, 300
	x, y, gate, base := randVec(r, T*H, 1), randVec(r, T*H, 1), randVec(r, H, 0.1), randVec(r, T*H, 1)
	for _, gated := range []bool{true, false} {
		op := devBuf(t, d, base)
		var gp DevPtr
		var gh []float32
		if gated {
			gp, gh = devBuf(t, d, gate), gate
		}
		if err := k.Launch("moe_shared", Dim{T, 1, 1}, Dim{256, 1, 1}, moeSharedArgs(op, devBuf(t, d, y), devBuf(t, d, x), gp, H)...); err != nil {
			t.Fatal(err)
		}
		got := download[float32](t, d, op, T*H)
		want := append([]float32(nil), base...)
		moeSharedPort(want, y, x, gh, T, H)
		checkClose(t, map[bool]string{true: "moe_shared gated", false: "moe_shared ungated"}[gated], got, want, 2e-5)
	}
}

// i64Words splits int64 values into little-endian uint32 pairs (the
// same bytes; devBuf takes elements of at most 4 bytes).
func i64Words(v []int64) []uint32 {
	out := make([]uint32, 0, 2*len(v))
	for _, x := range v {
		out = append(out, uint32(uint64(x)), uint32(uint64(x)>>32))
	}
	return out
}
