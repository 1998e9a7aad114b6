// Command kverr measures, per decoder layer, the key and value error of
// INT2 KV cache kinds on held-out text, in the metric OSCAR optimises
// (docs/METHODS.md §1, ../shared/docs/METHODS.md §1): a key error δk moves
// the logit of query q by q·δk, so the key error of a kind is
//
//	E_K = Σ_{t,h} δk_{t,h}ᵀ C_Q,h δk_{t,h} / Σ_{t,h} k_{t,h}ᵀ C_Q,h k_{t,h}
//
// (relative; C_Q,h = (1/(T·g)) Σ q qᵀ over the held-out queries of the g
// query heads of KV head h, so E_K = E[(q·δk)²] / E[(q·k)²] with q and k
// drawn independently), and its value error is E_V = Σ ‖δv‖² / Σ ‖v‖².
//
// The fp32 model runs each window of the data file (tokenized as
// `lmpack eval` does) once; every layer's post-RoPE q, k, v are captured,
// written into a cache of each kind with no fp16 windows
// (kvcache.Options.ExactWindows, Sink = Recent = 0: every token
// quantized, kivi2 and oscars2 in 32-token blocks) and read back
// (dequantised and un-rotated), so the errors are those of the stores the
// runtime serves. Beside the kinds, the "oscar2" and "oscar2-g32" stores
// run with other rotations in place of the file's R = U·H·P_br (same clip
// ratios): I (none), H (Hadamard only), U (eigenvectors of C_Q / C_S
// only), U·H (no bit-reversal permutation), and R with no clipping.
//
// Usage:
//
//	go run ./scripts/kverr MODEL DATA ROTATIONS [CTX [WINDOWS]]
//	go run ./scripts/kverr csavg MODEL CALIB ROTATIONS OUT
//
// The second form writes OUT, the rotation file ROTATIONS with R_V
// recomputed from the C_S of docs/METHODS.md §1: weights w_t = k_tᵀ C_Q k_t
// with the layer's C_Q averaged over KV heads (what calibrate computes
// since it stopped weighing with each head's own C_Q,h, as the reference
// compute_kv_rotation.py does), from CALIB's C_Q and calibration windows:
// it measured that change on calibration files written before it. It
// prints per layer ‖ΔC_S‖_F/‖C_S‖_F between CALIB's C_S and the new one.
//
// Statistics accumulate in float64. Errors (printed, exit 1): an
// unreadable model, data or rotation file, a rotation file of another
// model, a head_dim that is not a power of two.
package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"strconv"

	"github.com/lmpack/lmpack/calibrate"
	"github.com/lmpack/lmpack/internal/engine"
	"github.com/lmpack/lmpack/model"
	"github.com/lmpack/lmpack/quantize/kvq"
	"github.com/lmpack/lmpack/quantize/oscar"
	"github.com/lmpack/lmpack/runtime/kvcache"
)

type capture struct{ q, k, v [][]float32 }

func (c *capture) QKV(layer, pos, n int, q, k, v []float32) {
	c.q[layer] = append(c.q[layer][:0], q...)
	c.k[layer] = append(c.k[layer][:0], k...)
	c.v[layer] = append(c.v[layer][:0], v...)
}

// variant is one row of the table: a cache kind and the rotations it
// runs with (nil: the kind takes none).
type variant struct {
	label, kind string
	rot         *kvcache.Rotations
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "kverr:", err)
		os.Exit(1)
	}
}

func run() error {
	if len(os.Args) == 6 && os.Args[1] == "csavg" {
		return csAvg(os.Args[2], os.Args[3], os.Args[4], os.Args[5])
	}
	if len(os.Args) < 4 {
		return fmt.Errorf("usage: kverr MODEL DATA ROTATIONS [CTX [WINDOWS]]")
	}
	ctxLen, windows := 256, 8
	if len(os.Args) > 4 {
		n, err := strconv.Atoi(os.Args[4])
		if err != nil {
			return fmt.Errorf("CTX %q: %w", os.Args[4], err)
		}
		ctxLen = n
	}
	if len(os.Args) > 5 {
		n, err := strconv.Atoi(os.Args[5])
		if err != nil {
			return fmt.Errorf("WINDOWS %q: %w", os.Args[5], err)
		}
		windows = n
	}
	ctx := context.Background()
	e, err := engine.Open(ctx, os.Args[1], engine.Options{Threads: 1, Device: "cpu"})
	if err != nil {
		return err
	}
	defer e.Close()
	ids, err := e.EvalIDs(os.Args[2], ctxLen)
	if err != nil {
		return err
	}
	fp, err := model.Fingerprint(e.Dir, e.Checkpoint)
	if err != nil {
		return err
	}
	r, _, err := oscar.ReadFile(os.Args[3], model.Expect{ModelFingerprint: fp, Desc: e.Desc})
	if err != nil {
		return err
	}
	file := kvcache.Rotations(*r)
	layers := kvcache.LayersOf(e.Desc)
	L := len(layers)
	// Rotations built from the file's R = U·H·P_br: U = (R·P_brᵀ)·H.
	mk := func(f func(l int, r []float32) []float32, clip bool) *kvcache.Rotations {
		out := &kvcache.Rotations{}
		for l := range layers {
			out.K = append(out.K, f(l, file.K[l]))
			out.V = append(out.V, f(l, file.V[l]))
		}
		if clip {
			out.ClipK, out.ClipV = file.ClipK, file.ClipV
		}
		return out
	}
	ident := func(l int, _ []float32) []float32 {
		d := layers[l].HeadDim
		m := make([]float32, d*d)
		for i := 0; i < d; i++ {
			m[i*d+i] = 1
		}
		return m
	}
	had := func(l int, _ []float32) []float32 { return to32(kvq.HadamardMatrix(layers[l].HeadDim)) }
	uOnly := func(l int, r []float32) []float32 { return eigvecs(r, layers[l].HeadDim) }
	uh := func(l int, r []float32) []float32 {
		d := layers[l].HeadDim
		return mul(eigvecs(r, d), to32(kvq.HadamardMatrix(d)), d)
	}
	same := func(_ int, r []float32) []float32 { return r }
	vs := []variant{
		{"int2-naive", "int2-naive", nil},
		{"quarot2 (H, no clip)", "quarot2", nil},
		{"kivi2", "kivi2", nil},
		{"oscars2", "oscars2", nil},
		{"oscar2 R=I +clip", "oscar2", mk(ident, true)},
		{"oscar2 R=H +clip", "oscar2", mk(had, true)},
		{"oscar2 R=U +clip", "oscar2", mk(uOnly, true)},
		{"oscar2 R=UHP no clip", "oscar2", mk(same, false)},
		{"oscar2 (R=UHP +clip)", "oscar2", &file},
		{"g32 R=I +clip", "oscar2-g32", mk(ident, true)},
		{"g32 R=H +clip", "oscar2-g32", mk(had, true)},
		{"g32 R=U +clip", "oscar2-g32", mk(uOnly, true)},
		{"g32 R=UH +clip", "oscar2-g32", mk(uh, true)},
		{"oscar2-g32 (UHP +clip)", "oscar2-g32", &file},
	}
	// eK[v][l] numerator, eKd[l] denominator (the same for every variant).
	eK, eV := make([][]float64, len(vs)), make([][]float64, len(vs))
	// eKc: eK less the part of δk common to every token of the window
	// (T·m̄ᵀC_Q m̄, m̄ the mean δk of the (window, layer, head)), which
	// moves every logit of a query alike and which softmax ignores.
	eKc := make([][]float64, len(vs))
	for i := range vs {
		eK[i], eV[i], eKc[i] = make([]float64, L), make([]float64, L), make([]float64, L)
	}
	dK, dV := make([]float64, L), make([]float64, L)
	// What-if rows (not a cache kind): the file's rotation and clipping on
	// k − μ and v − μ, μ the window's mean of the (layer, KV head), added
	// back after dequantisation (groups of head_dim, and of 32).
	whatIf := []string{"what-if oscar2 on x−μ", "what-if oscar2-g32 on x−μ"}
	wK, wV := [2][]float64{make([]float64, L), make([]float64, L)}, [2][]float64{make([]float64, L), make([]float64, L)}
	// meanK: Σ μᵀC_Qμ·T (the key energy in the mean), meanV: Σ ‖μ‖²·T.
	meanK, meanV := make([]float64, L), make([]float64, L)
	capt := &capture{q: make([][]float32, L), k: make([][]float32, L), v: make([][]float32, L)}
	logits := make([]float32, e.Desc.VocabSize)
	nw := min(windows, len(ids)/ctxLen)
	if nw == 0 {
		return fmt.Errorf("%s: %d tokens, fewer than one window of %d", os.Args[2], len(ids), ctxLen)
	}
	caches := make([]kvCache, len(vs))
	for i, v := range vs {
		c, err := kvcache.New(v.kind, layers, ctxLen, kvcache.Options{Rotations: v.rot, ExactWindows: true})
		if err != nil {
			return fmt.Errorf("%s: %w", v.label, err)
		}
		caches[i] = c
	}
	for w := 0; w < nw; w++ {
		win := ids[w*ctxLen : (w+1)*ctxLen]
		e.Model.SetObserver(capt)
		err := e.Model.Forward(ctx, win, e.Model.NewCache(ctxLen), logits, false)
		e.Model.SetObserver(nil)
		if err != nil {
			return err
		}
		cqs := make([][][]float64, L) // [layer][kv head] C_Q,h
		for l, ly := range e.Desc.Layers {
			nh, nkv, hd := ly.NumHeads, ly.NumKVHeads, ly.HeadDim
			g := nh / nkv
			T := ctxLen
			// C_Q,h of this window's queries (float64), per KV head.
			cq := make([][]float64, nkv)
			for h := range cq {
				cq[h] = make([]float64, hd*hd)
				for t := 0; t < T; t++ {
					for j := 0; j < g; j++ {
						q := capt.q[l][t*nh*hd+(h*g+j)*hd:]
						for a := 0; a < hd; a++ {
							qa := float64(q[a])
							for b := 0; b < hd; b++ {
								cq[h][a*hd+b] += qa * float64(q[b])
							}
						}
					}
				}
				for i := range cq[h] {
					cq[h][i] /= float64(T * g)
				}
			}
			cqs[l] = cq
			kd := nkv * hd
			for h := 0; h < nkv; h++ {
				for side, x := range [][]float32{capt.k[l], capt.v[l]} {
					mu := make([]float32, hd)
					for t := 0; t < T; t++ {
						for a := 0; a < hd; a++ {
							mu[a] += x[t*kd+h*hd+a] / float32(T)
						}
					}
					r, ratio := file.K[l], file.ClipK[l]
					if side == 1 {
						r, ratio = file.V[l], file.ClipV[l]
					}
					if side == 0 {
						meanK[l] += quad(cq[h], mu, nil) * float64(T)
					} else {
						meanV[l] += quad(identity(hd), mu, nil) * float64(T)
					}
					for gi, g := range []int{hd, min(32, hd)} {
						for t := 0; t < T; t++ {
							row := x[t*kd+h*hd : t*kd+(h+1)*hd]
							got := centred(row, mu, r, ratio, g)
							if side == 0 {
								wK[gi][l] += quad(cq[h], row, got)
							} else {
								wV[gi][l] += quad(identity(hd), row, got)
							}
						}
					}
				}
			}
			for t := 0; t < T; t++ {
				for h := 0; h < nkv; h++ {
					k := capt.k[l][t*kd+h*hd : t*kd+(h+1)*hd]
					dK[l] += quad(cq[h], k, nil)
					for _, x := range capt.v[l][t*kd+h*hd : t*kd+(h+1)*hd] {
						dV[l] += float64(x) * float64(x)
					}
				}
			}
		}
		T := ctxLen
		for i, c := range caches {
			c.Truncate(0)
			for l := range layers {
				c.Write(l, 0, T, capt.k[l], capt.v[l])
			}
			c.Commit(T)
			for l, ly := range layers {
				hd, kd := ly.HeadDim, ly.NumKVHeads*ly.HeadDim
				kh, vh := make([]float32, T*hd), make([]float32, T*hd)
				for h := 0; h < ly.NumKVHeads; h++ {
					c.Read(l, h, T, kh, vh)
					mdk := make([]float32, hd)
					for t := 0; t < T; t++ {
						for a := 0; a < hd; a++ {
							mdk[a] += (capt.k[l][t*kd+h*hd+a] - kh[t*hd+a]) / float32(T)
						}
					}
					eKc[i][l] -= float64(T) * quad(cqs[l][h], mdk, nil)
					for t := 0; t < T; t++ {
						k := capt.k[l][t*kd+h*hd : t*kd+(h+1)*hd]
						q := quad(cqs[l][h], k, kh[t*hd:(t+1)*hd])
						eK[i][l] += q
						eKc[i][l] += q
						v := capt.v[l][t*kd+h*hd : t*kd+(h+1)*hd]
						for a := 0; a < hd; a++ {
							d := float64(vh[t*hd+a]) - float64(v[a])
							eV[i][l] += d * d
						}
					}
				}
			}
		}
	}
	fmt.Printf("per-layer relative key error E[(q·δk)²]/E[(q·k)²] and value error Σ‖δv‖²/Σ‖v‖², %d windows of %d tokens, every token quantized\n", nw, ctxLen)
	fmt.Printf("%-24s %8s", "kind", "bits")
	for l := 0; l < L; l++ {
		fmt.Printf("   L%d K     L%d V ", l, l)
	}
	fmt.Printf("   mean K   mean V\n")
	for i, v := range vs {
		b, _ := kvcache.BitsAt(v.kind, layers, kvcache.Options{ExactWindows: true}, ctxLen)
		fmt.Printf("%-24s %8.3f", v.label, b)
		var sk, sv float64
		for l := 0; l < L; l++ {
			ek, ev := eK[i][l]/dK[l], eV[i][l]/dV[l]
			sk, sv = sk+ek, sv+ev
			fmt.Printf(" %7.4f %7.4f ", ek, ev)
		}
		fmt.Printf(" %7.4f  %7.4f\n", sk/float64(L), sv/float64(L))
	}
	fmt.Printf("\nkey error without its part common to all tokens (softmax-invariant): (E[(q·δk)²] − T·m̄ᵀC_Q m̄)/E[(q·k)²]\n")
	fmt.Printf("%-24s %8s", "kind", "bits")
	for l := 0; l < L; l++ {
		fmt.Printf("   L%d K  ", l)
	}
	fmt.Printf("   mean K\n")
	for i, v := range vs {
		b, _ := kvcache.BitsAt(v.kind, layers, kvcache.Options{ExactWindows: true}, ctxLen)
		fmt.Printf("%-24s %8.3f", v.label, b)
		var sk float64
		for l := 0; l < L; l++ {
			ek := eKc[i][l] / dK[l]
			sk += ek
			fmt.Printf(" %7.4f  ", ek)
		}
		fmt.Printf(" %7.4f\n", sk/float64(L))
	}
	fmt.Println()
	for gi, label := range whatIf {
		fmt.Printf("%-24s %8s", label, "")
		var sk, sv float64
		for l := 0; l < L; l++ {
			ek, ev := wK[gi][l]/dK[l], wV[gi][l]/dV[l]
			sk, sv = sk+ek, sv+ev
			fmt.Printf(" %7.4f %7.4f ", ek, ev)
		}
		fmt.Printf(" %7.4f  %7.4f\n", sk/float64(L), sv/float64(L))
	}
	fmt.Printf("%-24s %8s", "share in the mean μ", "")
	for l := 0; l < L; l++ {
		fmt.Printf(" %7.4f %7.4f ", meanK[l]/dK[l], meanV[l]/dV[l])
	}
	fmt.Println()
	return nil
}

// centred returns the what-if reconstruction of row x: y = (x − μ)·R,
// clipped at ratio (kvq.Clip over the row), asymmetric INT2 per group of
// g with fp16 scale and zero (kvq, as the cache stores), then ŷ·Rᵀ + μ.
func centred(x, mu, r []float32, ratio float64, g int) []float32 {
	d := len(x)
	y := make([]float32, d)
	for j := 0; j < d; j++ {
		var s float64
		for a := 0; a < d; a++ {
			s += float64(x[a]-mu[a]) * float64(r[a*d+j])
		}
		y[j] = float32(s)
	}
	if ratio > 0 && ratio < 1 {
		kvq.Clip(y, ratio)
	}
	codes := make([]byte, kvq.PackedLen(g, 2))
	for g0 := 0; g0 < d; g0 += g {
		yg := y[g0 : g0+g]
		lo, hi := kvq.MinMax(yg)
		sc, z := kvq.AsymParamsF16(lo, hi, 2)
		kvq.EncodeAsym(codes, yg, 2, sc, z)
		kvq.DecodeAsym(yg, codes, 2, sc, z)
	}
	out := make([]float32, d)
	for a := 0; a < d; a++ {
		var s float64
		for j := 0; j < d; j++ {
			s += float64(y[j]) * float64(r[a*d+j])
		}
		out[a] = float32(s) + mu[a]
	}
	return out
}

// identity returns the [d, d] identity in float64.
func identity(d int) []float64 {
	m := make([]float64, d*d)
	for i := 0; i < d; i++ {
		m[i*d+i] = 1
	}
	return m
}

// csObs accumulates C_S with the averaged C_Q weights: per layer and KV
// head Σ_t w v vᵀ and Σ_t w.
type csObs struct {
	desc []struct{ nkv, hd int }
	cq   [][]float64   // [layer] averaged C_Q
	wvv  [][][]float64 // [layer][head]
	w    [][]float64   // [layer][head]
}

func (o *csObs) QKV(layer, pos, n int, q, k, v []float32) {
	nkv, hd := o.desc[layer].nkv, o.desc[layer].hd
	for t := 0; t < n; t++ {
		for h := 0; h < nkv; h++ {
			kr := k[t*nkv*hd+h*hd : t*nkv*hd+(h+1)*hd]
			vr := v[t*nkv*hd+h*hd : t*nkv*hd+(h+1)*hd]
			w := quad(o.cq[layer], kr, nil)
			o.w[layer][h] += w
			m := o.wvv[layer][h]
			for a := 0; a < hd; a++ {
				for b := 0; b < hd; b++ {
					m[a*hd+b] += w * float64(vr[a]) * float64(vr[b])
				}
			}
		}
	}
}

// csAvg is the csavg mode (see the package comment).
func csAvg(modelDir, calibPath, rotPath, out string) error {
	ctx := context.Background()
	e, err := engine.Open(ctx, modelDir, engine.Options{Threads: 1, Device: "cpu"})
	if err != nil {
		return err
	}
	defer e.Close()
	fp, err := model.Fingerprint(e.Dir, e.Checkpoint)
	if err != nil {
		return err
	}
	want := model.Expect{ModelFingerprint: fp, Desc: e.Desc}
	cal, err := calibrate.Read(calibPath, want)
	if err != nil {
		return err
	}
	_, hdr, err := oscar.ReadFile(rotPath, want)
	if err != nil {
		return err
	}
	wins := cal.CalibrationWindows()
	if len(wins) == 0 || len(cal.OSCAR) == 0 {
		return fmt.Errorf("%s: no calibration token ids or no oscar statistics", calibPath)
	}
	o := &csObs{}
	for l, ly := range e.Desc.Layers {
		o.desc = append(o.desc, struct{ nkv, hd int }{ly.NumKVHeads, ly.HeadDim})
		o.cq = append(o.cq, cal.OSCAR[l].CQ)
		var hm [][]float64
		for h := 0; h < ly.NumKVHeads; h++ {
			hm = append(hm, make([]float64, ly.HeadDim*ly.HeadDim))
		}
		o.wvv = append(o.wvv, hm)
		o.w = append(o.w, make([]float64, ly.NumKVHeads))
	}
	logits := make([]float32, e.Desc.VocabSize)
	e.Model.SetObserver(o)
	for i, w := range wins {
		if err := e.Model.Forward(ctx, w, e.Model.NewCache(len(w)), logits, false); err != nil {
			e.Model.SetObserver(nil)
			return fmt.Errorf("calibration window %d: %w", i, err)
		}
	}
	e.Model.SetObserver(nil)
	var layers []oscar.Layer
	for l, ly := range e.Desc.Layers {
		d := ly.HeadDim
		cs := make([]float64, d*d)
		for h := 0; h < ly.NumKVHeads; h++ {
			for i, x := range o.wvv[l][h] {
				cs[i] += x / o.w[l][h] / float64(ly.NumKVHeads)
			}
		}
		var num, den float64
		for i := range cs {
			df := cs[i] - cal.OSCAR[l].CS[i]
			num, den = num+df*df, den+cal.OSCAR[l].CS[i]*cal.OSCAR[l].CS[i]
		}
		fmt.Printf("layer %d: ‖C_S(avg C_Q) − C_S(per-head C_Q,h)‖/‖C_S‖ = %.4f\n", l, math.Sqrt(num/den))
		rk, ek, err := oscar.Rotation(cal.OSCAR[l].CQ, d)
		if err != nil {
			return fmt.Errorf("layer %d: C_Q: %w", l, err)
		}
		rv, ev, err := oscar.Rotation(cs, d)
		if err != nil {
			return fmt.Errorf("layer %d: C_S: %w", l, err)
		}
		layers = append(layers, oscar.Layer{HeadDim: d, RK: rk, RV: rv, EigK: ek, EigV: ev})
	}
	return oscar.WriteFile(out, *hdr, layers)
}

// kvCache is the part of runtime.KVCache kverr uses.
type kvCache interface {
	Write(layer, pos, n int, k, v []float32)
	Commit(n int)
	Truncate(n int)
	Read(layer, h, n int, k, v []float32)
}

// quad returns (x−y)ᵀ C (x−y) for C [d, d] (y nil: xᵀ C x), in float64.
func quad(c []float64, x, y []float32) float64 {
	d := len(x)
	dx := make([]float64, d)
	for i := range x {
		dx[i] = float64(x[i])
		if y != nil {
			dx[i] -= float64(y[i])
		}
	}
	var s float64
	for a := 0; a < d; a++ {
		var r float64
		for b := 0; b < d; b++ {
			r += c[a*d+b] * dx[b]
		}
		s += dx[a] * r
	}
	return s
}

// eigvecs returns U = (R·P_brᵀ)·H for R = U·H·P_br ([d, d] row-major,
// quantize/oscar.Rotation): column br(i) of R is U·h_i, so (R·P_brᵀ) has
// column i = U·h_i, and H is its own inverse.
func eigvecs(r []float32, d int) []float32 {
	br := kvq.BitReversal(d)
	rp := make([]float32, d*d)
	for a := 0; a < d; a++ {
		for i := 0; i < d; i++ {
			rp[a*d+i] = r[a*d+br[i]]
		}
	}
	return mul(rp, to32(kvq.HadamardMatrix(d)), d)
}

// mul returns a·b for [d, d] row-major matrices (float64 sums).
func mul(a, b []float32, d int) []float32 {
	out := make([]float32, d*d)
	for i := 0; i < d; i++ {
		for j := 0; j < d; j++ {
			var s float64
			for k := 0; k < d; k++ {
				s += float64(a[i*d+k]) * float64(b[k*d+j])
			}
			out[i*d+j] = float32(s)
		}
	}
	return out
}

func to32(x []float64) []float32 {
	out := make([]float32, len(x))
	for i, v := range x {
		out[i] = float32(v)
	}
	return out
}
