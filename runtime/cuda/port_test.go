package cuda

// Line-by-line Go ports of kv_append, attn_split and attn_merge
// (kernels/kvcache.cu, kernels/attention.cu) and of gemv_q and dequant_q
// (kernels/qgemv.cu; 1-bit grids and act-order permutations included),
// threads run one after the other, checked against kvcache's oscar2
// cache, plain softmax attention and weights.Quantized.Dequantize. They run without a GPU and guard the
// kernels' layouts and split/merge arithmetic; they do not prove the CUDA
// code compiles to the same thing (gpu_test.go checks that on a GPU).
// Keep them in step with the .cu files.

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/quantize/kvq"
	"github.com/lmpack/lmpack/quantize/weights"
	lmruntime "github.com/lmpack/lmpack/runtime"
	"github.com/lmpack/lmpack/runtime/kvcache"
)

type portCache struct {
	B, nkv, hd, sink, ring, capQ int
	kind, bits, rb               int // quantized row format (cache.go kvKinds)
	sinkK, sinkV, ringK, ringV   []uint16
	codesK, codesV               []byte
	parK, parV                   []uint16
	rk, rv                       []float32
	clipK, clipV                 int
}

// newPortCache is an oscar2-layout port cache (INT2 rows).
func newPortCache(B, nkv, hd, sink, ring, capQ int) *portCache {
	return newPortCacheKind(B, nkv, hd, sink, ring, capQ, kvASYM, 2)
}

// newPortCacheKind is a port cache whose quantized rows have the given
// kind and width (cache.go kvKinds).
func newPortCacheKind(B, nkv, hd, sink, ring, capQ, kind, bits int) *portCache {
	rows := B * nkv
	rb := kvRowBytes(kind, bits, hd)
	return &portCache{B: B, nkv: nkv, hd: hd, sink: sink, ring: ring, capQ: capQ, kind: kind, bits: bits, rb: rb,
		sinkK: make([]uint16, rows*sink*hd), sinkV: make([]uint16, rows*sink*hd),
		ringK: make([]uint16, rows*ring*hd), ringV: make([]uint16, rows*ring*hd),
		codesK: make([]byte, rows*capQ*rb), codesV: make([]byte, rows*capQ*rb),
		parK: make([]uint16, rows*capQ*2), parV: make([]uint16, rows*capQ*2), clipK: -1, clipV: -1}
}

func round16(x float32) float32 { return kvq.RoundF16(x) }

// asymParamsF16 ports asym_params_f16 at 2 bits.
func asymParamsF16(lo, hi float32) (float32, float32) { return asymParamsF16Bits(lo, hi, 3) }

// asymParamsF16Bits ports asym_params_f16 at qmax = 2^bits − 1.
func asymParamsF16Bits(lo, hi, qmax float32) (float32, float32) {
	s := (hi - lo) / qmax
	inv := 1 / s
	switch {
	case s > 0 && !math.IsInf(float64(inv), 0) && !math.IsInf(float64(s), 0):
	case lo > 0:
		s = lo
	case lo < 0:
		s = -lo
	default:
		s = 1
	}
	if s < 6.103515625e-05 {
		s = 6.103515625e-05
	}
	if a := float32(math.Abs(float64(lo))) / 32768; s < a {
		s = a
	}
	if s > 65504 {
		s = 65504
	}
	s16 := round16(s)
	if s16 < s {
		s16 = kvq.F16ToFloat32(kvq.F16FromFloat32(s) + 1)
	}
	return s16, round16(-lo / s16)
}

// absNaNInf is kv_append's |v| for ranking: |NaN| counts as +Inf.
func absNaNInf(v float32) float32 {
	if v != v {
		return float32(math.Inf(1))
	}
	return float32(math.Abs(float64(v)))
}

// clipTauPort ports kv_append's τ: +Inf unless a thread j finds |y_j| of
// rank class holding clipk (less ≤ clipk < less + equal).
func clipTauPort(y []float32, clipk int) float32 {
	tau := float32(math.Inf(1))
	for j := range y {
		a := absNaNInf(y[j])
		less, eq := 0, 0
		for i := range y {
			ci := absNaNInf(y[i])
			if ci < a {
				less++
			}
			if ci == a {
				eq++
			}
		}
		if less <= clipk && clipk < less+eq {
			tau = a
		}
	}
	return tau
}

// kvAppend ports kv_append for the whole grid (T, nkv, 2·B).
func (c *portCache) kvAppend(kv []float32, ld, koff, voff, T, pos0 int, quant bool) {
	hd := c.hd
	for z := 0; z < 2*c.B; z++ {
		for h := 0; h < c.nkv; h++ {
			for t := 0; t < T; t++ {
				b, side := z>>1, z&1
				p := pos0 + t
				off := koff
				if side == 1 {
					off = voff
				}
				row := kv[(b*T+t)*ld+off+h*hd:]
				x := make([]float32, hd)
				for j := range x {
					x[j] = round16(row[j])
				}
				if p < c.sink {
					dst := c.sinkK
					if side == 1 {
						dst = c.sinkV
					}
					kvq.EncodeF16(dst[((b*c.nkv+h)*c.sink+p)*hd:], x)
					continue
				}
				if p+c.ring >= pos0+T {
					dst := c.ringK
					if side == 1 {
						dst = c.ringV
					}
					kvq.EncodeF16(dst[((b*c.nkv+h)*c.ring+p%c.ring)*hd:], x)
				}
				if !quant {
					continue
				}
				R, clipk, codes, par := c.rk, c.clipK, c.codesK, c.parK
				if side == 1 {
					R, clipk, codes, par = c.rv, c.clipV, c.codesV, c.parV
				}
				y := make([]float32, hd)
				for j := range y {
					if R == nil {
						y[j] = x[j]
						continue
					}
					var a float32
					for i := 0; i < hd; i++ {
						a += x[i] * R[i*hd+j]
					}
					y[j] = a
				}
				qi := (b*c.nkv+h)*c.capQ + (p - c.sink)
				if c.kind != kvASYM {
					encodeRowPort(codes[qi*c.rb:(qi+1)*c.rb], y, c.kind)
					continue
				}
				if clipk >= 0 {
					tau := clipTauPort(y, clipk)
					for j := range y {
						if y[j] > tau {
							y[j] = tau
						} else if y[j] < -tau {
							y[j] = -tau
						}
					}
				}
				// block_min/block_max reduce with fminf/fmaxf: NaN is skipped.
				lo, hi := float32(math.Inf(1)), float32(math.Inf(-1))
				for _, v := range y {
					if v == v {
						lo, hi = min(lo, v), max(hi, v)
					}
				}
				qmax := float32(int(1)<<c.bits - 1)
				scale, zero := asymParamsF16Bits(lo, hi, qmax)
				per := 8 / c.bits
				for j := 0; j < hd; j += per {
					var by byte
					for k := 0; k < per && j+k < hd; k++ {
						v := y[j+k]*(1/scale) + (zero + 0.5)
						if !(v >= 0) {
							v = 0
						} else if v > qmax {
							v = qmax
						}
						by |= byte(v) << (c.bits * k)
					}
					codes[qi*c.rb+j/per] = by
				}
				par[qi*2], par[qi*2+1] = kvq.F16FromFloat32(scale), kvq.F16FromFloat32(zero)
			}
		}
	}
}

// attnSplit ports attn_split_g<MG> for the whole grid. q holds the qkv
// rows of the call's T tokens per sequence (q heads, then nkv key and nkv
// value heads, qld floats apart): positions ≥ pos0 are read from them.
func (c *portCache) attnSplit(MG int, partO, partML, q []float32, qld, nh, T, pos0, wstart, recent, window, nsplit, splitLen int, scale float32, quantOn bool) {
	const AT = 128
	hd, nkv := c.hd, c.nkv
	group := nh / nkv
	chunks := (group + MG - 1) / MG
	neg := float32(math.Inf(-1))
	for bt := 0; bt < c.B*T; bt++ {
		for by := 0; by < nkv*chunks; by++ {
			for s := 0; s < nsplit; s++ {
				g, ch := by/chunks, by%chunks
				h0 := g*group + ch*MG
				G := min(MG, group-ch*MG)
				b, t := bt/T, bt%T
				pq := pos0 + t
				lo := 0
				if window > 0 {
					lo = max(0, pq-window+1)
				}
				s0, s1 := max(lo, s*splitLen), min(pq+1, (s+1)*splitLen)
				hb := hd / 4
				wq := 0
				if quantOn {
					wq = min(pos0, max(wstart, pq+1-recent))
				}
				own := q[(bt-t)*qld+nh*hd:] // row p−pos0 at (p−pos0)·qld
				qf := make([]float32, MG*hd)
				qr := make([]float32, MG*hd)
				qsum := make([]float32, MG)
				for e := 0; e < G*hd; e++ {
					gg, j := e/hd, e%hd
					qf[gg*hd+j] = q[bt*qld+(h0+gg)*hd+j] * scale
				}
				ms, ls, alpha, us := make([]float32, MG), make([]float32, MG), make([]float32, MG), make([]float32, MG)
				for i := range ms {
					ms[i] = neg
				}
				quant := quantOn && wq > c.sink
				if quant {
					for e := 0; e < G*hd; e++ {
						gg, j := e/hd, e%hd
						var a float32
						if c.rk == nil {
							a = qf[gg*hd+j]
						}
						for i := 0; c.rk != nil && i < hd; i++ {
							a += qf[gg*hd+i] * c.rk[i*hd+j]
						}
						qr[gg*hd+j] = a
					}
					for gg := 0; gg < G; gg++ {
						var a float32
						for j := 0; j < hd; j++ {
							a += qr[gg*hd+j]
						}
						qsum[gg] = a
					}
				}
				TS := AT / hb
				aq := make([][]float32, AT) // [tid][MG·4]
				af := make([][]float32, AT)
				for i := range aq {
					aq[i], af[i] = make([]float32, MG*4), make([]float32, MG*4)
				}
				head := b*nkv + g
				pw := make([]float32, MG*AT)
				ws := make([]float32, MG*AT)
				for p0 := s0; p0 < s1; p0 += AT {
					for tid := 0; tid < AT; tid++ {
						p := p0 + tid
						sc := make([]float32, MG)
						for gg := range sc {
							sc[gg] = neg
						}
						if p < s1 {
							clear(sc) // phase 1a (INT2) and 1b (fp16, a warp per position in the kernel)
							if p >= c.sink && p < wq {
								qi := head*c.capQ + (p - c.sink)
								cr := c.codesK[qi*c.rb:]
								if c.kind == kvASYM {
									ks, kz := kvq.F16ToFloat32(c.parK[qi*2]), kvq.F16ToFloat32(c.parK[qi*2+1])
									for j := 0; j < hd; j++ {
										code := float32(kvCodePort(cr, j, c.bits))
										for gg := 0; gg < G; gg++ {
											sc[gg] += qr[gg*hd+j] * code
										}
									}
									for gg := 0; gg < G; gg++ {
										sc[gg] = ks * (sc[gg] - kz*qsum[gg])
									}
								} else {
									for j := 0; j < hd; j++ {
										kv := kvDeqPort(c.kind, cr, j)
										for gg := 0; gg < G; gg++ {
											sc[gg] += qr[gg*hd+j] * kv
										}
									}
								}
							} else if p >= pos0 {
								kf := own[(p-pos0)*qld+g*hd:]
								for j := 0; j < hd; j++ {
									for gg := 0; gg < G; gg++ {
										sc[gg] += qf[gg*hd+j] * kf[j]
									}
								}
							} else {
								var kr []uint16
								if p < c.sink {
									kr = c.sinkK[(head*c.sink+p)*hd:]
								} else {
									kr = c.ringK[(head*c.ring+p%c.ring)*hd:]
								}
								for j := 0; j < hd; j++ {
									for gg := 0; gg < G; gg++ {
										sc[gg] += qf[gg*hd+j] * kvq.F16ToFloat32(kr[j])
									}
								}
							}
						}
						for gg := 0; gg < MG; gg++ {
							pw[gg*AT+tid] = sc[gg]
						}
					}
					for gg := 0; gg < G; gg++ {
						pg := pw[gg*AT : (gg+1)*AT]
						mx := neg
						for _, v := range pg {
							mx = max(mx, v)
						}
						mold := ms[gg]
						mnew := max(mold, mx)
						var sum, usum float32
						nvis := min(AT, s1-p0)
						for i, v := range pg {
							e := float32(0)
							if v != neg {
								e = float32(math.Exp(float64(v - mnew)))
							}
							pg[i] = e
							sum += e
							if pp := p0 + i; i < nvis && pp >= c.sink && pp < wq {
								if c.kind != kvASYM {
									ws[gg*AT+i] = e
									continue
								}
								qi := head*c.capQ + (pp - c.sink)
								es := e * kvq.F16ToFloat32(c.parV[qi*2])
								ws[gg*AT+i] = es
								usum += es * kvq.F16ToFloat32(c.parV[qi*2+1])
							}
						}
						al := float32(0)
						if mold != neg {
							al = float32(math.Exp(float64(mold - mnew)))
						}
						alpha[gg], ls[gg], us[gg], ms[gg] = al, ls[gg]*al+sum, us[gg]*al+usum, mnew
					}
					for tid := 0; tid < AT; tid++ {
						cg, tl := tid%hb, tid/hb
						for gg := 0; gg < G; gg++ {
							for k := 0; k < 4; k++ {
								aq[tid][gg*4+k] *= alpha[gg]
								af[tid][gg*4+k] *= alpha[gg]
							}
						}
						pe := 0
						if tl < TS {
							pe = min(AT, s1-p0)
						}
						for i := tl; i < pe; i += TS {
							pp := p0 + i
							var v4 [4]float32
							isq := pp >= c.sink && pp < wq
							if isq {
								vr := c.codesV[(head*c.capQ+(pp-c.sink))*c.rb:]
								for k := range v4 {
									if c.kind == kvASYM {
										v4[k] = float32(kvCodePort(vr, cg*4+k, c.bits))
									} else {
										v4[k] = kvDeqPort(c.kind, vr, cg*4+k)
									}
								}
							} else if pp >= pos0 {
								copy(v4[:], own[(pp-pos0)*qld+(nkv+g)*hd+cg*4:])
							} else {
								var vr []uint16
								if pp < c.sink {
									vr = c.sinkV[(head*c.sink+pp)*hd:]
								} else {
									vr = c.ringV[(head*c.ring+pp%c.ring)*hd:]
								}
								for k := range v4 {
									v4[k] = kvq.F16ToFloat32(vr[cg*4+k])
								}
							}
							for gg := 0; gg < G; gg++ {
								for k := 0; k < 4; k++ {
									if isq {
										aq[tid][gg*4+k] += ws[gg*AT+i] * v4[k]
									} else {
										af[tid][gg*4+k] += pw[gg*AT+i] * v4[k]
									}
								}
							}
						}
					}
				}
				red := make([]float32, MG*2*hd)
				for r := 0; r < TS; r++ {
					for tid := 0; tid < AT; tid++ {
						cg, tl := tid%hb, tid/hb
						if tl != r {
							continue
						}
						for gg := 0; gg < G; gg++ {
							for k := 0; k < 4; k++ {
								red[gg*2*hd+cg*4+k] += aq[tid][gg*4+k]
								red[gg*2*hd+hd+cg*4+k] += af[tid][gg*4+k]
							}
						}
					}
				}
				for e := 0; e < G*hd*2; e++ {
					gg, j := e/(hd*2), e%(hd*2)
					row := (bt*nh+h0+gg)*nsplit + s
					if j < hd {
						partO[row*2*hd+j] = red[e] - us[gg]
					} else {
						partO[row*2*hd+j] = red[e]
					}
				}
				for gg := 0; gg < G; gg++ {
					row := (bt*nh+h0+gg)*nsplit + s
					partML[row*2], partML[row*2+1] = ms[gg], ls[gg]
				}
			}
		}
	}
}

// attnMerge ports attn_merge.
func attnMergePort(out []float32, outLd int, partO, partML, RV []float32, nh, hd, nsplit, BT int) {
	neg := float32(math.Inf(-1))
	for bt := 0; bt < BT; bt++ {
		for h := 0; h < nh; h++ {
			row0 := (bt*nh + h) * nsplit
			M := neg
			for s := 0; s < nsplit; s++ {
				M = max(M, partML[(row0+s)*2])
			}
			var L float32
			for s := 0; s < nsplit; s++ {
				if m := partML[(row0+s)*2]; m != neg {
					L += partML[(row0+s)*2+1] * float32(math.Exp(float64(m-M)))
				}
			}
			orot := make([]float32, hd)
			af := make([]float32, hd)
			for j := 0; j < hd; j++ {
				for s := 0; s < nsplit; s++ {
					m := partML[(row0+s)*2]
					if m == neg {
						continue
					}
					w := float32(math.Exp(float64(m - M)))
					orot[j] += w * partO[(row0+s)*2*hd+j]
					af[j] += w * partO[(row0+s)*2*hd+hd+j]
				}
			}
			for j := 0; j < hd; j++ {
				o := af[j]
				if RV != nil {
					for i := 0; i < hd; i++ {
						o += orot[i] * RV[j*hd+i]
					}
				} else {
					o += orot[j]
				}
				out[bt*outLd+h*hd+j] = o / L
			}
		}
	}
}

// refAttnServed is the float64 attention of the call's T queries of one
// sequence at positions [pos0, pos0+T) (q heads, then key and value
// heads, in the qkv rows qkv, qld floats apart): earlier positions
// [0, pos0) come from served(g, pq), the keys and values a query at pq
// reads ([pos0, head_dim] each), the call's own positions from the
// float32 rows. It returns [T, nh·hd].
func refAttnServed(qkv []float32, qld, T, pos0, nh, nkv, hd, window int, served func(g, pq int) (K, V []float32)) []float64 {
	out := make([]float64, T*nh*hd)
	for qt := 0; qt < T; qt++ {
		pq := pos0 + qt
		lo := 0
		if window > 0 {
			lo = max(0, pq-window+1)
		}
		for g := 0; g < nkv; g++ {
			K, V := served(g, pq)
			key := func(p int) []float32 {
				if p < pos0 {
					return K[p*hd : (p+1)*hd]
				}
				return qkv[(p-pos0)*qld+(nh+g)*hd:][:hd]
			}
			val := func(p int) []float32 {
				if p < pos0 {
					return V[p*hd : (p+1)*hd]
				}
				return qkv[(p-pos0)*qld+(nh+nkv+g)*hd:][:hd]
			}
			for h := g * (nh / nkv); h < (g+1)*(nh/nkv); h++ {
				qr := qkv[qt*qld+h*hd:][:hd]
				sc := make([]float64, pq+1)
				m := math.Inf(-1)
				for p := lo; p <= pq; p++ {
					var d float64
					for j, kx := range key(p) {
						d += float64(qr[j]) * float64(kx)
					}
					sc[p] = d / math.Sqrt(float64(hd))
					m = math.Max(m, sc[p])
				}
				var l float64
				o := out[(qt*nh+h)*hd:][:hd]
				for p := lo; p <= pq; p++ {
					e := math.Exp(sc[p] - m)
					l += e
					for j, vx := range val(p) {
						o[j] += e * float64(vx)
					}
				}
				for j := range o {
					o[j] /= l
				}
			}
		}
	}
	return out
}

// TestKernelPortOscar2: earlier tokens appended one at a time by the
// kv_append port read back like kvcache's oscar2 cache, and the attention
// port for a call of T new queries (several splits, GQA, a sliding
// window, prefill chunks shorter and longer than the ring's 32-token
// slack) reads the call's own tokens as their float32 rows and each
// earlier token as the CPU cache serves it to that query (kvcache
// written token by token through the query: sink and the recent window
// counted back from the query in fp16, the rest INT2): it equals the
// float64 attention over those rows to 2e-5. The same for oscar4 (INT4
// rows, clipped with ClipK4/ClipV4).
func TestKernelPortOscar2(t *testing.T) {
	r := rand.New(rand.NewPCG(31, 32))
	const nh, nkv, hd, sink, recent, n = 6, 2, 16, 3, 10, 75
	ring := recent + 32
	rot := &kvcache.Rotations{K: [][]float32{randOrthogonal(r, hd)}, V: [][]float32{randOrthogonal(r, hd)}, ClipK: []float64{0.9}, ClipV: []float64{0.8},
		ClipK4: []float64{0.95}, ClipV4: []float64{0.85}}
	kvDim := nkv * hd
	qld := nh*hd + 2*kvDim
	for _, mc := range []struct {
		method       string
		bits         int
		clipK, clipV float64
	}{{"oscar2", 2, 0.9, 0.8}, {"oscar4", 4, 0.95, 0.85}} {
		for _, tc := range []struct {
			T, window, splitLen int
		}{{1, 0, 128}, {1, 0, 16}, {4, 0, 16}, {3, 20, 16}, {1, 0, 8}, {40, 0, 16}, {40, 50, 32}} {
			T := tc.T
			pos0 := n - T
			// Token rows [n, qld]: q (used for the call's tokens), k, v.
			rows := randVec(r, n*qld, 1)
			pc := newPortCacheKind(1, nkv, hd, sink, ring, n-sink, kvASYM, mc.bits)
			pc.rk, pc.rv = rot.K[0], rot.V[0]
			pc.clipK, pc.clipV = clipIndex(mc.clipK, hd), clipIndex(mc.clipV, hd)
			for p := 0; p < pos0; p++ {
				pc.kvAppend(rows[p*qld:(p+1)*qld], qld, nh*hd, nh*hd+kvDim, 1, p, true)
			}
			// The CPU cache, written token by token up to each query, says
			// which earlier positions that query reads INT2
			// (QuantizedEnd); the reference reads them from the port's
			// codes (un-rotated in float64), the others from its binary16
			// sink and ring, and checks the INT2 rows against the CPU
			// cache's (one binary16 scale ulp apart at most, ~1e-3: the port
			// rotates with a loop, kvcache with MatMulNT).
			cc, err := kvcache.New(mc.method, []kvcache.Layer{{NumKVHeads: nkv, HeadDim: hd}}, n, kvcache.Options{Sink: sink, Recent: recent, Rotations: rot})
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
					t.Fatalf("kvcache %s watermark %d at %d tokens, want %d", mc.method, qe, p+1, want)
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
								sc, z := kvq.F16ToFloat32(par[qi*2]), kvq.F16ToFloat32(par[qi*2+1])
								y := make([]float64, hd)
								for j := range y {
									y[j] = (float64(kvCodePort(codes[qi*pc.rb:], j, mc.bits)) - float64(z)) * float64(sc)
								}
								for i := 0; i < hd; i++ {
									var a float64
									for j := 0; j < hd; j++ {
										a += y[j] * float64(R[i*hd+j])
									}
									if math.Abs(a-float64(dst[i])) > 1e-2 {
										t.Fatalf("%s T=%d: quantized row %d (side %d head %d) column %d: port %.5g, kvcache %.5g", mc.method, T, q, side, g, i, a, dst[i])
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
			own := rows[pos0*qld:]
			want := refAttnServed(own, qld, T, pos0, nh, nkv, hd, tc.window, func(g, pq int) ([]float32, []float32) {
				kv := served[[2]int{g, pq}]
				return kv[0], kv[1]
			})
			wstart := max(sink, pos0-ring) // hi = pos0
			nsplit := (n + tc.splitLen - 1) / tc.splitLen
			for _, MG := range []int{1, 2, 4, 8} {
				partO := make([]float32, T*nh*nsplit*2*hd)
				partML := make([]float32, T*nh*nsplit*2)
				pc.attnSplit(MG, partO, partML, own, qld, nh, T, pos0, wstart, recent, tc.window, nsplit, tc.splitLen, float32(1/math.Sqrt(hd)), true)
				out := make([]float32, T*nh*hd)
				attnMergePort(out, nh*hd, partO, partML, rot.V[0], nh, hd, nsplit, T)
				worst := 0.0
				for i, w := range want {
					worst = max(worst, math.Abs(w-float64(out[i])))
				}
				if worst > 2e-5 {
					t.Errorf("%s T=%d window=%d split=%d MG=%d: worst |Δ| %.3g, want ≤ 2e-5", mc.method, T, tc.window, tc.splitLen, MG, worst)
				}
			}
		}
	}
}

// TestKernelPortFP16: the fp16 cache layout (no sink, ring = capacity,
// no codes) through the kv_append and attention ports for 2 sequences: a
// first call appends P tokens, a second call of T tokens attends to them
// as their binary16 rounding and to its own tokens as their float32 rows;
// against a float64 softmax attention over those rows, to 2e-5.
func TestKernelPortFP16(t *testing.T) {
	r := rand.New(rand.NewPCG(41, 42))
	const B, nh, nkv, hd, P, T = 2, 4, 4, 8, 15, 25
	const n = P + T
	pc := newPortCache(B, nkv, hd, 0, n, 0)
	kvDim := nkv * hd
	ld := nh*hd + 2*kvDim
	first := randVec(r, B*P*ld, 1) // qkv rows of the first call per (sequence, token)
	pc.kvAppend(first, ld, nh*hd, nh*hd+kvDim, P, 0, false)
	rows := randVec(r, B*T*ld, 1) // the second call's
	const splitLen = 16
	nsplit := (n + splitLen - 1) / splitLen
	partO := make([]float32, B*T*nh*nsplit*2*hd)
	partML := make([]float32, B*T*nh*nsplit*2)
	pc.attnSplit(1, partO, partML, rows, ld, nh, T, P, 0, 0, 0, nsplit, splitLen, float32(1/math.Sqrt(hd)), false)
	out := make([]float32, B*T*nh*hd)
	attnMergePort(out, nh*hd, partO, partML, nil, nh, hd, nsplit, B*T)
	worst := 0.0
	for b := 0; b < B; b++ {
		want := refAttnServed(rows[b*T*ld:], ld, T, P, nh, nkv, hd, 0, func(g, _ int) ([]float32, []float32) {
			K, V := make([]float32, P*hd), make([]float32, P*hd)
			for p := 0; p < P; p++ {
				for j := 0; j < hd; j++ {
					K[p*hd+j] = round16(first[(b*P+p)*ld+nh*hd+g*hd+j])
					V[p*hd+j] = round16(first[(b*P+p)*ld+nh*hd+kvDim+g*hd+j])
				}
			}
			return K, V
		})
		for i, w := range want {
			worst = max(worst, math.Abs(w-float64(out[b*T*nh*hd+i])))
		}
	}
	if worst > 2e-5 {
		t.Errorf("worst |Δ| %.3g, want ≤ 2e-5", worst)
	}
}

// qvalPort ports common.cuh's qval (qgemv.cu, moe.cu): fmaf(s, code, −s·z) with s·z rounded
// to float32 (exact: two binary16 significands) and the fma's one
// rounding (the float64 sum s·code − s·z is exact: at most 43 bits).
func qvalPort(s float32, code uint32, sz float32) float32 {
	return float32(float64(s)*float64(code) - float64(sz))
}

// gemvQPort ports gemv_q's dequantization for one output row n: the
// chunks of 8 codes read as `bits` little-endian bytes, then the tail
// through get_code. It returns Ŵ[n, :] in storage order.
func gemvQPort(codes []byte, scales, zeros []uint16, n, K, bits, group int) []float32 {
	rb := (K*bits + 7) / 8
	G := K / group
	row := codes[n*rb:]
	out := make([]float32, K)
	zsym := float32(int(1) << (bits - 1))
	mask := uint32(1)<<bits - 1
	nc := K / 8
	for c := 0; c < nc; c++ {
		var w uint64
		for i := 0; i < bits; i++ {
			w |= uint64(row[c*bits+i]) << (8 * i)
		}
		j0 := c * 8
		g := j0 / group
		s := kvq.F16ToFloat32(scales[n*G+g])
		z := zsym
		if zeros != nil {
			z = kvq.F16ToFloat32(zeros[n*G+g])
		}
		for i := 0; i < 8; i++ {
			out[j0+i] = qvalPort(s, uint32(w>>(i*bits))&mask, s*z)
		}
	}
	for j := nc * 8; j < K; j++ {
		g := j / group
		s := kvq.F16ToFloat32(scales[n*G+g])
		z := zsym
		if zeros != nil {
			z = kvq.F16ToFloat32(zeros[n*G+g])
		}
		out[j] = qvalPort(s, getCodePort(row, j, bits, rb), s*z)
	}
	return out
}

// getCodePort ports qgemv.cu's get_code.
func getCodePort(row []byte, j, bits, rb int) uint32 {
	p := j * bits
	b, off := p>>3, p&7
	w := uint32(row[b])
	if off+bits > 8 && b+1 < rb {
		w |= uint32(row[b+1]) << 8
	}
	return w >> off & (uint32(1)<<bits - 1)
}

// gemvQKernelPort ports gemv_q over its whole grid ((N+3)/4, (M+3)/4) of
// 128-thread blocks: each warp's lanes accumulate their chunks of 8 codes
// and tail columns (x gathered through perm when non-nil), then the
// butterfly warp_sum. y [M, N] (stride ldy), beta = 1 adds.
func gemvQKernelPort(y []float32, ldy int, x []float32, ldx int, codes []byte, scales, zeros []uint16, perm []int32, M, N, K, bits, group, beta int) {
	for bx := 0; bx < (N+3)/4; bx++ {
		for by := 0; by < (M+3)/4; by++ {
			for warp := 0; warp < 4; warp++ {
				n, m0 := bx*4+warp, by*4
				if n >= N {
					continue
				}
				mc := min(4, M-m0)
				rb := (K*bits + 7) / 8
				G := K / group
				row := codes[n*rb:]
				sc := scales[n*G:]
				var zp []uint16
				if zeros != nil {
					zp = zeros[n*G:]
				}
				zsym := float32(int(1) << (bits - 1))
				mask := uint32(1)<<bits - 1
				var acc [32][4]float32
				nc := K / 8
				for lane := 0; lane < 32; lane++ {
					a := &acc[lane]
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
							wv := qvalPort(s, uint32(w>>(i*bits))&mask, s*z)
							xj := j0 + i
							if perm != nil {
								xj = int(perm[j0+i])
							}
							for m := 0; m < mc; m++ {
								a[m] += wv * x[(m0+m)*ldx+xj]
							}
						}
					}
					for j := nc*8 + lane; j < K; j += 32 {
						g := j / group
						s := kvq.F16ToFloat32(sc[g])
						z := zsym
						if zp != nil {
							z = kvq.F16ToFloat32(zp[g])
						}
						wv := qvalPort(s, getCodePort(row, j, bits, rb), s*z)
						xj := j
						if perm != nil {
							xj = int(perm[j])
						}
						for m := 0; m < mc; m++ {
							a[m] += wv * x[(m0+m)*ldx+xj]
						}
					}
				}
				for m := 0; m < mc; m++ {
					var v [32]float32
					for lane := range v {
						v[lane] = acc[lane][m]
					}
					for o := 16; o > 0; o >>= 1 { // warp_sum
						var u [32]float32
						for lane := range u {
							u[lane] = v[lane] + v[lane^o]
						}
						v = u
					}
					o := &y[(m0+m)*ldy+n]
					if beta != 0 {
						*o += v[0]
					} else {
						*o = v[0]
					}
				}
			}
		}
	}
}

// randPerm returns a random permutation of [0, n) that is not its own
// inverse (so a kernel applying the inverse is caught) and its inverse.
func randPerm(r *rand.Rand, n int) (perm, inv []int32) {
	for {
		perm, inv = make([]int32, n), make([]int32, n)
		for j, v := range r.Perm(n) {
			perm[j] = int32(v)
			inv[v] = int32(j)
		}
		if !slices.Equal(perm, inv) {
			return perm, inv
		}
	}
}

// qCase is one packed format of the quantized-kernel ports.
type qCase struct {
	bits, K, group int
	sym            bool
}

// qTestCases are the packed formats the quantized-kernel ports cover:
// every width, groups 32 and 64 and per channel (K = 100: a tail of 4
// codes after the chunks of 8), symmetric and not (1 bit asymmetric only).
func qTestCases() []qCase {
	var cs []qCase
	for _, bits := range []int{1, 2, 3, 4, 8} {
		for _, tc := range []struct{ K, group int }{{192, 32}, {192, 64}, {100, 0}, {96, 0}} {
			for _, sym := range []bool{false, true} {
				if !(sym && bits == 1) {
					cs = append(cs, qCase{bits, tc.K, tc.group, sym})
				}
			}
		}
	}
	return cs
}

// TestKernelPortQGemv: gemv_q's decoding of quantize/weights' packed rows
// equals Quantized.Dequantize (storage order, no permutation) exactly
// (qval's fma is correctly rounded, like Dequantize's float64 product),
// for 1, 2, 3, 4 and 8 bits, groups 32 and 64 and per channel with a K
// that is not a multiple of 8.
func TestKernelPortQGemv(t *testing.T) {
	r := rand.New(rand.NewPCG(51, 52))
	for _, c := range qTestCases() {
		bits, K, group, sym := c.bits, c.K, c.group, c.sym
		const N = 5
		w := randVec(r, N*K, 0.05)
		q, err := weights.QuantizeRTN(w, N, K, weights.Options{Bits: bits, GroupSize: group, Symmetric: sym})
		if err != nil {
			t.Fatal(err)
		}
		deq := make([]float32, N*K)
		q.Dequantize(deq)
		for n := 0; n < N; n++ {
			got := gemvQPort(q.Codes, q.Scales, q.Zeros, n, K, bits, q.GroupSize)
			for j, v := range got {
				if v != deq[n*K+j] {
					t.Fatalf("bits %d K %d group %d sym %v: row %d col %d: %v, Dequantize %v", bits, K, group, sym, n, j, v, deq[n*K+j])
				}
			}
		}
	}
}

// TestKernelPortQGemvAlgebra: qval is exact where the plain float32
// s·(code − z) is not: a 1-bit group with the zero-point −3·2⁻²⁴ (a
// binary16 subnormal; 1 − z needs 25 bits and rounds in float32) and
// scale 0.75 still equals Dequantize, and the plain form does not.
func TestKernelPortQGemvAlgebra(t *testing.T) {
	s, z := kvq.F16FromFloat32(0.75), kvq.F16FromFloat32(-3*0x1p-24)
	sf, zf := kvq.F16ToFloat32(s), kvq.F16ToFloat32(z)
	if zf != -3*0x1p-24 {
		t.Fatalf("z = %g, want −3·2⁻²⁴", zf)
	}
	q := &weights.Quantized{Rows: 1, Cols: 8, Bits: 1, GroupSize: 8, Codes: []byte{0x5a}, Scales: []uint16{s}, Zeros: []uint16{z}}
	deq := make([]float32, 8)
	q.Dequantize(deq)
	got := gemvQPort(q.Codes, q.Scales, q.Zeros, 0, 8, 1, 8)
	if !slices.Equal(got, deq) {
		t.Fatalf("qval row %v, Dequantize %v", got, deq)
	}
	if naive := sf * (1 - zf); naive == deq[1] {
		t.Errorf("float32 s·(1 − z) = %v equals Dequantize's %v: the case does not exercise qval's exactness", naive, deq[1])
	}
}

// TestKernelPortQGemvPerm: the whole gemv_q (grid, lanes, warp_sum) on
// weights with and without an act-order permutation (storage column j
// holding input column perm[j], weights.Quantized.Perm) against the
// float64 product x·Ŵᵀ of Quantized.Dequantize's Ŵ (original column
// order), for every format of qTestCases and M = 6 rows of x (two row
// blocks, the second partial), beta 0 and 1; tolerance 1e-5·Σ|x·ŵ|. The
// same launch with the permutation ignored or inverted must miss by more
// than 100× the tolerance (the test can tell the conventions apart). One
// weight comes from GPTQ --act-order (weights.QuantizeGPTQ), the others
// from RTN codes given a random permutation.
func TestKernelPortQGemvPerm(t *testing.T) {
	r := rand.New(rand.NewPCG(55, 56))
	const N, M = 7, 6
	check := func(what string, q *weights.Quantized, perm, inv []int32) {
		K := q.Cols
		deq := make([]float32, N*K)
		q.Dequantize(deq)
		x := randVec(r, M*K, 1)
		y0 := randVec(r, M*N, 1)
		errOf := func(p []int32, beta int) float64 {
			y := slices.Clone(y0)
			gemvQKernelPort(y, N, x, K, q.Codes, q.Scales, q.Zeros, p, M, N, K, q.Bits, q.GroupSize, beta)
			worst := 0.0
			for i := 0; i < M; i++ {
				for n := 0; n < N; n++ {
					var s, a float64
					for c := 0; c < K; c++ {
						p := float64(x[i*K+c]) * float64(deq[n*K+c])
						s += p
						a += math.Abs(p)
					}
					if beta != 0 {
						s += float64(y0[i*N+n])
						a += math.Abs(float64(y0[i*N+n]))
					}
					worst = max(worst, math.Abs(float64(y[i*N+n])-s)/(a+1e-12))
				}
			}
			return worst
		}
		for _, beta := range []int{0, 1} {
			if e := errOf(perm, beta); e > 1e-5 {
				t.Errorf("%s beta %d: worst error %.3g of Σ|x·ŵ|, want ≤ 1e-5", what, beta, e)
			}
		}
		if perm == nil {
			return
		}
		if e := errOf(nil, 0); e < 1e-3 {
			t.Errorf("%s: permutation ignored: error %.3g, want > 1e-3 (the test cannot see a missing perm)", what, e)
		}
		if e := errOf(inv, 0); e < 1e-3 {
			t.Errorf("%s: permutation inverted: error %.3g, want > 1e-3 (the test cannot see an inverted perm)", what, e)
		}
	}
	for _, c := range qTestCases() {
		bits, K, group, sym := c.bits, c.K, c.group, c.sym
		w := randVec(r, N*K, 0.05)
		q, err := weights.QuantizeRTN(w, N, K, weights.Options{Bits: bits, GroupSize: group, Symmetric: sym})
		if err != nil {
			t.Fatal(err)
		}
		what := fmt.Sprintf("bits %d K %d group %d sym %v", bits, K, group, sym)
		check(what, q, nil, nil)
		perm, inv := randPerm(r, K)
		q.Perm = perm
		check(what+" perm", q, perm, inv)
	}
	q := gptqActOrder(t, r, N, 128, 4, 32)
	check("GPTQ act-order 4-bit group 32", q, q.Perm, invPerm(q.Perm))
}

// invPerm returns the inverse of perm.
func invPerm(perm []int32) []int32 {
	inv := make([]int32, len(perm))
	for j, c := range perm {
		inv[c] = int32(j)
	}
	return inv
}

// gptqActOrder quantizes a random [rows, cols] weight with GPTQ
// --act-order on the Hessian of random activations whose column scales
// vary (so the order is far from the identity), and checks that it has
// a permutation that is not its own inverse.
func gptqActOrder(t *testing.T, r *rand.Rand, rows, cols, bits, group int) *weights.Quantized {
	t.Helper()
	const n = 256
	x := randVec(r, n*cols, 1)
	for i := range x {
		x[i] *= float32(1+(i%cols*37)%cols) / float32(cols)
	}
	h := weights.NewHessian(cols)
	if err := h.Add(x, n); err != nil {
		t.Fatal(err)
	}
	q, err := weights.QuantizeGPTQ(randVec(r, rows*cols, 0.05), rows, cols, h, weights.GPTQOptions{Options: weights.Options{Bits: bits, GroupSize: group}, ActOrder: true, Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	if q.Perm == nil || slices.Equal(q.Perm, invPerm(q.Perm)) {
		t.Fatalf("GPTQ act-order: perm %v, want one that is not its own inverse", q.Perm)
	}
	return q
}

// moeGemvPort ports moe_gemv over the whole grid moeGemvGrid(T, K, N)
// with blocks of 128 threads (4 warps of 32 lanes, each lane's partial
// sum then the warp's sum).
func moeGemvPort(y []float32, ldy int, x []float32, ldx, xsel int, w []uint16, sel []int32, T, K, N, Kd int) {
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
				wr := w[(int(sel[r])*N+n)*Kd:]
				var part [32]float32
				for lane := 0; lane < 32; lane++ {
					for k := lane; k < Kd; k += 32 {
						part[lane] += kvq.F16ToFloat32(wr[k]) * x[xr*ldx+k]
					}
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

// TestKernelPortMoEGemv: the moe_gemv port over its grid computes
// y[t·K+k, n] = x_t · W[sel[t,k], n, :] for every pair (against a float64
// product, to 1e-5), and the grid of top-8 routing for 9000 tokens (R·K
// = 72000 pairs, past grid.y's 65535) passes CUDA's launch limits.
func TestKernelPortMoEGemv(t *testing.T) {
	r := rand.New(rand.NewPCG(51, 52))
	const T, K, E, N, Kd = 5, 3, 4, 13, 70
	w := make([]uint16, E*N*Kd)
	for i := range w {
		w[i] = kvq.F16FromFloat32(float32(r.NormFloat64()))
	}
	x := randVec(r, T*Kd, 1)
	sel := make([]int32, T*K)
	for i := range sel {
		sel[i] = int32(r.IntN(E))
	}
	y := make([]float32, T*K*N)
	moeGemvPort(y, N, x, Kd, 0, w, sel, T, K, N, Kd)
	worst := 0.0
	for t := 0; t < T; t++ {
		for k := 0; k < K; k++ {
			p := t*K + k
			for n := 0; n < N; n++ {
				var want float64
				for j := 0; j < Kd; j++ {
					want += float64(kvq.F16ToFloat32(w[(int(sel[p])*N+n)*Kd+j])) * float64(x[t*Kd+j])
				}
				worst = max(worst, math.Abs(want-float64(y[p*N+n])))
			}
		}
	}
	if worst > 1e-5 {
		t.Errorf("worst |Δ| %.3g, want ≤ 1e-5", worst)
	}
	for _, n := range []int{2 * 1408, 2048} {
		if err := checkLaunchDims("moe_gemv", moeGemvGrid(9000, 8, n), Dim{128, 1, 1}, 0); err != nil {
			t.Errorf("top-8 of 9000 tokens, N = %d: %v", n, err)
		}
	}
	if err := checkLaunchDims("moe_gemv", Dim{(2048 + 3) / 4, 9000 * 8, 1}, Dim{128, 1, 1}, 0); err == nil {
		t.Errorf("the old layout (pairs on grid.y) passed the launch check; the check misses grid.y > 65535")
	}
}

// TestLaunchChecks: launch arguments of Go type int outside int32 and
// grids past CUDA's limits are refused before reaching the driver.
func TestLaunchChecks(t *testing.T) {
	m := &Module{fns: map[string]uintptr{"k": 1}}
	if err := m.launch(false, "k", Dim{1, 1, 1}, Dim{32, 1, 1}, 0, 1<<31); err == nil || !strings.Contains(err.Error(), "argument 0") {
		t.Errorf("int 2³¹: err = %v, want a range error naming argument 0", err)
	}
	if err := m.launch(false, "k", Dim{1, 1, 1}, Dim{32, 1, 1}, 0, DevPtr(1), -1<<31-1); err == nil || !strings.Contains(err.Error(), "argument 1") {
		t.Errorf("int −2³¹−1: err = %v, want a range error naming argument 1", err)
	}
	for _, tc := range []struct {
		grid, block Dim
		ok          bool
	}{
		{Dim{1 << 31, 1, 1}, Dim{1, 1, 1}, false}, {Dim{1<<31 - 1, 65535, 65535}, Dim{1024, 1, 1}, true},
		{Dim{1, 65536, 1}, Dim{1, 1, 1}, false}, {Dim{1, 1, 65536}, Dim{1, 1, 1}, false},
		{Dim{1, 1, 1}, Dim{32, 33, 1}, false}, {Dim{0, 1, 1}, Dim{1, 1, 1}, false},
	} {
		if err := checkLaunchDims("k", tc.grid, tc.block, 0); (err == nil) != tc.ok {
			t.Errorf("grid %v block %v: err = %v, want ok %v", tc.grid, tc.block, err, tc.ok)
		}
	}
}

// TestKernelPortClipTau: kv_append's τ (port) equals kvq.Clip's for rows
// with ties, ±Inf and NaN entries at every clip index, and rows holding
// NaN still get a τ (kvq.Clip ranks |NaN| as +Inf).
func TestKernelPortClipTau(t *testing.T) {
	r := rand.New(rand.NewPCG(71, 72))
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	const hd = 16
	for trial := 0; trial < 200; trial++ {
		y := randVec(r, hd, 1)
		switch trial % 4 {
		case 1:
			y[r.IntN(hd)] = nan
		case 2:
			y[r.IntN(hd)], y[r.IntN(hd)] = nan, -inf
		case 3:
			for j := range y {
				y[j] = float32(r.IntN(3) - 1) // ties
			}
			y[r.IntN(hd)] = nan
		}
		for _, ratio := range []float64{0.05, 0.5, 0.8, 0.9, 0.99} {
			k := clipIndex(ratio, hd)
			got, want := clipTauPort(y, k), kvq.Clip(y, ratio)
			if got != want && !(got != got && want != want) {
				t.Fatalf("row %v ratio %g (k=%d): τ %g, kvq.Clip %g", y, ratio, k, got, want)
			}
		}
	}
	// All NaN: every |y| ranks +Inf, τ = +Inf.
	y := []float32{nan, nan, nan, nan}
	if got := clipTauPort(y, 2); !math.IsInf(float64(got), 1) {
		t.Errorf("all-NaN row: τ %g, want +Inf", got)
	}
}

// dequantQPort ports dequant_q over its grid (N, ⌈K/256⌉) of 256-thread
// blocks: w [N, K] binary16 bits, output column c from storage column
// iperm[c] (iperm nil: c).
func dequantQPort(codes []byte, scales, zeros []uint16, iperm []int32, N, K, bits, group int) []uint16 {
	w := make([]uint16, N*K)
	for bx := 0; bx < N; bx++ {
		for by := 0; by < (K+255)/256; by++ {
			for tid := 0; tid < 256; tid++ {
				n, c := bx, by*256+tid
				if n >= N || c >= K {
					continue
				}
				j := c
				if iperm != nil {
					j = int(iperm[c])
				}
				rb := (K*bits + 7) / 8
				G, g := K/group, j/group
				s := kvq.F16ToFloat32(scales[n*G+g])
				z := float32(int(1) << (bits - 1))
				if zeros != nil {
					z = kvq.F16ToFloat32(zeros[n*G+g])
				}
				w[n*K+c] = kvq.F16FromFloat32(qvalPort(s, getCodePort(codes[n*rb:], j, bits, rb), s*z))
			}
		}
	}
	return w
}

// TestKernelPortDequantQ: dequant_q's binary16 output is exactly
// Quantized.Dequantize (original column order) rounded to binary16, for
// every format of qTestCases (K = 100 and 192: partial 256-thread
// blocks), with and without an act-order permutation (dequant_q given
// its inverse), and for a GPTQ --act-order weight. With the permutation
// ignored, or the permutation passed where its inverse belongs, most
// elements must differ (the test sees either mistake).
func TestKernelPortDequantQ(t *testing.T) {
	r := rand.New(rand.NewPCG(53, 54))
	const N = 6
	check := func(what string, q *weights.Quantized) {
		K := q.Cols
		deq := make([]float32, N*K)
		q.Dequantize(deq)
		var iperm []int32
		if q.Perm != nil {
			iperm = invPerm(q.Perm)
		}
		mismatches := func(ip []int32) int {
			bad := 0
			for i, h := range dequantQPort(q.Codes, q.Scales, q.Zeros, ip, N, K, q.Bits, q.GroupSize) {
				if h != kvq.F16FromFloat32(deq[i]) {
					bad++
				}
			}
			return bad
		}
		got := dequantQPort(q.Codes, q.Scales, q.Zeros, iperm, N, K, q.Bits, q.GroupSize)
		for i, h := range got {
			if want := kvq.F16FromFloat32(deq[i]); h != want {
				t.Fatalf("%s: element [%d, %d]: %#04x (%v), want %#04x (%v)", what, i/K, i%K, h, kvq.F16ToFloat32(h), want, deq[i])
			}
		}
		if q.Perm == nil {
			return
		}
		// At 1 bit two codes take only two values per group: a wrong
		// column still matches about half the time.
		if bad := mismatches(nil); bad < N*K/4 {
			t.Errorf("%s: permutation ignored: %d of %d elements differ, want ≥ %d", what, bad, N*K, N*K/4)
		}
		if bad := mismatches(q.Perm); bad < N*K/4 {
			t.Errorf("%s: permutation instead of its inverse: %d of %d elements differ, want ≥ %d", what, bad, N*K, N*K/4)
		}
	}
	for _, c := range qTestCases() {
		w := randVec(r, N*c.K, 0.05)
		q, err := weights.QuantizeRTN(w, N, c.K, weights.Options{Bits: c.bits, GroupSize: c.group, Symmetric: c.sym})
		if err != nil {
			t.Fatal(err)
		}
		what := fmt.Sprintf("bits %d K %d group %d sym %v", c.bits, c.K, c.group, c.sym)
		check(what, q)
		q.Perm, _ = randPerm(r, c.K)
		check(what+" perm", q)
	}
	check("GPTQ act-order 4-bit group 32", gptqActOrder(t, r, N, 128, 4, 32))
}

// TestPackable: which quantized weights stay packed on the device.
func TestPackable(t *testing.T) {
	q4 := arch.TensorQuant{Bits: 4, GroupSize: 32}
	q := &arch.Quantization{Tensors: map[string]arch.TensorQuant{
		"a": q4, "b": q4, "c": {Bits: 4, GroupSize: 64}, "p": {Bits: 4, GroupSize: 32, Perm: true}, "p2": {Bits: 4, GroupSize: 32, Perm: true},
		"one": {Bits: 1, GroupSize: 32}, "g12": {Bits: 4, GroupSize: 12}, "pc": {Bits: 3, GroupSize: 100},
	}}
	for _, tc := range []struct {
		names []string
		cols  int
		want  bool
	}{
		{[]string{"a"}, 64, true},
		{[]string{"a", "b"}, 64, true},
		{[]string{"a", "c"}, 64, false},     // different groups: not stackable
		{[]string{"a", "float"}, 64, false}, // one part not quantized
		{[]string{"float"}, 64, false},
		{[]string{"p"}, 64, true},         // act-order: perm on the device
		{[]string{"p", "p2"}, 64, true},   // same flags (linear compares the perms)
		{[]string{"a", "p"}, 64, false},   // one permuted, one not
		{[]string{"one"}, 64, true},       // 1-bit
		{[]string{"one", "a"}, 64, false}, // different widths
		{[]string{"g12"}, 48, false},      // group not a multiple of 8
		{[]string{"pc"}, 100, true},       // per channel, K not a multiple of 8
	} {
		if _, ok := packable(q, tc.names, tc.cols); ok != tc.want {
			t.Errorf("packable(%v, %d) = %v, want %v", tc.names, tc.cols, ok, tc.want)
		}
	}
	if _, ok := packable(nil, []string{"a"}, 64); ok {
		t.Error("packable without a quantization block")
	}
	// qMaxAbs: scale 2, zero 1 at 2 bits: |code − zero| ≤ 2 → 4; symmetric
	// 3 bits, scale 0.5, zero 4: ≤ 4 → 2.
	if got := qMaxAbs([]uint16{kvq.F16FromFloat32(1), kvq.F16FromFloat32(2)}, []uint16{kvq.F16FromFloat32(0), kvq.F16FromFloat32(1)}, 2); got != 4 {
		t.Errorf("qMaxAbs asymmetric = %v, want 4", got)
	}
	if got := qMaxAbs([]uint16{kvq.F16FromFloat32(0.5)}, nil, 3); got != 2 {
		t.Errorf("qMaxAbs symmetric = %v, want 2", got)
	}
	// 1 bit, fractional zero-points: scale 2, zero −0.5 → levels 1 and 3;
	// scale 1, zero 1.75 → levels −1.75 and −0.75. Max |Ŵ| 3.
	if got := qMaxAbs([]uint16{kvq.F16FromFloat32(2), kvq.F16FromFloat32(1)}, []uint16{kvq.F16FromFloat32(-0.5), kvq.F16FromFloat32(1.75)}, 1); got != 3 {
		t.Errorf("qMaxAbs 1-bit = %v, want 3", got)
	}
}
