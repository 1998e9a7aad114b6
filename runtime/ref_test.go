package runtime

import (
	"math"
	"sort"

	"github.com/lmpack/lmpack/formats/arch"
)

// refForward is an independent, naive float64 forward pass written for the
// tests: per-token loops, no fused weights, no kernels, RoPE computed from
// its definition. w maps tensor names to row-major float64 values. It
// returns logits [T][vocab] and the top-k experts chosen per MoE layer
// ([layer][token][k], nil for dense layers).
func refForward(d *arch.Description, w map[string][]float64, tokens []int) ([][]float64, [][][]int) {
	H, V := d.HiddenSize, d.VocabSize
	T := len(tokens)
	matvec := func(W []float64, x []float64, out int) []float64 {
		in := len(x)
		y := make([]float64, out)
		for o := 0; o < out; o++ {
			var s float64
			for i := 0; i < in; i++ {
				s += W[o*in+i] * x[i]
			}
			y[o] = s
		}
		return y
	}
	rms := func(x, g []float64) []float64 {
		var ss float64
		for _, v := range x {
			ss += v * v
		}
		r := 1 / math.Sqrt(ss/float64(len(x))+d.RMSNormEps)
		y := make([]float64, len(x))
		for i := range x {
			y[i] = x[i] * r * g[i]
		}
		return y
	}
	silu := func(v float64) float64 { return v / (1 + math.Exp(-v)) }
	ffn := func(m *arch.MLP, x []float64) []float64 {
		g := matvec(w[m.Gate], x, m.IntermediateSize)
		u := matvec(w[m.Up], x, m.IntermediateSize)
		for i := range g {
			g[i] = silu(g[i]) * u[i]
		}
		return matvec(w[m.Down], g, H)
	}
	rope := func(x []float64, heads, hd, pos int) {
		inv := InvFreqRef(d.RoPE, hd)
		for h := 0; h < heads; h++ {
			v := x[h*hd : (h+1)*hd]
			rot := make([]float64, hd)
			for i := 0; i < hd; i++ {
				// rotate_half: (-x2, x1)
				if i < hd/2 {
					rot[i] = -v[i+hd/2]
				} else {
					rot[i] = v[i-hd/2]
				}
			}
			for i := 0; i < hd; i++ {
				a := float64(pos) * inv[i%(hd/2)]
				v[i] = v[i]*math.Cos(a) + rot[i]*math.Sin(a)
			}
		}
	}
	x := make([][]float64, T)
	for t, id := range tokens {
		x[t] = append([]float64(nil), w[d.Embedding][id*H:(id+1)*H]...)
	}
	routes := make([][][]int, len(d.Layers))
	for li := range d.Layers {
		l := &d.Layers[li]
		hd, nh, nkv := l.HeadDim, l.NumHeads, l.NumKVHeads
		qs := make([][]float64, T)
		ks := make([][]float64, T)
		vs := make([][]float64, T)
		for t := 0; t < T; t++ {
			xn := rms(x[t], w[l.Attn.Norm])
			q := matvec(w[l.Attn.Q], xn, nh*hd)
			k := matvec(w[l.Attn.K], xn, nkv*hd)
			v := matvec(w[l.Attn.V], xn, nkv*hd)
			for name, dst := range map[string][]float64{l.Attn.QBias: q, l.Attn.KBias: k, l.Attn.VBias: v} {
				if name != "" {
					for i := range dst {
						dst[i] += w[name][i]
					}
				}
			}
			if l.Attn.QNorm != "" {
				for h := 0; h < nh; h++ {
					copy(q[h*hd:], rms(q[h*hd:(h+1)*hd], w[l.Attn.QNorm]))
				}
				for h := 0; h < nkv; h++ {
					copy(k[h*hd:], rms(k[h*hd:(h+1)*hd], w[l.Attn.KNorm]))
				}
			}
			rope(q, nh, hd, t)
			rope(k, nkv, hd, t)
			qs[t], ks[t], vs[t] = q, k, v
		}
		for t := 0; t < T; t++ {
			att := make([]float64, nh*hd)
			for h := 0; h < nh; h++ {
				g := h / (nh / nkv)
				lo := 0
				if l.SlidingWindow > 0 {
					lo = max(0, t-l.SlidingWindow+1)
				}
				sc := make([]float64, t+1)
				mx := math.Inf(-1)
				for s := lo; s <= t; s++ {
					var dot float64
					for i := 0; i < hd; i++ {
						dot += qs[t][h*hd+i] * ks[s][g*hd+i]
					}
					sc[s] = dot / math.Sqrt(float64(hd))
					mx = math.Max(mx, sc[s])
				}
				var sum float64
				for s := lo; s <= t; s++ {
					sc[s] = math.Exp(sc[s] - mx)
					sum += sc[s]
				}
				for s := lo; s <= t; s++ {
					for i := 0; i < hd; i++ {
						att[h*hd+i] += sc[s] / sum * vs[s][g*hd+i]
					}
				}
			}
			o := matvec(w[l.Attn.O], att, H)
			if l.Attn.OBias != "" {
				for i := range o {
					o[i] += w[l.Attn.OBias][i]
				}
			}
			for i := range o {
				x[t][i] += o[i]
			}
		}
		if l.MoE != nil {
			routes[li] = make([][]int, T)
		}
		for t := 0; t < T; t++ {
			xn := rms(x[t], w[l.FFNNorm])
			var out []float64
			if l.MLP != nil {
				out = ffn(l.MLP, xn)
			} else {
				m := l.MoE
				lg := matvec(w[m.Router], xn, m.NumExperts)
				mx := math.Inf(-1)
				for _, v := range lg {
					mx = math.Max(mx, v)
				}
				p := make([]float64, len(lg))
				var sum float64
				for i, v := range lg {
					p[i] = math.Exp(v - mx)
					sum += p[i]
				}
				ids := make([]int, len(p))
				for i := range ids {
					p[i] /= sum
					ids[i] = i
				}
				sort.SliceStable(ids, func(a, b int) bool { return p[ids[a]] > p[ids[b]] })
				top := ids[:m.TopK]
				routes[li][t] = append([]int(nil), top...)
				var norm float64
				for _, e := range top {
					norm += p[e]
				}
				out = make([]float64, H)
				for _, e := range top {
					wt := p[e]
					if m.NormTopKProb {
						wt /= norm
					}
					y := ffn(&m.Experts[e], xn)
					for i := range out {
						out[i] += wt * y[i]
					}
				}
				if m.Shared != nil {
					y := ffn(m.Shared, xn)
					g := 1.0
					if m.SharedGate != "" {
						var s float64
						for i := range xn {
							s += w[m.SharedGate][i] * xn[i]
						}
						g = 1 / (1 + math.Exp(-s))
					}
					for i := range out {
						out[i] += g * y[i]
					}
				}
			}
			for i := range out {
				x[t][i] += out[i]
			}
		}
	}
	head := d.LMHead
	if d.TieWordEmbeddings {
		if _, ok := w[head]; !ok {
			head = d.Embedding
		}
	}
	logits := make([][]float64, T)
	for t := 0; t < T; t++ {
		logits[t] = matvec(w[head], rms(x[t], w[d.FinalNorm]), V)
	}
	return logits, routes
}

// InvFreqRef recomputes RoPE inverse frequencies from the definitions
// (independently of InvFreq) for the reference forward.
func InvFreqRef(r arch.RoPE, hd int) []float64 {
	out := make([]float64, hd/2)
	for i := range out {
		f := math.Pow(r.Theta, -float64(2*i)/float64(hd))
		if s := r.Scaling; s != nil {
			if s.Type == "linear" {
				f /= s.Factor
			} else if s.Type == "llama3" {
				wavelen := 2 * math.Pi / f
				lowWave := float64(s.OriginalMaxPositionEmbeddings) / s.LowFreqFactor
				highWave := float64(s.OriginalMaxPositionEmbeddings) / s.HighFreqFactor
				if wavelen > lowWave {
					f /= s.Factor
				} else if wavelen >= highWave {
					sm := (float64(s.OriginalMaxPositionEmbeddings)/wavelen - s.LowFreqFactor) / (s.HighFreqFactor - s.LowFreqFactor)
					f = (1-sm)*f/s.Factor + sm*f
				}
			}
		}
		out[i] = f
	}
	return out
}
