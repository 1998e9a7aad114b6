package kvcache

import "github.com/lmpack/lmpack/runtime"

// fakeQuant is a cache of New seen through KVQuant's fake-quantization
// protocol: after every Write the layer's tokens [0, pos+n) are read back
// (dequantized, fp16 windows converted) into float32 buffers that it
// hands to attention through runtime.F32KV, so that every query — the
// call's own tokens included — reads every key and value as stored.
type fakeQuant struct {
	runtime.KVCache
	kvDim, headDim []int
	nkv            []int
	k, v           [][]float32 // [layers][cap, kvDim]
	kh, vh         []float32   // [cap, max head_dim] one head's rows
}

var (
	_ runtime.KVCache = (*fakeQuant)(nil)
	_ runtime.F32KV   = (*fakeQuant)(nil)
	_ Sizer           = (*fakeQuant)(nil)
)

// NewFakeQuant returns the cache New(name, layers, capacity, opt) returns,
// read through the fake-quantization protocol (KVQuant's; docs/METHODS.md
// §1): Forward attends every token of a call — its own included — through
// the keys and values as the cache stores them (dequantized), instead of
// the fresh float32 keys and values of the call's own tokens and the
// per-query windows of runtime.QuantizedKV. A whole window pushed through
// it in one Forward call measures what every position would see if all
// tokens, itself included, were read back from the cache (the protocol
// eval --kv used before the runtime ran prefill on fresh K/V). Memory: the
// cache plus 8·capacity·Σ kvDim bytes of float32 copies (not counted in
// Bytes). fp32 is returned as New returns it (its storage is the fresh
// float32). Errors: those of New.
func NewFakeQuant(name string, layers []Layer, capacity int, opt Options) (runtime.KVCache, error) {
	c, err := New(name, layers, capacity, opt)
	if err != nil || name == "fp32" {
		return c, err
	}
	f := &fakeQuant{KVCache: c}
	var maxHD int
	for _, l := range layers {
		d := l.NumKVHeads * l.HeadDim
		f.kvDim, f.headDim, f.nkv = append(f.kvDim, d), append(f.headDim, l.HeadDim), append(f.nkv, l.NumKVHeads)
		f.k, f.v = append(f.k, make([]float32, capacity*d)), append(f.v, make([]float32, capacity*d))
		maxHD = max(maxHD, l.HeadDim)
	}
	f.kh, f.vh = make([]float32, capacity*maxHD), make([]float32, capacity*maxHD)
	return f, nil
}

// Write implements runtime.KVCache: the inner cache's Write, then the
// layer's tokens [0, pos+n) read back into the float32 copies.
func (f *fakeQuant) Write(layer, pos, n int, k, v []float32) {
	f.KVCache.Write(layer, pos, n, k, v)
	end, d, hd := pos+n, f.kvDim[layer], f.headDim[layer]
	kh, vh := f.kh[:end*hd], f.vh[:end*hd]
	for h := 0; h < f.nkv[layer]; h++ {
		f.KVCache.Read(layer, h, end, kh, vh)
		for p := 0; p < end; p++ {
			copy(f.k[layer][p*d+h*hd:p*d+(h+1)*hd], kh[p*hd:(p+1)*hd])
			copy(f.v[layer][p*d+h*hd:p*d+(h+1)*hd], vh[p*hd:(p+1)*hd])
		}
	}
}

// F32 implements runtime.F32KV: layer's read-back keys and values, each
// [Cap(), kvDim] row-major (rows up to the last Write's end are valid).
func (f *fakeQuant) F32(layer int) (k, v []float32) { return f.k[layer], f.v[layer] }

// BitsPerElement implements Sizer (the inner cache's).
func (f *fakeQuant) BitsPerElement() float64 { return f.KVCache.(Sizer).BitsPerElement() }
