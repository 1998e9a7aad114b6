package cuda

// Line-by-line Go ports of moe_gemv_q and moe_shared (kernels/moe.cu),
// threads run one after the other, in the manner of port_test.go: checked
// against weights.Quantized.Dequantize and runtime's moeFFN formula.

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/quantize/kvq"
	"github.com/lmpack/lmpack/quantize/weights"
)

// moeQLanePort ports the decoding of one lane of moe_gemv_q's warp for
// output row n of the pair with expert ex: it calls f(j, Ŵ) for every
// storage column j the lane handles, in the lane's order (its chunks of 8
// codes, then its tail codes), with x's index xj (perm applied).
func moeQLanePort(h moeHost, ex, n, N, P, Kd, lane int, f func(j, xj int, wv float32)) {
	rows := N / P
	sg := h.tab[((ex*P)+n/rows)*moeTabStride:]
	m := n % rows
	bits, group := int(sg[4]&255), int(sg[4]>>8)
	rb, G := (Kd*bits+7)>>3, Kd/group
	row := h.codes[int(sg[0])+m*rb:]
	sc := h.scales[int(sg[1])+m*G:]
	var zp []uint16
	if sg[2] >= 0 {
		zp = h.zeros[int(sg[2])+m*G:]
	}
	var pm []int32
	if sg[3] >= 0 {
		pm = h.perm[int(sg[3]):]
	}
	xj := func(j int) int {
		if pm != nil {
			return int(pm[j])
		}
		return j
	}
	zsym := float32(int(1) << (bits - 1))
	mask := uint32(1)<<bits - 1
	nc := 0
	if group&7 == 0 || group == Kd {
		nc = Kd >> 3
	}
	for c := lane; c < nc; c += 32 {
		var w uint64
		for i := 0; i < bits; i++ {
			w |= uint64(row[c*bits+i]) << (8 * i)
		}
		j0 := c * 8
		g := j0 / group
		s := kvq.F16ToFloat32(sc[g])
		z := zsym
		if zp != nil {
			z = kvq.F16ToFloat32(zp[g])
		}
		for i := 0; i < 8; i++ {
			f(j0+i, xj(j0+i), qvalPort(s, uint32(w>>(i*bits))&mask, s*z))
		}
	}
	for j := nc*8 + lane; j < Kd; j += 32 {
		g := j / group
		s := kvq.F16ToFloat32(sc[g])
		z := zsym
		if zp != nil {
			z = kvq.F16ToFloat32(zp[g])
		}
		p := j * bits
		b, off := p>>3, p&7
		cw := uint32(row[b])
		if off+bits > 8 && b+1 < rb {
			cw |= uint32(row[b+1]) << 8
		}
		f(j, xj(j), qvalPort(s, cw>>off&mask, s*z))
	}
}

// moeGemvQPort ports moe_gemv_q over its grid moeGemvGrid(T, K, N) with
// blocks of 4 warps of 32 lanes (each lane's partial sum, then the
// warp's sum).
func moeGemvQPort(y []float32, ldy int, x []float32, ldx, xsel int, h moeHost, sel []int32, T, K, N, P, Kd int) {
	g := moeGemvGrid(T, K, N)
	for by := 0; by < g.Y; by++ {
		for bx := 0; bx < g.X; bx++ {
			for warp := 0; warp < 4; warp++ {
				n, r := by*4+warp, bx
				if n >= N {
					continue
				}
				xr := r / K
				if xsel == 1 {
					xr = r
				}
				var part [32]float32
				for lane := 0; lane < 32; lane++ {
					moeQLanePort(h, int(sel[r]), n, N, P, Kd, lane, func(_, xj int, wv float32) {
						part[lane] += wv * x[xr*ldx+xj]
					})
				}
				var a float32
				for _, p := range part {
					a += p
				}
				y[r*ldy+n] = a
			}
		}
	}
}

// randQuantized returns a [rows, cols] quantized weight with random codes,
// binary16 scales in [0.005, 0.02), zero-points (integers in [0, 2^bits−1],
// fractional at 1 bit) unless sym, and a random act-order permutation
// when perm: any valid storage, whatever weights it came from.
func randQuantized(r *rand.Rand, rows, cols, bits, group int, sym, perm bool) *weights.Quantized {
	G := cols / group
	q := &weights.Quantized{Rows: rows, Cols: cols, Bits: bits, GroupSize: group, Symmetric: sym}
	rb := weights.RowBytes(cols, bits)
	q.Codes = make([]byte, rows*rb)
	codes := make([]uint8, cols)
	for i := 0; i < rows; i++ {
		for j := range codes {
			codes[j] = uint8(r.IntN(1 << bits))
		}
		weights.PackRow(q.Codes[i*rb:(i+1)*rb], codes, bits)
	}
	q.Scales = make([]uint16, rows*G)
	for i := range q.Scales {
		q.Scales[i] = kvq.F16FromFloat32(float32(0.005 + 0.015*r.Float64()))
	}
	if !sym {
		q.Zeros = make([]uint16, rows*G)
		for i := range q.Zeros {
			z := float32(r.IntN(1 << bits))
			if bits == 1 {
				z = float32(r.Float64()*1.5 - 0.25)
			}
			q.Zeros[i] = kvq.F16FromFloat32(z)
		}
	}
	if perm {
		q.Perm = make([]int32, cols)
		for j, v := range r.Perm(cols) {
			q.Perm[j] = int32(v)
		}
	}
	return q
}

// moeSeg is one segment's quantization in the port tests.
type moeSeg struct {
	bits, group int
	sym, perm   bool
}

// checkMoEGemvQ runs the moe_gemv_q port on the E·P segments qs (P per
// expert, each [N/P, Kd]) for random routing of T tokens to K experts,
// checks every Ŵ the lanes decode against qs[s].Dequantize (storage
// column j ↔ original column perm[j]; 1e-6 relative) and y against a
// float64 product of the dequantized weights (1e-5 of Σ|Ŵ·x|).
func checkMoEGemvQ(t *testing.T, what string, r *rand.Rand, qs []*weights.Quantized, E, P, N, Kd, T, K, xsel int) {
	t.Helper()
	h := moePack(qs)
	deq := make([][]float32, len(qs))
	for s, q := range qs {
		deq[s] = make([]float32, q.Rows*q.Cols)
		q.Dequantize(deq[s])
	}
	rows := N / P
	// Every decoded Ŵ, per (expert, n), over all lanes.
	for ex := 0; ex < E; ex++ {
		for n := 0; n < N; n++ {
			s, m := ex*P+n/rows, n%rows
			seen := make([]bool, Kd)
			for lane := 0; lane < 32; lane++ {
				moeQLanePort(h, ex, n, N, P, Kd, lane, func(j, xj int, wv float32) {
					seen[j] = true
					want := deq[s][m*Kd+xj]
					if d := math.Abs(float64(wv - want)); d > 1e-6*(1+math.Abs(float64(want))) {
						t.Fatalf("%s: expert %d row %d storage column %d (x column %d): Ŵ %v, Dequantize %v", what, ex, n, j, xj, wv, want)
					}
				})
			}
			for j, ok := range seen {
				if !ok {
					t.Fatalf("%s: expert %d row %d: column %d never decoded", what, ex, n, j)
				}
			}
		}
	}
	pairs := T * K
	xrows := T
	if xsel == 1 {
		xrows = pairs
	}
	x := randVec(r, xrows*Kd, 1)
	sel := make([]int32, pairs)
	for i := range sel {
		sel[i] = int32(r.IntN(E))
	}
	y := make([]float32, pairs*N)
	moeGemvQPort(y, N, x, Kd, xsel, h, sel, T, K, N, P, Kd)
	worst := 0.0
	for p := 0; p < pairs; p++ {
		xr := p / K
		if xsel == 1 {
			xr = p
		}
		ex := int(sel[p])
		for n := 0; n < N; n++ {
			s, m := ex*P+n/rows, n%rows
			var want, mag float64
			for j := 0; j < Kd; j++ {
				v := float64(deq[s][m*Kd+j]) * float64(x[xr*Kd+j])
				want += v
				mag += math.Abs(v)
			}
			worst = max(worst, math.Abs(want-float64(y[p*N+n]))/(1e-30+mag))
		}
	}
	if worst > 1e-5 || math.IsNaN(worst) {
		t.Errorf("%s: worst |Δy|/Σ|Ŵx| %.3g, want ≤ 1e-5", what, worst)
	} else {
		t.Logf("%s: worst |Δy|/Σ|Ŵx| %.3g", what, worst)
	}
}

// TestKernelPortMoEGemvQ: the moe_gemv_q port over packed experts whose
// segments differ in bits (1, 2, 3, 4, 8), group (32, 64, per channel,
// and 20: not a multiple of 8), symmetry and act-order permutation —
// gate and up of one expert differing too — decodes exactly
// Quantized.Dequantize and computes x·Ŵᵀ for every (token, expert) pair:
// gate/up shape (P = 2, input per token) and down shape (P = 1, Kd = 100
// not a multiple of 8, input per pair).
func TestKernelPortMoEGemvQ(t *testing.T) {
	r := rand.New(rand.NewPCG(71, 72))
	build := func(segs []moeSeg, rows, Kd int) []*weights.Quantized {
		var qs []*weights.Quantized
		for _, s := range segs {
			g := s.group
			if g == 0 {
				g = Kd
			}
			qs = append(qs, randQuantized(r, rows, Kd, s.bits, g, s.sym, s.perm))
		}
		return qs
	}
	// Gate/up: 4 experts × 2 segments of 6 rows, Kd = 320.
	gu := []moeSeg{
		{1, 32, false, false}, {2, 0, false, false},
		{3, 64, true, false}, {3, 64, false, true},
		{4, 0, true, true}, {8, 32, false, false},
		{8, 20, true, false}, {2, 20, false, true},
	}
	checkMoEGemvQ(t, "gate/up", r, build(gu, 6, 320), 4, 2, 12, 320, 5, 2, 0)
	// Down: 5 experts × 1 segment of 7 rows, Kd = 100 (per channel or 20).
	down := []moeSeg{{1, 0, false, false}, {3, 0, true, false}, {4, 20, false, true}, {8, 0, false, true}, {2, 0, false, false}}
	checkMoEGemvQ(t, "down", r, build(down, 7, 100), 5, 1, 7, 100, 4, 3, 1)
	if err := checkLaunchDims("moe_gemv_q", moeGemvGrid(9000, 8, 2*1408), Dim{128, 1, 1}, 0); err != nil {
		t.Errorf("top-8 of 9000 tokens: %v", err)
	}
}

// moeSharedPort ports moe_shared over its grid (T) of 256-thread blocks:
// the gate dot product as block_sum adds it (each thread's strided sum,
// each warp's butterfly, then warp 0 over the warps' sums).
func moeSharedPort(out, y, x, gate []float32, T, H int) {
	for t := 0; t < T; t++ {
		g := float32(1)
		if gate != nil {
			var part [256]float32
			for th := 0; th < 256; th++ {
				for j := th; j < H; j += 256 {
					part[th] += gate[j] * x[t*H+j]
				}
			}
			var ws [8]float32
			for w := 0; w < 8; w++ {
				ws[w] = warpSumPort(part[32*w : 32*w+32])
			}
			var lanes [32]float32
			copy(lanes[:], ws[:])
			d := warpSumPort(lanes[:])
			g = 1 / (1 + float32(math.Exp(float64(-d))))
		}
		for j := 0; j < H; j++ {
			out[t*H+j] += g * y[t*H+j]
		}
	}
}

// warpSumPort ports warp_sum (xor butterfly over 32 lanes) and returns
// lane 0's value.
func warpSumPort(v []float32) float32 {
	var a [32]float32
	copy(a[:], v)
	for o := 16; o > 0; o >>= 1 {
		var b [32]float32
		for l := range a {
			b[l] = a[l] + a[l^o]
		}
		a = b
	}
	return a[0]
}

// TestKernelPortMoEShared: the moe_shared port adds
// sigmoid(gate·x_t)·y_t to each row (float64 reference, 1e-6 of the
// row's scale), or y_t itself without a gate.
func TestKernelPortMoEShared(t *testing.T) {
	r := rand.New(rand.NewPCG(73, 74))
	const T, H = 3, 300
	x, y, gate := randVec(r, T*H, 1), randVec(r, T*H, 1), randVec(r, H, 0.1)
	base := randVec(r, T*H, 1)
	for _, gated := range []bool{true, false} {
		out := append([]float32(nil), base...)
		gp := gate
		if !gated {
			gp = nil
		}
		moeSharedPort(out, y, x, gp, T, H)
		for tk := 0; tk < T; tk++ {
			g := 1.0
			if gated {
				var d float64
				for j := 0; j < H; j++ {
					d += float64(gate[j]) * float64(x[tk*H+j])
				}
				g = 1 / (1 + math.Exp(-d))
				if g > 0.97 || g < 0.03 {
					t.Fatalf("token %d: gate %v saturated: the test would not see a wrong gate", tk, g)
				}
			}
			for j := 0; j < H; j++ {
				want := float64(base[tk*H+j]) + g*float64(y[tk*H+j])
				if d := math.Abs(want - float64(out[tk*H+j])); d > 1e-6*(1+math.Abs(want)) {
					t.Fatalf("gated %v token %d column %d: %v, want %v", gated, tk, j, out[tk*H+j], want)
				}
			}
		}
	}
}

// TestMoELaunchArgs: the arguments moeFFN passes to moe_gemv, moe_gemv_q
// and moe_shared match the compiled kernels' parameters in count and
// kind (DevPtr ↔ 64-bit pointer, int ↔ 32-bit), so a reordered or
// missing argument fails here without a GPU.
func TestMoELaunchArgs(t *testing.T) {
	nv := nvrtcForTest(t)
	var src Source
	for _, s := range Sources() {
		if s.Name == "moe.cu" {
			src = s
		}
	}
	ptx, err := nv.Compile(src.Name, src.Code, 80)
	if err != nil {
		t.Fatal(err)
	}
	q := &moeQW{codes: 1, scales: 2, zeros: 3, perm: 4, tab: 5, parts: 2}
	type call struct {
		name string
		args []any
	}
	var calls []call
	for _, qq := range []*moeQW{q, nil} {
		n, a := moeGemvArgs(10, 20, 11, 30, 0, dw{p: 12}, qq, 13, 2, 40, 50)
		calls = append(calls, call{n, a})
	}
	calls = append(calls, call{"moe_shared", moeSharedArgs(1, 2, 3, 4, 64)})
	for _, c := range calls {
		ps, ok := ptxParams(string(ptx))[c.name]
		if !ok {
			t.Errorf("moe.cu's PTX lacks entry %s", c.name)
			continue
		}
		if len(ps) != len(c.args) {
			t.Errorf("%s: %d arguments, the kernel has %d parameters %v", c.name, len(c.args), len(ps), ps)
			continue
		}
		for i, a := range c.args {
			want := "i4"
			switch a.(type) {
			case DevPtr:
				want = "p8"
			case float32:
				want = "f4"
			}
			if got := ps[i]; got != want {
				t.Errorf("%s: argument %d is %T, parameter %s", c.name, i, a, got)
			}
		}
	}
}

// TestMoEPackable: which expert stacks moeStack keeps packed.
func TestMoEPackable(t *testing.T) {
	q := &arch.Quantization{Tensors: map[string]arch.TensorQuant{
		"a": {Bits: 1, GroupSize: 64}, "b": {Bits: 8, GroupSize: 32, Symmetric: true, Perm: true},
		"c": {Bits: 3, GroupSize: 172}, "d": {Bits: 5, GroupSize: 32}, "e": {Bits: 4, GroupSize: 0},
	}}
	for _, c := range []struct {
		q     *arch.Quantization
		names []string
		want  bool
	}{
		{q, []string{"a", "b", "c"}, true}, // mixed widths, groups, symmetry, act-order
		{q, []string{"a", "x"}, false},     // x not quantized: the host path for the stack
		{q, []string{"d"}, false},          // 5 bits is no stored width
		{q, []string{"e"}, false},          // no group size
		{nil, []string{"a"}, false},
		{q, nil, false},
	} {
		if got := moePackable(c.q, c.names); got != c.want {
			t.Errorf("moePackable(%v) = %v, want %v", c.names, got, c.want)
		}
	}
}
