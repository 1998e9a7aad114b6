package kvcache

import "github.com/lmpack/lmpack/runtime"

// f32Cache is runtime.F32Cache (keeping its zero-copy F32KV ability) with
// Sizer.
type f32Cache struct {
	*runtime.F32Cache
	kvDim []int
}

var (
	_ runtime.KVCache = (*f32Cache)(nil)
	_ runtime.F32KV   = (*f32Cache)(nil)
	_ Sizer           = (*f32Cache)(nil)
)

// BitsPerElement implements Sizer: 32 once a token is stored.
func (c *f32Cache) BitsPerElement() float64 { return bitsPerElement(c.Bytes(), c.Len(), c.kvDim) }

// bitsPerElement is bytes·8 / (2·n·Σ kvDim), 0 for n = 0.
func bitsPerElement(bytes int64, n int, kvDim []int) float64 {
	var s int
	for _, d := range kvDim {
		s += d
	}
	if n == 0 || s == 0 {
		return 0
	}
	return float64(bytes) * 8 / (2 * float64(n) * float64(s))
}
