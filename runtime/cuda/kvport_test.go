package cuda

// Go ports of the per-row KV kinds of kv_append and attn_split
// (kernels/common.cuh kv_code, kv_deq, e4m3_to_f; kernels/kvcache.cu
// f_to_e4m3 and the KV_Q8_0/KV_Q4_0/KV_FP8 branches), checked on the CPU
// against runtime/kvcache's int8, int4, q8_0, q4_0 and fp8 caches and a
// float64 attention. Keep them in step with the .cu files.

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/lmpack/lmpack/quantize/kvq"
	lmruntime "github.com/lmpack/lmpack/runtime"
	"github.com/lmpack/lmpack/runtime/kvcache"
)

// kvCodePort ports kv_code.
func kvCodePort(row []byte, j, bits int) uint32 {
	p := j * bits
	return uint32(row[p>>3]) >> (p & 7) & (1<<bits - 1)
}

// e4m3ToFPort ports e4m3_to_f.
func e4m3ToFPort(c uint32) float32 {
	a := c & 0x7f
	e, m := a>>3, a&7
	var v float32
	switch {
	case a == 0x7f:
		v = float32(math.NaN())
	case e == 0:
		v = float32(m) * 0.001953125
	default:
		v = float32(8+m) * math.Float32frombits((e+117)<<23)
	}
	if c&0x80 != 0 {
		return -v
	}
	return v
}

// kvDeqPort ports kv_deq.
func kvDeqPort(kind int, row []byte, j int) float32 {
	switch kind {
	case kvQ8_0:
		b := row[j>>5*34:]
		d := kvq.F16ToFloat32(uint16(b[0]) | uint16(b[1])<<8)
		return float32(int8(b[2+j&31])) * d
	case kvQ4_0:
		b := row[j>>5*18:]
		d := kvq.F16ToFloat32(uint16(b[0]) | uint16(b[1])<<8)
		jj := j & 31
		by := b[2+jj&15]
		q := int(by & 15)
		if jj >= 16 {
			q = int(by >> 4)
		}
		return float32(q-8) * d
	}
	return e4m3ToFPort(uint32(row[j]))
}

// fToE4M3Port ports f_to_e4m3.
func fToE4M3Port(f float32) uint8 {
	if f != f {
		return 0x7f
	}
	sign := math.Float32bits(f) >> 24 & 0x80
	a := float32(math.Abs(float64(f)))
	if a >= 448 {
		return uint8(sign | 126)
	}
	if a < 0.015625 {
		return uint8(sign | uint32(math.RoundToEven(float64(a*512))))
	}
	e := int(math.Float32bits(a)>>23&0xff) - 127
	m := float32(math.RoundToEven(float64(a * math.Float32frombits(uint32(130-e)<<23))))
	return uint8(sign | uint32((e+6)*8+int(m)))
}

// encodeRowPort ports kv_append's KV_Q8_0, KV_Q4_0 and KV_FP8 branches
// for one (rotated) row y into dst (kvRowBytes bytes).
func encodeRowPort(dst []byte, y []float32, kind int) {
	hd := len(y)
	if kind == kvFP8 {
		for j, v := range y {
			dst[j] = fToE4M3Port(v)
		}
		return
	}
	bb := 18
	if kind == kvQ8_0 {
		bb = 34
	}
	for b0 := 0; b0 < hd; b0 += 32 {
		blk, yb := dst[b0/32*bb:], y[b0:b0+32]
		var d float32
		if kind == kvQ8_0 {
			var amax float32
			for _, v := range yb {
				if a := float32(math.Abs(float64(v))); a > amax { // fmaxf: NaN skipped
					amax = a
				}
			}
			d = amax / 127
			var id float32
			if d != 0 {
				id = 1 / d
			}
			for l, v := range yb {
				blk[2+l] = uint8(int8(math.Round(float64(v * id))))
			}
		} else {
			// The warp's (|y|, lane) maximum, lowest lane on ties.
			a, v := float32(-1), float32(0)
			for _, x := range yb {
				if x == x && float32(math.Abs(float64(x))) > a {
					a, v = float32(math.Abs(float64(x))), x
				}
			}
			m := float32(0)
			if a > 0 {
				m = v
			}
			d = m / -8
			var id float32
			if d != 0 {
				id = 1 / d
			}
			var cs [32]uint8
			for l, x := range yb {
				cs[l] = uint8(min(15, int(x*id+8.5)))
			}
			for l := 0; l < 16; l++ {
				blk[2+l] = cs[l] | cs[l+16]<<4
			}
		}
		dh := kvq.F16FromFloat32(d)
		blk[0], blk[1] = uint8(dh), uint8(dh>>8)
	}
}

// TestKernelPortE4M3: f_to_e4m3 equals kvq.F8E4M3FromFloat32 on every
// binary16 value (both signs, subnormals, ±Inf, NaN), the E4M3 rounding
// boundaries (each midpoint and its float32 neighbours) and 1e5 random
// float32s over [2^-12, 2^10]; e4m3_to_f equals kvq.F8E4M3ToFloat32 on
// all 256 bytes (NaN as NaN).
func TestKernelPortE4M3(t *testing.T) {
	check := func(f float32) {
		if got, want := fToE4M3Port(f), kvq.F8E4M3FromFloat32(f); got != want {
			t.Fatalf("f_to_e4m3(%g = %#08x): %#02x, want %#02x", f, math.Float32bits(f), got, want)
		}
	}
	for h := 0; h < 1<<16; h++ {
		check(kvq.F16ToFloat32(uint16(h)))
	}
	for c := 0; c < 126; c++ {
		lo, hi := kvq.F8E4M3ToFloat32(uint8(c)), kvq.F8E4M3ToFloat32(uint8(c+1))
		mid := (lo + hi) / 2 // exact: a few significant bits
		for _, f := range []float32{mid, math.Nextafter32(mid, 0), math.Nextafter32(mid, 1000)} {
			check(f)
			check(-f)
		}
	}
	r := rand.New(rand.NewPCG(7, 8))
	for i := 0; i < 100000; i++ {
		check(float32(math.Ldexp(1+r.Float64(), r.IntN(23)-12)))
	}
	for b := 0; b < 256; b++ {
		got, want := e4m3ToFPort(uint32(b)), kvq.F8E4M3ToFloat32(uint8(b))
		if math.Float32bits(got) != math.Float32bits(want) && !(got != got && want != want) {
			t.Fatalf("e4m3_to_f(%#02x) = %g, want %g", b, got, want)
		}
	}
}

// kvKindCase is a device KV kind under test with the head_dims it runs at.
type kvKindCase struct {
	name       string
	kind, bits int
}

var kvKindCases = []kvKindCase{{"int8", kvASYM, 8}, {"int4", kvASYM, 4}, {"q8_0", kvQ8_0, 8}, {"q4_0", kvQ4_0, 4}, {"fp8", kvFP8, 8}}

// kvRowTol is the largest |Δ| allowed between a port (or device) row of
// a kind and kvcache's row for the same binary16 input x of one (token,
// head) at head_dim hd: 0 for the unrotated kinds (int8, int4, fp8, and
// q8_0/q4_0 when 64 ∤ hd: the same float32 operations on the same values
// give the same codes); for q8_0 and q4_0 at a multiple of 64, whose
// Hadamard rotation is a dense float32 product here and
// kvq.FWHT's butterflies in kvcache, the two rotated values differ by
// float32 rounding, which can move a value across a rounding boundary
// (one code step d = max|y|/127 or max|y|/8 of its block, ≤ ‖x‖₂/127 or
// ‖x‖₂/8) and changes d's own rounding; un-rotated, one such step moves
// each output by d/√n ≤ d, and the float32 un-rotations differ by about
// hd·2^-24·‖x‖₂: the bound allows one step plus 1e-5·‖x‖₂.
func kvRowTol(kind, hd int, x []float32) float64 {
	if hd%64 != 0 {
		return 0
	}
	var n float64
	for _, v := range x {
		n += float64(v) * float64(v)
	}
	n = math.Sqrt(n)
	switch kind {
	case kvQ8_0:
		return n/127 + 1e-5*n
	case kvQ4_0:
		return n/8 + 1e-5*n
	}
	return 0
}

// kvKindRotations returns the port cache's rotations of a kind at hd
// (q8_0, q4_0: llama.cpp's Hadamard blocks; the others none).
func kvKindRotations(kind, hd int) (rk, rv []float32) {
	if kind == kvQ8_0 || kind == kvQ4_0 {
		return ggmlHadamard(hd, true), ggmlHadamard(hd, false)
	}
	return nil, nil
}

// TestKernelPortKVKinds: for int8, int4, q8_0, q4_0 and fp8, earlier
// tokens appended one at a time by the kv_append port read back (port
// codes decoded by decodeKVRow, un-rotated in float64) like the same
// kvcache method's cache written token by token (within kvRowTol; the
// inputs are binary16 so both quantize the same values), and the
// attention port for calls of T new queries (several splits, GQA, a
// sliding window, chunks shorter and longer than the ring's slack) equals
// the float64 attention over the rows each query is served (sink and the
// recent window fp16, the rest from the port's codes) to 2e-5. Head dims:
// 128 (q8_0/q4_0 K rotated in one block of 128, V in two of 64; INT4 rows
// read a word at a time), 96 (no rotation: not a multiple of 64) and, for
// the kinds without blocks, 36 (int4 rows of 18 bytes read byte by byte).
func TestKernelPortKVKinds(t *testing.T) {
	r := rand.New(rand.NewPCG(61, 62))
	const nh, nkv, sink, recent, n = 6, 2, 3, 10, 60
	ring := recent + 32
	for _, kc := range kvKindCases {
		hds := []int{128, 96, 36}
		if kc.kind == kvQ8_0 || kc.kind == kvQ4_0 {
			hds = hds[:2]
		}
		for _, hd := range hds {
			kvDim := nkv * hd
			qld := nh*hd + 2*kvDim
			for _, tc := range []struct{ T, window, splitLen int }{{1, 0, 128}, {1, 0, 16}, {4, 20, 16}, {45, 0, 32}} {
				name := fmt.Sprintf("%s hd %d T %d window %d split %d", kc.name, hd, tc.T, tc.window, tc.splitLen)
				T := tc.T
				pos0 := n - T
				rows := randVec(r, n*qld, 1)
				for i := range rows {
					rows[i] = round16(rows[i])
				}
				// One outlier channel per token row in the keys (the
				// distribution the quantized kinds must hold).
				for p := 0; p < n; p++ {
					rows[p*qld+nh*hd+5] *= 8
				}
				pc := newPortCacheKind(1, nkv, hd, sink, ring, n-sink, kc.kind, kc.bits)
				pc.rk, pc.rv = kvKindRotations(kc.kind, hd)
				for p := 0; p < pos0; p++ {
					pc.kvAppend(rows[p*qld:(p+1)*qld], qld, nh*hd, nh*hd+kvDim, 1, p, true)
				}
				cc, err := kvcache.New(kc.name, []kvcache.Layer{{NumKVHeads: nkv, HeadDim: hd}}, n, kvcache.Options{Sink: sink, Recent: recent})
				if err != nil {
					t.Fatal(err)
				}
				served := map[[2]int][2][]float32{}
				for p := 0; p < n; p++ {
					cc.Write(0, p, 1, rows[p*qld+nh*hd:], rows[p*qld+nh*hd+kvDim:])
					cc.Commit(1)
					if p < pos0 {
						continue
					}
					qe := cc.(lmruntime.QuantizedKV).QuantizedEnd(0, p+1)
					if want := max(sink, p+1-recent); qe != want {
						t.Fatalf("%s: kvcache watermark %d at %d tokens, want %d", name, qe, p+1, want)
					}
					for g := 0; g < nkv; g++ {
						K, V := make([]float32, pos0*hd), make([]float32, pos0*hd)
						cc.Read(0, g, pos0, K, V)
						for side, X := range [][]float32{K, V} {
							sinkR, ringR, codes, par, R := pc.sinkK, pc.ringK, pc.codesK, pc.parK, pc.rk
							if side == 1 {
								sinkR, ringR, codes, par, R = pc.sinkV, pc.ringV, pc.codesV, pc.parV, pc.rv
							}
							for q := 0; q < pos0; q++ {
								dst := X[q*hd : (q+1)*hd]
								switch {
								case q < sink:
									kvq.DecodeF16(dst, sinkR[(g*sink+q)*hd:(g*sink+q+1)*hd])
								case q < qe:
									qi := g*pc.capQ + q - sink
									y := make([]float32, hd)
									decodeKVRow(y, codes[qi*pc.rb:(qi+1)*pc.rb], par[qi*2:qi*2+2], kc.kind, kc.bits)
									x := rows[q*qld+nh*hd+side*kvDim+g*hd:][:hd]
									tol := kvRowTol(kc.kind, hd, x)
									for i := 0; i < hd; i++ {
										a := float64(y[i])
										if R != nil {
											a = 0
											for j := 0; j < hd; j++ {
												a += float64(y[j]) * float64(R[i*hd+j])
											}
										}
										if d := math.Abs(a - float64(dst[i])); d > tol {
											t.Fatalf("%s: quantized row %d (side %d head %d) column %d: port %.6g, kvcache %.6g (|Δ| %.3g > %.3g)", name, q, side, g, i, a, dst[i], d, tol)
										}
										dst[i] = float32(a)
									}
								default:
									kvq.DecodeF16(dst, ringR[(g*ring+q%ring)*hd:(g*ring+q%ring+1)*hd])
								}
							}
						}
						served[[2]int{g, p}] = [2][]float32{K, V}
					}
				}
				// The GPU tests' reference views (hostKV.served, which
				// servedViews feeds with the device buffers) from the
				// port's buffers equal these (the same decoding and
				// float64 un-rotation).
				hk := hostKV{nkv: nkv, hd: hd, rb: pc.rb, sink: sink, ring: ring, capQ: pc.capQ, kind: kc.kind, bits: kc.bits,
					windowStart: func(n int) int { return max(sink, n-recent, pos0-ring) },
					sinkR:       [2][]uint16{pc.sinkK, pc.sinkV}, ringR: [2][]uint16{pc.ringK, pc.ringV},
					codes: [2][]byte{pc.codesK, pc.codesV}, par: [2][]uint16{pc.parK, pc.parV}, r: [2][]float32{pc.rk, pc.rv}}
				if kc.kind != kvASYM {
					hk.par = [2][]uint16{}
				}
				for key, got := range hk.served(pos0, n) {
					for side := range got {
						for i, v := range got[side] {
							if w := served[key][side][i]; v != w {
								t.Fatalf("%s: hostKV.served head %d query %d side %d element %d: %g, want %g", name, key[0], key[1], side, i, v, w)
							}
						}
					}
				}
				own := rows[pos0*qld:]
				want := refAttnServed(own, qld, T, pos0, nh, nkv, hd, tc.window, func(g, pq int) ([]float32, []float32) {
					kv := served[[2]int{g, pq}]
					return kv[0], kv[1]
				})
				wstart := max(sink, pos0-ring)
				nsplit := (n + tc.splitLen - 1) / tc.splitLen
				for _, MG := range []int{1, 4} {
					partO := make([]float32, T*nh*nsplit*2*hd)
					partML := make([]float32, T*nh*nsplit*2)
					pc.attnSplit(MG, partO, partML, own, qld, nh, T, pos0, wstart, recent, tc.window, nsplit, tc.splitLen, float32(1/math.Sqrt(float64(hd))), true)
					out := make([]float32, T*nh*hd)
					attnMergePort(out, nh*hd, partO, partML, pc.rv, nh, hd, nsplit, T)
					worst := 0.0
					for i, w := range want {
						worst = max(worst, math.Abs(w-float64(out[i]))/(1+math.Abs(w)))
					}
					if worst > 2e-5 {
						t.Errorf("%s MG %d: worst |Δ|/(1+|ref|) %.3g, want ≤ 2e-5", name, MG, worst)
					}
				}
			}
		}
	}
}

// hostKV is one layer of a device cache of one sequence copied to the
// host (kernels/kvcache.cu layout; index 0 keys, 1 values).
type hostKV struct {
	nkv, hd, rb, sink, ring, capQ, kind, bits int
	// windowStart is DeviceCache.windowStart.
	windowStart  func(n int) int
	sinkR, ringR [2][]uint16
	codes        [2][]byte
	par          [2][]uint16
	r            [2][]float32 // rotations, or nil
}

// served returns, for each kv head g and query position pq in [pos0, n),
// the keys and values [pos0, hd] of positions [0, pos0) as
// DeviceCache.Read serves them to a cache of pq+1 tokens: the sink, the
// quantized rows below windowStart(pq+1) decoded by decodeKVRow and
// un-rotated in float64, and ring rows. Every position in [sink, pos0)
// must have its quantized row (written by one kv_append per token or
// call, which quantizes every position past the sink).
func (h *hostKV) served(pos0, n int) map[[2]int][2][]float32 {
	nkv, hd, rb := h.nkv, h.hd, h.rb
	// Every quantized row below pos0, decoded and un-rotated once.
	deq := [2][]float32{make([]float32, nkv*pos0*hd), make([]float32, nkv*pos0*hd)}
	y := make([]float32, hd)
	for side := range deq {
		for g := 0; g < nkv; g++ {
			for p := h.sink; p < pos0; p++ {
				qi := g*h.capQ + p - h.sink
				var par []uint16
				if h.par[side] != nil {
					par = h.par[side][qi*2 : qi*2+2]
				}
				decodeKVRow(y, h.codes[side][qi*rb:(qi+1)*rb], par, h.kind, h.bits)
				dst := deq[side][(g*pos0+p)*hd:][:hd]
				R := h.r[side]
				for j := range dst {
					if R == nil {
						dst[j] = y[j]
						continue
					}
					var a float64
					for i := 0; i < hd; i++ {
						a += float64(y[i]) * float64(R[j*hd+i])
					}
					dst[j] = float32(a)
				}
			}
		}
	}
	out := map[[2]int][2][]float32{}
	for pq := pos0; pq < n; pq++ {
		ws := h.windowStart(pq + 1)
		for g := 0; g < nkv; g++ {
			var kv [2][]float32
			for side := range kv {
				X := make([]float32, pos0*hd)
				for p := 0; p < pos0; p++ {
					dst := X[p*hd : (p+1)*hd]
					switch {
					case p < h.sink:
						kvq.DecodeF16(dst, h.sinkR[side][(g*h.sink+p)*hd:][:hd])
					case p < ws:
						copy(dst, deq[side][(g*pos0+p)*hd:][:hd])
					default:
						kvq.DecodeF16(dst, h.ringR[side][(g*h.ring+p%h.ring)*hd:][:hd])
					}
				}
				kv[side] = X
			}
			out[[2]int{g, pq}] = kv
		}
	}
	return out
}
