package cuda

// Direct parity tests of the kernels that the other GPU tests reach only
// through whole-model logits, or not at all: dequant_q, embed, the
// per-head rmsnorm and add_bias, kv_append (fp16) with attn_split and
// attn_merge, moe_route and moe_combine. Each launches the kernel with
// the grid and block Model uses and compares with a CPU reference. They
// skip without a CUDA GPU (gpuOrSkip).

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/quantize/kvq"
	"github.com/lmpack/lmpack/quantize/weights"
	"github.com/lmpack/lmpack/runtime/kernels"
)

// ulp16 is the spacing of binary16 values at |x| (2^−24 in the
// subnormal range).
func ulp16(x float64) float64 {
	a := math.Abs(x)
	if a < 0x1p-14 {
		return 0x1p-24
	}
	_, e := math.Frexp(a) // a = f·2^e, f in [0.5, 1)
	return math.Ldexp(1, e-11)
}

// TestGPUDequantQGroups: dequant_q (grid (N, ⌈K/256⌉), block 256, as
// Model.matmulX) against weights.Quantized.Dequantize for 2, 3, 4 and 8
// bits, groups 32 and 64 and per channel (K = 300: not a multiple of 8
// nor of 256), symmetric and asymmetric. Tolerance: the binary16 rounding
// of the output, |ŵ_gpu − ŵ| ≤ ulp16(ŵ)/2 (scale·(code − zero) is exact in
// float32, so only the final rounding to binary16 may differ from the
// float32 value). No permutation (TestGPUDequantQ covers it and 1 bit).
func TestGPUDequantQGroups(t *testing.T) {
	d, k := gpuOrSkip(t)
	r := rand.New(rand.NewPCG(91, 92))
	const N = 37
	for _, bits := range []int{2, 3, 4, 8} {
		for _, tc := range []struct{ K, group int }{{320, 32}, {320, 64}, {300, 0}} {
			for _, sym := range []bool{false, true} {
				K := tc.K
				w := randVec(r, N*K, 0.05)
				q, err := weights.QuantizeRTN(w, N, K, weights.Options{Bits: bits, GroupSize: tc.group, Symmetric: sym})
				if err != nil {
					t.Fatal(err)
				}
				deq := make([]float32, N*K)
				q.Dequantize(deq)
				var zp DevPtr
				if !sym {
					zp = devBuf(t, d, q.Zeros)
				}
				// Poisoned output: an element the kernel misses stays NaN.
				out := make([]uint16, N*K)
				for i := range out {
					out[i] = 0x7e00
				}
				op := devBuf(t, d, out)
				if err := k.Launch("dequant_q", Dim{N, (K + 255) / 256, 1}, Dim{256, 1, 1}, op, devBuf(t, d, q.Codes), devBuf(t, d, q.Scales), zp, DevPtr(0), N, K, bits, q.GroupSize); err != nil {
					t.Fatal(err)
				}
				got := download[uint16](t, d, op, N*K)
				bad := 0
				for i, h := range got {
					g, want := float64(kvq.F16ToFloat32(h)), float64(deq[i])
					if !(math.Abs(g-want) <= ulp16(want)/2) {
						if bad < 5 {
							t.Errorf("bits %d K %d group %d sym %v: element [%d, %d] = %v (%#04x), want %v within %.3g", bits, K, tc.group, sym, i/K, i%K, g, h, want, ulp16(want)/2)
						}
						bad++
					}
				}
				if bad > 0 {
					t.Errorf("bits %d K %d group %d sym %v: %d of %d elements off", bits, K, tc.group, sym, bad, N*K)
				}
			}
		}
	}
}

// TestGPUEmbed: embed (grid (T), block 256, as Model.layersForward) of
// binary16 and bfloat16 tables [V, H] with H = 300 (more than one pass of
// the block) for ids that include 0 and V−1 and repeat, against
// kvq.F16ToFloat32 / safetensors.BF16ToFloat32 of the table rows; the
// conversion is exact, so the tolerance is 0. The tables hold subnormal,
// large and signed-zero values next to Gaussian ones.
func TestGPUEmbed(t *testing.T) {
	d, k := gpuOrSkip(t)
	r := rand.New(rand.NewPCG(93, 94))
	const V, H = 50, 300
	ids := []int32{0, V - 1, 7, 7, 23, 1, V - 2, 31, 0}
	T := len(ids)
	for _, bf := range []bool{false, true} {
		v := randVec(r, V*H, 1)
		v[H+1], v[H+2], v[2*H+3] = 3e-6, 6e4, float32(math.Copysign(0, -1)) // row 1 and 2: subnormal (binary16), large, −0
		tab := make([]uint16, V*H)
		want := make([]float32, T*H)
		for i, x := range v {
			if bf {
				tab[i] = safetensors.BF16FromFloat32(x)
			} else {
				tab[i] = kvq.F16FromFloat32(x)
			}
		}
		for ti, id := range ids {
			for j := 0; j < H; j++ {
				h := tab[int(id)*H+j]
				if bf {
					want[ti*H+j] = safetensors.BF16ToFloat32(h)
				} else {
					want[ti*H+j] = kvq.F16ToFloat32(h)
				}
			}
		}
		op := devBuf(t, d, make([]float32, T*H))
		if err := k.Launch("embed", Dim{T, 1, 1}, Dim{256, 1, 1}, op, devBuf(t, d, tab), devBuf(t, d, ids), H, b2i(bf)); err != nil {
			t.Fatal(err)
		}
		got := download[float32](t, d, op, T*H)
		for i := range want {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("bf16=%v: token %d (id %d) column %d: %v, want %v", bf, i/H, ids[i/H], i%H, got[i], want[i])
			}
		}
	}
}

// TestGPUHeadNormBias: the per-head rmsnorm of Qwen3's q/k norms (grid
// (R·heads), block 32, inner = heads, ld = the qkv row, in place, as
// Model.layersForward) against runtime/kernels.RMSNorm of each head to
// 2e-6·(1+|ref|) (TestGPUElementwise's tolerance), with the v columns
// left bit for bit; and add_bias on the first n of ld columns (the q/k/v
// bias) and on whole rows (the o_proj bias), exact (one float32 add).
func TestGPUHeadNormBias(t *testing.T) {
	d, k := gpuOrSkip(t)
	r := rand.New(rand.NewPCG(95, 96))
	const R, eps = 5, float32(1e-6)
	for _, sh := range []struct{ nh, nkv, hd int }{{8, 2, 128}, {6, 3, 64}} {
		nh, nkv, hd := sh.nh, sh.nkv, sh.hd
		qdim, kvdim := nh*hd, nkv*hd
		ld := qdim + 2*kvdim
		x := randVec(r, R*ld, 3)
		qn, kn := randVec(r, hd, 1), randVec(r, hd, 1)
		xp := devBuf(t, d, x)
		kp := xp + DevPtr(4*qdim)
		if err := k.Launch("rmsnorm", Dim{R * nh, 1, 1}, Dim{32, 1, 1}, xp, xp, devBuf(t, d, qn), hd, nh, ld, eps); err != nil {
			t.Fatal(err)
		}
		if err := k.Launch("rmsnorm", Dim{R * nkv, 1, 1}, Dim{32, 1, 1}, kp, kp, devBuf(t, d, kn), hd, nkv, ld, eps); err != nil {
			t.Fatal(err)
		}
		got := download[float32](t, d, xp, R*ld)
		want := append([]float32{}, x...)
		for i := 0; i < R; i++ {
			row := want[i*ld : (i+1)*ld]
			for h := 0; h < nh; h++ {
				kernels.RMSNorm(row[h*hd:(h+1)*hd], x[i*ld+h*hd:i*ld+(h+1)*hd], qn, eps)
			}
			for h := 0; h < nkv; h++ {
				o := qdim + h*hd
				kernels.RMSNorm(row[o:o+hd], x[i*ld+o:i*ld+o+hd], kn, eps)
			}
		}
		checkClose(t, fmt.Sprintf("per-head rmsnorm nh %d nkv %d hd %d", nh, nkv, hd), got, want, 2e-6)
		for i := 0; i < R; i++ {
			for j := qdim + kvdim; j < ld; j++ {
				if math.Float32bits(got[i*ld+j]) != math.Float32bits(x[i*ld+j]) {
					t.Fatalf("per-head rmsnorm changed v column %d of row %d: %v, was %v", j, i, got[i*ld+j], x[i*ld+j])
				}
			}
		}
	}
	// add_bias: n = 250 of ld = 300 columns, then n = ld = 300 (block 256,
	// so both take a second pass).
	for _, nl := range [][2]int{{250, 300}, {300, 300}} {
		n, ld := nl[0], nl[1]
		x, b := randVec(r, R*ld, 1), randVec(r, n, 1)
		xp := devBuf(t, d, x)
		if err := k.Launch("add_bias", Dim{R, 1, 1}, Dim{256, 1, 1}, xp, devBuf(t, d, b), n, ld); err != nil {
			t.Fatal(err)
		}
		got := download[float32](t, d, xp, R*ld)
		for i := 0; i < R; i++ {
			for j := 0; j < ld; j++ {
				want := x[i*ld+j]
				if j < n {
					want += b[j]
				}
				if math.Float32bits(got[i*ld+j]) != math.Float32bits(want) {
					t.Fatalf("add_bias n %d ld %d: [%d, %d] = %v, want %v", n, ld, i, j, got[i*ld+j], want)
				}
			}
		}
	}
}

// refAttention is causal softmax attention in float64 (scale 1/√hd) of
// queries q [B·T, qld] (query b·T + t at position pos0 + t, heads [nh,
// hd] from column 0) over kv(b, g) = K, V [positions, hd] of sequence b
// and kv head g = h/(nh/nkv); query position p sees [max(0, p−window+1),
// p] (window 0: [0, p]). The result is [B·T, nh·hd].
func refAttention(q []float32, qld, B, T, pos0, nh, nkv, hd, window int, kv func(b, g int) (K, V []float32)) []float64 {
	out := make([]float64, B*T*nh*hd)
	scale := 1 / math.Sqrt(float64(hd))
	for b := 0; b < B; b++ {
		for g := 0; g < nkv; g++ {
			K, V := kv(b, g)
			for h := g * (nh / nkv); h < (g+1)*(nh/nkv); h++ {
				for t := 0; t < T; t++ {
					p := pos0 + t
					lo := 0
					if window > 0 {
						lo = max(0, p-window+1)
					}
					qr := q[(b*T+t)*qld+h*hd:]
					sc := make([]float64, p+1-lo)
					m := math.Inf(-1)
					for i := range sc {
						var s float64
						for j := 0; j < hd; j++ {
							s += float64(qr[j]) * float64(K[(lo+i)*hd+j])
						}
						sc[i] = s * scale
						m = max(m, sc[i])
					}
					var l float64
					o := out[((b*T+t)*nh+h)*hd:][:hd]
					for i, s := range sc {
						e := math.Exp(s - m)
						l += e
						for j := range o {
							o[j] += e * float64(V[(lo+i)*hd+j])
						}
					}
					for j := range o {
						o[j] /= l
					}
				}
			}
		}
	}
	return out
}

// attnCase launches attn_split_g<MG> and attn_merge the way
// Model.attention does, with an explicit split length, for the R = B·T
// queries at q (qkv rows: q, k and v heads, row stride qld; the call's
// own tokens are read from them) over layer 0 of cache c, and returns the
// output [R, nh·hd]. The partial buffers start as NaN, so a (split, head)
// the kernel does not write shows.
func attnCase(t *testing.T, d *Device, k *Kernels, c *DeviceCache, q DevPtr, qld, B, T, pos0, wstart, window, nh, MG, splitLen int) []float32 {
	t.Helper()
	L := &c.layers[0]
	nkv, hd := L.nkv, L.hd
	R := B * T
	nTok := pos0 + T
	nsplit := (nTok + splitLen - 1) / splitLen
	chunks := (nh/nkv + MG - 1) / MG
	nan := float32(math.NaN())
	fill := func(n int) DevPtr {
		v := make([]float32, n)
		for i := range v {
			v[i] = nan
		}
		return devBuf(t, d, v)
	}
	partO, partML := fill(R*nh*nsplit*2*hd), fill(R*nh*nsplit*2)
	out := fill(R * nh * hd)
	scale := float32(1 / math.Sqrt(float64(hd)))
	if err := k.LaunchShared(fmt.Sprintf("attn_split%s_g%d", c.attnVariant(), MG), Dim{nsplit, nkv * chunks, R}, Dim{128, 1, 1}, 4*MG*(4*hd+256),
		partO, partML, q, qld,
		L.sinkK, L.sinkV, c.sink, L.ringK, L.ringV, c.ring,
		L.codesK, L.codesV, L.parK, L.parV, c.capQ,
		L.rk, nh, nkv, hd, T, pos0, wstart, c.recent, window, nsplit, splitLen, scale, c.kind, c.bits); err != nil {
		t.Fatal(err)
	}
	if err := k.Launch("attn_merge", Dim{nh, R, 1}, Dim{roundUp(hd, 32), 1, 1}, out, nh*hd, partO, partML, L.rv, nh, hd, nsplit); err != nil {
		t.Fatal(err)
	}
	return download[float32](t, d, out, R*nh*hd)
}

// attnModel is a Model holding just what NewDeviceCache and
// DeviceCache.append use: one layer of nh q heads and nkv kv heads of hd.
func attnModel(t *testing.T, d *Device, k *Kernels, nh, nkv, hd int) *Model {
	desc, _ := syntheticModel(t, 1, 64, nh, nkv, hd, 64, 64, 1)
	m := &Model{d: desc, dev: d, k: k, rope: map[int]*ropeDev{}}
	m.layers = []layerW{{nh: nh, nkv: nkv, hd: hd, qdim: nh * hd, kvdim: nkv * hd, qkv: (nh + 2*nkv) * hd}}
	return m
}

// checkAttn compares got with the float64 reference: |Δ| ≤ tol·(1+|ref|).
func checkAttn(t *testing.T, what string, got []float32, want []float64, tol float64) {
	t.Helper()
	worst, at := 0.0, 0
	for i, w := range want {
		e := math.Abs(float64(got[i])-w) / (1 + math.Abs(w))
		if !(e <= worst) {
			worst, at = e, i
		}
	}
	if !(worst <= tol) {
		t.Errorf("%s: worst error %.3g at %d (got %v, want %v), tolerance %.1g", what, worst, at, got[at], want[at], tol)
	}
}

// TestGPUAttentionFP16: kv_append into an fp16 DeviceCache of 2
// sequences (one prefill launch of 300 tokens straight from qkv rows, as
// Model.layersForward) stores every key and value as its binary16
// rounding, bit for bit; then attn_split + attn_merge for all 600 causal
// prefill queries, with GQA groups of 8 and 3 and every MG (1, 2, 4, 8:
// chunks of 8 heads down to 1, and partial chunks of the group of 3),
// head_dim 64 and 40, sliding windows 0 and 37,
// split lengths 64, 128 and 512 (one split), against refAttention over
// the float32 rows (a call's own tokens attend to each other through
// their fresh keys and values, not the cache's binary16 copies). Tolerance 2e-5·(1+|ref|): the Go port of these
// kernels (attnSplit, attnMergePort) meets 7.5e-7 on these cases in
// float32; the GPU adds reduction order and expf's 2 ulp. A wrong mask,
// split or merge is off by ≥ 1e-2 (one position more or less among
// ≤ 300 of weight ≥ 1e-3 on N(0, 1) values).
func TestGPUAttentionFP16(t *testing.T) {
	d, k := gpuOrSkip(t)
	r := rand.New(rand.NewPCG(97, 98))
	const B, n = 2, 300
	for _, sh := range []struct{ nh, nkv, hd int }{{16, 2, 64}, {6, 2, 40}} {
		nh, nkv, hd := sh.nh, sh.nkv, sh.hd
		m := attnModel(t, d, k, nh, nkv, hd)
		c, err := m.NewDeviceCache(n+8, CacheOptions{Method: "fp16", Batch: B})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Free() })
		qdim, kvdim := nh*hd, nkv*hd
		ld := qdim + 2*kvdim
		rows := randVec(r, B*n*ld, 1)
		rp := devBuf(t, d, rows)
		if err := c.append(k, 0, rp, ld, qdim, qdim+kvdim, 0, n, B); err != nil {
			t.Fatal(err)
		}
		// The ring [B][nkv][ring][hd] holds position p in slot p.
		L := &c.layers[0]
		K := make([][]float32, B*nkv)
		V := make([][]float32, B*nkv)
		for side, base := range []DevPtr{L.ringK, L.ringV} {
			got := download[uint16](t, d, base, B*nkv*c.ring*hd)
			for b := 0; b < B; b++ {
				for g := 0; g < nkv; g++ {
					dst := make([]float32, n*hd)
					for p := 0; p < n; p++ {
						for j := 0; j < hd; j++ {
							x := rows[(b*n+p)*ld+qdim+side*kvdim+g*hd+j]
							h := got[((b*nkv+g)*c.ring+p)*hd+j]
							if want := kvq.F16FromFloat32(x); h != want {
								t.Fatalf("kv_append fp16 side %d sequence %d head %d position %d column %d: %#04x, want %#04x (%v)", side, b, g, p, j, h, want, x)
							}
							dst[p*hd+j] = kvq.F16ToFloat32(h)
						}
					}
					if side == 0 {
						K[b*nkv+g] = dst
					} else {
						V[b*nkv+g] = dst
					}
				}
			}
		}
		_ = V
		// The call's own rows, float32 (the cache's copies are checked
		// above).
		F := func(b, g, side int) []float32 {
			out := make([]float32, n*hd)
			for p := 0; p < n; p++ {
				copy(out[p*hd:(p+1)*hd], rows[(b*n+p)*ld+qdim+side*kvdim+g*hd:][:hd])
			}
			return out
		}
		kv := func(b, g int) ([]float32, []float32) { return F(b, g, 0), F(b, g, 1) }
		for _, window := range []int{0, 37} {
			want := refAttention(rows, ld, B, n, 0, nh, nkv, hd, window, kv)
			for _, splitLen := range []int{64, 128, 512} {
				for _, MG := range []int{1, 2, 4, 8} {
					got := attnCase(t, d, k, c, rp, ld, B, n, 0, 0, window, nh, MG, splitLen)
					checkAttn(t, fmt.Sprintf("fp16 nh %d nkv %d hd %d window %d split %d MG %d", nh, nkv, hd, window, splitLen, MG), got, want, 2e-5)
				}
			}
		}
	}
}

// TestGPUAttentionOscar2: attn_split + attn_merge over a device oscar2
// cache (sink 4, recent 32, random rotations, clipping 0.96/0.92) holding
// n − T earlier tokens (host Write, kv_append), for a call of T = 1
// (decode), 5 and 60 (a chunk longer than the ring's 32-token slack)
// queries whose own keys and values are in their qkv rows, windows 0, 40
// (reaching back into the INT2 region) and 280, split lengths 128 and
// 512, GQA groups of 8 and 3 (MG 1, 2, 4, 8), head_dim 64 (INT2 rows read
// 4 bytes at a time) and 40 (byte by byte). Reference: refAttnServed
// with each query pq reading the earlier tokens as DeviceCache.Read
// serves them for pq+1 tokens (INT2 below max(sink, pq+1−32), the codes
// dequantized and un-rotated on the host: servedViews, checked against
// Read) and its call's tokens as their
// float32 rows. Tolerance 1e-4·(1+|ref|): TestKernelPortOscar2's 2e-5
// plus the float32 sums of up to 264 weighted INT2 codes less their zero
// term, and Read's float32 un-rotation; a misread code moves a value by
// ≥ a quantization step. Then the same for oscar4 (INT4 rows, ClipK4/ClipV4
// 0.98/0.96; head_dim 64 read a word at a time, 36 byte by byte).
func TestGPUAttentionOscar2(t *testing.T) {
	d, k := gpuOrSkip(t)
	r := rand.New(rand.NewPCG(99, 100))
	const n, recent = 300, 32
	for _, method := range []string{"oscar2", "oscar4"} {
		shapes := []struct{ nh, nkv, hd int }{{16, 2, 64}, {6, 2, 40}}
		if method == "oscar4" {
			shapes[1].hd = 36
		}
		for _, sh := range shapes {
			nh, nkv, hd := sh.nh, sh.nkv, sh.hd
			m := attnModel(t, d, k, nh, nkv, hd)
			rot := randRotations(r, m.d)
			rot.ClipK4, rot.ClipV4 = []float64{0.98}, []float64{0.96}
			kvdim := nkv * hd
			for _, T := range []int{1, 5, 60} {
				pos0 := n - T
				c, err := m.NewDeviceCache(n+4, CacheOptions{Method: method, Sink: 4, Recent: recent, Rotations: rot})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { c.Free() })
				c.Write(0, 0, pos0, randVec(r, pos0*kvdim, 1), randVec(r, pos0*kvdim, 1))
				c.Commit(pos0)
				wstart := c.quantFloor()
				if wstart != 4 {
					t.Fatalf("%s: quantized floor %d, want the sink 4", method, wstart)
				}
				// The views Read serves a cache of pq+1 tokens (rows below
				// pos0), from one download (servedViews), checked against
				// Read itself at pq = n−1 (Read un-rotates in float32,
				// servedViews in float64: a float32 sum of hd ≤ 64 terms
				// of |y·R| ≲ 20 in all is within 64·2⁻²⁴·20 ≈ 8e-5; a
				// misread row is off by a quantization step, ≥ 0.1).
				served := servedViews(t, d, c, pos0, n)
				for g := 0; g < nkv; g++ {
					K, V := make([]float32, n*hd), make([]float32, n*hd)
					c.Read(0, g, n, K, V)
					for side, X := range [][]float32{K, V} {
						for i, w := range served[[2]int{g, n - 1}][side] {
							if math.Abs(float64(X[i]-w)) > 1e-4*(1+math.Abs(float64(w))) {
								t.Fatalf("%s: Read side %d head %d element %d: %g, servedViews %g", method, side, g, i, X[i], w)
							}
						}
					}
				}
				qld := nh*hd + 2*kvdim
				q := randVec(r, T*qld, 1)
				qp := devBuf(t, d, q)
				for _, window := range []int{0, 40, 280} {
					want := refAttnServed(q, qld, T, pos0, nh, nkv, hd, window, func(g, pq int) ([]float32, []float32) {
						kv := served[[2]int{g, pq}]
						return kv[0], kv[1]
					})
					for _, splitLen := range []int{128, 512} {
						for _, MG := range []int{1, 2, 4, 8} {
							got := attnCase(t, d, k, c, qp, qld, 1, T, pos0, wstart, window, nh, MG, splitLen)
							checkAttn(t, fmt.Sprintf("%s nh %d nkv %d hd %d T %d window %d split %d MG %d", method, nh, nkv, hd, T, window, splitLen, MG), got, want, 1e-4)
						}
					}
				}
			}
		}
	}
}

// TestGPUMoERouteCombine: moe_route (grid ⌈T/32⌉, block 32) for 70
// tokens (three blocks, the last partial) against the CPU backend's
// routing (runtime/kernels.Softmax, then the K largest probabilities,
// ties to the lower expert id, as runtime's moeFFN) and the float64
// softmax weights of those experts, renormalised over the K when norm, for
// E = 8, K = 2 and E = 60, K = 1 and 8, with and without norm. Logits
// are spread ≥ 2/E apart within a token except in two tokens built to
// tie (all equal; pairs equal), so the selection is exact; one token sits
// at +100 (overflow without the max subtraction). Selection: exact;
// weights: 1e-6·(1+|w|) (a float32 port of moe_route meets 4e-8; the
// GPU's expf is within 2 ulp; a missing or extra renormalisation is off
// by ≥ 10%).
// Then moe_combine
// (grid T, block 256, H = 300) adds Σ_k w·y to random rows, against a
// float64 sum of the routed weights, to 2e-6·(1+|ref|).
func TestGPUMoERouteCombine(t *testing.T) {
	d, k := gpuOrSkip(t)
	r := rand.New(rand.NewPCG(101, 102))
	const T, H = 70, 300
	for _, tc := range []struct{ E, K int }{{8, 2}, {60, 1}, {60, 8}} {
		for _, norm := range []bool{false, true} {
			E, K := tc.E, tc.K
			logits := moeTestLogits(r, T, E)
			wantSel, wantW64 := moeRouteRef(logits, T, E, K, norm)
			wantW := make([]float32, T*K)
			for i, x := range wantW64 {
				wantW[i] = float32(x)
			}
			selP := devBuf(t, d, make([]int32, T*K))
			wP := devBuf(t, d, make([]float32, T*K))
			if err := k.Launch("moe_route", Dim{(T + 31) / 32, 1, 1}, Dim{32, 1, 1}, selP, wP, devBuf(t, d, logits), T, E, K, b2i(norm)); err != nil {
				t.Fatal(err)
			}
			sel := download[int32](t, d, selP, T*K)
			w := download[float32](t, d, wP, T*K)
			what := fmt.Sprintf("E %d K %d norm %v", E, K, norm)
			for i := range sel {
				if sel[i] != wantSel[i] {
					t.Fatalf("moe_route %s: token %d pick %d is expert %d, CPU %d (token's picks %v, CPU %v)", what, i/K, i%K, sel[i], wantSel[i], sel[i/K*K:i/K*K+K], wantSel[i/K*K:i/K*K+K])
				}
			}
			checkClose(t, "moe_route weights "+what, w, wantW, 1e-6)

			x0 := randVec(r, T*H, 1)
			y := randVec(r, T*K*H, 1)
			xp := devBuf(t, d, x0)
			if err := k.Launch("moe_combine", Dim{T, 1, 1}, Dim{256, 1, 1}, xp, devBuf(t, d, y), wP, K, H); err != nil {
				t.Fatal(err)
			}
			got := download[float32](t, d, xp, T*H)
			want := make([]float32, T*H)
			for i := 0; i < T; i++ {
				for j := 0; j < H; j++ {
					s := float64(x0[i*H+j])
					for kk := 0; kk < K; kk++ {
						s += float64(w[i*K+kk]) * float64(y[(i*K+kk)*H+j])
					}
					want[i*H+j] = float32(s)
				}
			}
			checkClose(t, "moe_combine "+what, got, want, 2e-6)
		}
	}
}

// moeTestLogits returns router logits [T, E]: each token's spread at
// least 2/E apart (a random permutation of 4/E steps plus jitter below
// 2/E), except token 3 (every expert equal), token 4 (pairs 2i, 2i+1
// equal) and token 5 (shifted by +100).
func moeTestLogits(r *rand.Rand, T, E int) []float32 {
	logits := make([]float32, T*E)
	for i := 0; i < T; i++ {
		row := logits[i*E : (i+1)*E]
		for e, p := range r.Perm(E) {
			row[e] = float32((float64(p)-float64(E)/2)*4/float64(E) + r.Float64()*2/float64(E))
		}
		switch i {
		case 3:
			clear(row)
		case 4:
			for e := 1; e < E; e += 2 {
				row[e] = row[e-1]
			}
		case 5:
			for e := range row {
				row[e] += 100
			}
		}
	}
	return logits
}

// moeRouteRef is the CPU backend's routing of logits [T, E] (runtime's
// moeFFN: runtime/kernels.Softmax, then the K largest probabilities in
// order, ties to the lower expert id): sel [T, K], and the float64
// softmax probabilities of those experts, divided by their sum when
// norm.
func moeRouteRef(logits []float32, T, E, K int, norm bool) ([]int32, []float64) {
	sel := make([]int32, T*K)
	w := make([]float64, T*K)
	p := make([]float32, E)
	for i := 0; i < T; i++ {
		row := logits[i*E : (i+1)*E]
		copy(p, row)
		kernels.Softmax(p)
		for j := 0; j < K; j++ {
			best := -1
			for e := 0; e < E; e++ {
				taken := false
				for jj := 0; jj < j; jj++ {
					taken = taken || int(sel[i*K+jj]) == e
				}
				if !taken && (best < 0 || p[e] > p[best]) {
					best = e
				}
			}
			sel[i*K+j] = int32(best)
		}
		mx := math.Inf(-1)
		for _, l := range row {
			mx = max(mx, float64(l))
		}
		var z, zk float64
		for _, l := range row {
			z += math.Exp(float64(l) - mx)
		}
		for j := 0; j < K; j++ {
			w[i*K+j] = math.Exp(float64(row[sel[i*K+j]])-mx) / z
			zk += w[i*K+j]
		}
		if norm {
			for j := 0; j < K; j++ {
				w[i*K+j] /= zk
			}
		}
	}
	return sel, w
}
