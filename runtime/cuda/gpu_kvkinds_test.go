package cuda

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/runtime"
	"github.com/lmpack/lmpack/runtime/kvcache"
)

// TestGPUAttentionKVKinds: the device caches int8, int4, q8_0, q4_0 and
// fp8 (sink 4, recent 32) hold n − T earlier binary16 tokens written by
// host Write (kv_append); every row DeviceCache.Read serves equals the
// same kvcache method's row for the same input within kvRowTol (0, exact
// codes, for int8, int4, fp8 and the unrotated q8_0/q4_0 at head_dim 96;
// one code step for the Hadamard-rotated q8_0/q4_0 at 128, whose rotation
// is a float32 matrix product on the device and kvq.FWHT in kvcache). Then attn_split + attn_merge for calls of T = 1, 5
// and 60 queries (own keys and values in their qkv rows), windows 0 and
// 40 (reaching into the quantized region), split lengths 128 and 512,
// MG 1 and 8, against refAttnServed over the rows Read serves each query,
// to 1e-4·(1+|ref|) (TestGPUAttentionOscar2's bound: the port's 2e-5
// plus float32 sums over up to 264 dequantized rows). The served rows
// come from one download of the buffers (servedViews, Read's layout). Head dims 128 (q8_0
// and q4_0 K rotated in one block of 128, V in two of 64), 96 (no
// rotation) and, for the kinds without blocks, 36 (int4 rows of 18
// bytes, read byte by byte).
func TestGPUAttentionKVKinds(t *testing.T) {
	d, k := gpuOrSkip(t)
	r := rand.New(rand.NewPCG(121, 122))
	const n, sink, recent = 300, 4, 32
	for _, kc := range kvKindCases {
		shapes := []struct{ nh, nkv, hd int }{{16, 2, 128}, {6, 2, 96}, {6, 3, 36}}
		if kc.kind == kvQ8_0 || kc.kind == kvQ4_0 {
			shapes = shapes[:2]
		}
		for _, sh := range shapes {
			nh, nkv, hd := sh.nh, sh.nkv, sh.hd
			m := attnModel(t, d, k, nh, nkv, hd)
			kvdim := nkv * hd
			for _, T := range []int{1, 5, 60} {
				name := fmt.Sprintf("%s nh %d nkv %d hd %d T %d", kc.name, nh, nkv, hd, T)
				pos0 := n - T
				c, err := m.NewDeviceCache(n+4, CacheOptions{Method: kc.name, Sink: sink, Recent: recent})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { c.Free() })
				K0, V0 := randVec(r, pos0*kvdim, 1), randVec(r, pos0*kvdim, 1)
				for i := range K0 {
					K0[i], V0[i] = round16(K0[i]), round16(V0[i])
				}
				for p := 0; p < pos0; p++ {
					K0[p*kvdim+3] *= 8 // an outlier channel
				}
				c.Write(0, 0, pos0, K0, V0)
				c.Commit(pos0)
				cc, err := kvcache.New(kc.name, []kvcache.Layer{{NumKVHeads: nkv, HeadDim: hd}}, n+4, kvcache.Options{Sink: sink, Recent: recent})
				if err != nil {
					t.Fatal(err)
				}
				cc.Write(0, 0, pos0, K0, V0)
				cc.Commit(pos0)
				for g := 0; g < nkv; g++ {
					Kg, Vg := make([]float32, pos0*hd), make([]float32, pos0*hd)
					Kc, Vc := make([]float32, pos0*hd), make([]float32, pos0*hd)
					c.Read(0, g, pos0, Kg, Vg)
					cc.Read(0, g, pos0, Kc, Vc)
					for side, pair := range [][2][]float32{{Kg, Kc}, {Vg, Vc}} {
						X := K0
						if side == 1 {
							X = V0
						}
						for p := 0; p < pos0; p++ {
							tol := kvRowTol(kc.kind, hd, X[p*kvdim+g*hd:][:hd])
							for j := 0; j < hd; j++ {
								a, b := pair[0][p*hd+j], pair[1][p*hd+j]
								if dd := math.Abs(float64(a - b)); dd > tol || a != a {
									t.Fatalf("%s: side %d head %d position %d column %d: device %.6g, kvcache %.6g (|Δ| %.3g > %.3g)", name, side, g, p, j, a, b, dd, tol)
								}
							}
						}
					}
				}
				wstart := c.quantFloor()
				if wstart != sink {
					t.Fatalf("%s: quantized floor %d, want the sink %d", name, wstart, sink)
				}
				served := servedViews(t, d, c, pos0, n)
				qld := nh*hd + 2*kvdim
				q := randVec(r, T*qld, 1)
				qp := devBuf(t, d, q)
				for _, window := range []int{0, 40} {
					want := refAttnServed(q, qld, T, pos0, nh, nkv, hd, window, func(g, pq int) ([]float32, []float32) {
						kv := served[[2]int{g, pq}]
						return kv[0], kv[1]
					})
					for _, splitLen := range []int{128, 512} {
						for _, MG := range []int{1, 8} {
							got := attnCase(t, d, k, c, qp, qld, 1, T, pos0, wstart, window, nh, MG, splitLen)
							checkAttn(t, fmt.Sprintf("%s window %d split %d MG %d", name, window, splitLen, MG), got, want, 1e-4)
						}
					}
				}
			}
		}
	}
}

// servedViews returns, for each kv head g of layer 0 of device cache c
// (one sequence) and each query position pq in [pos0, n), the keys and
// values [pos0, hd] of the earlier positions as DeviceCache.Read serves
// them to a cache of pq+1 tokens (servedFromHost), from one download of
// each buffer instead of a Read per query.
func servedViews(t *testing.T, d *Device, c *DeviceCache, pos0, n int) map[[2]int][2][]float32 {
	t.Helper()
	L := &c.layers[0]
	nkv, hd := L.nkv, L.hd
	hb := hostKV{nkv: nkv, hd: hd, rb: L.rb, sink: c.sink, ring: c.ring, capQ: c.capQ, kind: c.kind, bits: c.bits, windowStart: c.windowStart}
	for i, x := range []struct {
		sink, ring, codes, par DevPtr
		r                      []float32
	}{{L.sinkK, L.ringK, L.codesK, L.parK, L.hostRK}, {L.sinkV, L.ringV, L.codesV, L.parV, L.hostRV}} {
		if c.sink > 0 {
			hb.sinkR[i] = download[uint16](t, d, x.sink, nkv*c.sink*hd)
		}
		hb.ringR[i] = download[uint16](t, d, x.ring, nkv*c.ring*hd)
		hb.codes[i] = download[byte](t, d, x.codes, nkv*c.capQ*L.rb)
		if c.kind == kvASYM {
			hb.par[i] = download[uint16](t, d, x.par, nkv*c.capQ*2)
		}
		hb.r[i] = x.r
	}
	return hb.served(pos0, n)
}

// TestGPUKVKindsModel: a synthetic Llama (2 layers, hidden 256, 4 heads
// over 2 kv heads of head_dim 64, binary16 weights on both sides) on the
// GPU with each device KV kind (int8, int4, q8_0, q4_0, fp8, and oscar4
// with random rotations and ClipK4/ClipV4 0.98/0.96; sink 4, recent 16)
// against the CPU backend with the same kvcache method, over
// 96 tokens fed one at a time (so both quantize the same binary16 rows
// from their fp16 windows). Tolerances relative to max |logit| M: max
// |Δ| 0.17·M, mean 0.0042·M, argmax agreement 0.97: TestGPUStories260KOscar2's
// gpuOscarMaxTol and gpuOscarMeanTol over its logits' scale (about 24),
// since here too float32 rounding differences flip a code now and then
// and the flip persists; these kinds' code steps are at most INT2's. A
// kernel error (scale, block, rotation, window) moves every position.
func TestGPUKVKindsModel(t *testing.T) {
	gpuOrSkip(t)
	desc, src := syntheticModelOpts(t, synthOpts{Layers: 2, Hidden: 256, Heads: 4, KVHeads: 2, HeadDim: 64, Inter: 384, Vocab: 512}, 131)
	ctx := context.Background()
	cpu, err := runtime.NewCPU().Load(ctx, desc, src, runtime.LoadOptions{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer cpu.Close()
	g, err := (Backend{CacheDir: testCacheDir(t)}).Load(ctx, desc, src, runtime.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	r := rand.New(rand.NewPCG(131, 99))
	toks := make([]int, 96)
	for i := range toks {
		toks[i] = r.IntN(desc.VocabSize)
	}
	V := desc.VocabSize
	rot := randRotations(rand.New(rand.NewPCG(131, 100)), desc)
	for range desc.Layers {
		rot.ClipK4, rot.ClipV4 = append(rot.ClipK4, 0.98), append(rot.ClipV4, 0.96)
	}
	for _, kc := range append(kvKindCases, kvKindCase{"oscar4", kvASYM, 4}) {
		var kr *kvcache.Rotations
		if kc.name == "oscar4" {
			kr = rot
		}
		cc, err := kvcache.New(kc.name, kvcache.LayersOf(desc), len(toks), kvcache.Options{Sink: 4, Recent: 16, Rotations: kr})
		if err != nil {
			t.Fatal(err)
		}
		gc, err := g.(*Model).NewDeviceCache(len(toks), CacheOptions{Method: kc.name, Sink: 4, Recent: 16, Rotations: kr})
		if err != nil {
			t.Fatal(err)
		}
		a := runLogits(t, cpu, cc, toks, 1, V)
		b := runLogits(t, g, gc, toks, 1, V)
		gc.Free()
		M := maxAbs(a)
		checkLogits(t, "synthetic llama "+kc.name+" KV", a, b, V, 0.17*M, 0.0042*M)
	}
}

// TestDeviceKVRefusals: NewDeviceCache refuses the kvcache methods the
// device does not run, naming the method and the ones it takes, and
// q8_0/q4_0 at a head_dim that is not a multiple of 32 naming the layer
// (no device needed: the checks come before any allocation).
func TestDeviceKVRefusals(t *testing.T) {
	m := &Model{layers: []layerW{{nh: 2, nkv: 1, hd: 40}}}
	for _, meth := range []string{"kivi2", "quarot2", "oscar-mixed", "turboquant_k8v4", "int4_per_token_head", "int2-naive"} {
		_, err := m.NewDeviceCache(8, CacheOptions{Method: meth})
		if err == nil || !containsAll(err.Error(), fmt.Sprintf("%q", meth), "fp16, fp8, int4, int8, oscar2, oscar4, q4_0, q8_0") {
			t.Errorf("method %s: error %v, want one naming it and the device's methods", meth, err)
		}
	}
	for _, meth := range []string{"q8_0", "q4_0"} {
		_, err := m.NewDeviceCache(8, CacheOptions{Method: meth})
		if err == nil || !containsAll(err.Error(), "layer 0", "head_dim 40", meth) {
			t.Errorf("method %s at head_dim 40: error %v, want one naming layer 0 and head_dim 40", meth, err)
		}
	}
}

func containsAll(s string, subs ...string) bool {
	for _, x := range subs {
		if !strings.Contains(s, x) {
			return false
		}
	}
	return true
}
