package eval

import (
	"context"
	"fmt"
	"github.com/lmpack/lmpack/internal/fsx"
	"io"
	"math"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/runtime"
)

// KVLayerError is one method's damage in one layer, measured with the
// fp32 model's own queries, keys and values (teacher-forced, so errors do
// not compound across layers): the keys and values of a window are
// written to the method's cache and read back, and
//   - LogitError = Σ (q·k̂ − q·k)² / Σ (q·k)² over causal (query, key)
//     pairs and query heads, the relative attention-logit error
//     (docs/METHODS.md §1: key error δk moves the logit by q·δk);
//   - OutputError = Σ ‖o(K̂, V̂) − o(K, V)‖² / Σ ‖o(K, V)‖², the relative
//     error of the attention output o = softmax(qKᵀ/√d)·V per head.
type KVLayerError struct {
	Layer       int     `json:"layer"`
	LogitError  float64 `json:"logit_error"`
	OutputError float64 `json:"output_error"`
}

// KVLayerReport holds per-layer errors for each method, in method order.
type KVLayerReport struct {
	Methods []string         `json:"methods"`
	Errors  [][]KVLayerError `json:"errors"` // [method][layer]
}

type qkvCapture struct {
	q, k, v [][]float32 // per layer: [n, qdim], [n, kvdim], [n, kvdim]
}

func (c *qkvCapture) QKV(layer, pos, n int, q, k, v []float32) {
	c.q[layer] = append(c.q[layer][:0], q...)
	c.k[layer] = append(c.k[layer][:0], k...)
	c.v[layer] = append(c.v[layer][:0], v...)
}

// KVLayerErrors measures KVLayerError for every layer and method on the
// first window of ids (ctx tokens). Statistics accumulate in float64.
// Errors: too few tokens, a constructor or forward error.
func KVLayerErrors(ctx context.Context, m runtime.Model, ids []int, methods []KVMethod, ctxLen int) (*KVLayerReport, error) {
	if len(ids) < ctxLen || ctxLen < 2 {
		return nil, fmt.Errorf("eval: %w: %d tokens, window %d", ErrTooShort, len(ids), ctxLen)
	}
	d := m.Description()
	L := len(d.Layers)
	capt := &qkvCapture{q: make([][]float32, L), k: make([][]float32, L), v: make([][]float32, L)}
	m.SetObserver(capt)
	logits := make([]float32, d.VocabSize)
	c := m.NewCache(ctxLen)
	err := m.Forward(ctx, ids[:ctxLen], c, logits, false)
	m.SetObserver(nil)
	if err != nil {
		return nil, err
	}
	rep := &KVLayerReport{}
	for _, meth := range methods {
		cache, err := meth.New(ctxLen)
		if err != nil {
			return nil, fmt.Errorf("eval: kv %s: %w", meth.Name, err)
		}
		for l := 0; l < L; l++ {
			cache.Write(l, 0, ctxLen, capt.k[l], capt.v[l])
		}
		cache.Commit(ctxLen)
		row := make([]KVLayerError, L)
		for l := 0; l < L; l++ {
			row[l] = layerError(&d.Layers[l], cache, l, ctxLen, capt.q[l], capt.k[l], capt.v[l])
			row[l].Layer = l
		}
		rep.Methods = append(rep.Methods, meth.Name)
		rep.Errors = append(rep.Errors, row)
	}
	return rep, nil
}

// layerError compares attention with the exact K, V against attention
// with the cache's K̂, V̂ for one layer, all query heads, causal.
func layerError(l *arch.Layer, cache runtime.KVCache, layer, n int, q, k, v []float32) KVLayerError {
	nh, nkv, hd := l.NumHeads, l.NumKVHeads, l.HeadDim
	qdim, kvdim := l.QDim(), l.KVDim()
	group := nh / nkv
	kh := make([]float32, n*hd)
	vh := make([]float32, n*hd)
	sc := make([]float64, n)
	sq := make([]float64, n)
	o := make([]float64, hd)
	oq := make([]float64, hd)
	scale := 1 / math.Sqrt(float64(hd))
	var logitNum, logitDen, outNum, outDen float64
	for g := 0; g < nkv; g++ {
		cache.Read(layer, g, n, kh, vh)
		for h := g * group; h < (g+1)*group; h++ {
			for t := 0; t < n; t++ {
				qt := q[t*qdim+h*hd : t*qdim+(h+1)*hd]
				for s := 0; s <= t; s++ {
					ks := k[s*kvdim+g*hd : s*kvdim+(g+1)*hd]
					kq := kh[s*hd : (s+1)*hd]
					var a, b float64
					for i := range qt {
						a += float64(qt[i]) * float64(ks[i])
						b += float64(qt[i]) * float64(kq[i])
					}
					logitNum += (b - a) * (b - a)
					logitDen += a * a
					sc[s], sq[s] = a*scale, b*scale
				}
				softmax64(sc[:t+1])
				softmax64(sq[:t+1])
				clear(o)
				clear(oq)
				for s := 0; s <= t; s++ {
					vs := v[s*kvdim+g*hd : s*kvdim+(g+1)*hd]
					vq := vh[s*hd : (s+1)*hd]
					for i := 0; i < hd; i++ {
						o[i] += sc[s] * float64(vs[i])
						oq[i] += sq[s] * float64(vq[i])
					}
				}
				for i := 0; i < hd; i++ {
					outNum += (oq[i] - o[i]) * (oq[i] - o[i])
					outDen += o[i] * o[i]
				}
			}
		}
	}
	return KVLayerError{LogitError: logitNum / logitDen, OutputError: outNum / outDen}
}

func softmax64(x []float64) {
	mx := math.Inf(-1)
	for _, v := range x {
		mx = math.Max(mx, v)
	}
	var s float64
	for i, v := range x {
		x[i] = math.Exp(v - mx)
		s += x[i]
	}
	for i := range x {
		x[i] /= s
	}
}

// WriteLayerTable prints per-layer relative logit and output errors, one
// column pair per method.
func (r *KVLayerReport) WriteLayerTable(out io.Writer) error {
	w := &fsx.ErrWriter{W: out}
	fmt.Fprintf(w, "per-layer relative error (teacher-forced): attention logits / attention output\n%-6s", "layer")
	for _, m := range r.Methods {
		fmt.Fprintf(w, " %21s", m)
	}
	fmt.Fprintln(w)
	if len(r.Errors) == 0 {
		return w.Err
	}
	for l := range r.Errors[0] {
		fmt.Fprintf(w, "%-6d", l)
		for mi := range r.Methods {
			e := r.Errors[mi][l]
			fmt.Fprintf(w, " %21s", fmt.Sprintf("%.4f / %.4f", e.LogitError, e.OutputError))
		}
		fmt.Fprintln(w)
	}
	return w.Err
}
