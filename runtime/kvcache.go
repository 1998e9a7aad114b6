package runtime

import (
	"fmt"

	"github.com/lmpack/lmpack/formats/arch"
)

// KVCache stores the post-RoPE keys and the values of past tokens for every
// layer. Positions are token indices from 0. Layers may differ in
// num_key_value_heads*head_dim (kvDim).
type KVCache interface {
	// Len is the number of tokens stored (the next position).
	Len() int
	// Cap is the maximum number of tokens.
	Cap() int
	// Write stores n tokens at positions [pos, pos+n) of layer:
	// k, v are [n, kvDim] row-major float32.
	Write(layer, pos, n int, k, v []float32)
	// Read returns tokens [0, n) of layer and kv head h, dequantized into
	// k, v: [n, head_dim] row-major float32.
	Read(layer, h, n int, k, v []float32)
	// Commit marks n more tokens as stored, after every layer was written.
	Commit(n int)
	// Truncate forgets tokens from position n on (n <= Len()).
	Truncate(n int)
	// Bytes is the memory the cache holds for its stored tokens, in bytes.
	Bytes() int64
}

// F32KV is an optional ability of a KVCache that stores float32 values:
// it returns layer's whole key and value buffers, each [Cap(), kvDim]
// row-major, for zero-copy attention.
type F32KV interface {
	F32(layer int) (k, v []float32)
}

// F32Cache is the reference float32 KV cache: [layers][cap, kvDim] for K
// and for V, allocated up front.
type F32Cache struct {
	k, v    [][]float32
	kvDim   []int
	headDim []int
	n, cap  int
}

var (
	_ KVCache = (*F32Cache)(nil)
	_ F32KV   = (*F32Cache)(nil)
)

// NewF32Cache returns a float32 cache for layers with the given kvDim and
// head_dim per layer (elements) holding up to capacity tokens. Memory:
// 2*4*capacity*Σ kvDim bytes.
func NewF32Cache(kvDim, headDim []int, capacity int) *F32Cache {
	c := &F32Cache{kvDim: kvDim, headDim: headDim, cap: capacity}
	for _, d := range kvDim {
		c.k = append(c.k, make([]float32, capacity*d))
		c.v = append(c.v, make([]float32, capacity*d))
	}
	return c
}

// Len implements KVCache.
func (c *F32Cache) Len() int { return c.n }

// Cap implements KVCache.
func (c *F32Cache) Cap() int { return c.cap }

// Write implements KVCache.
func (c *F32Cache) Write(layer, pos, n int, k, v []float32) {
	d := c.kvDim[layer]
	if pos+n > c.cap {
		panic(fmt.Sprintf("runtime: F32Cache.Write: positions [%d,%d) past capacity %d", pos, pos+n, c.cap))
	}
	copy(c.k[layer][pos*d:(pos+n)*d], k[:n*d])
	copy(c.v[layer][pos*d:(pos+n)*d], v[:n*d])
}

// Read implements KVCache.
func (c *F32Cache) Read(layer, h, n int, k, v []float32) {
	d, hd := c.kvDim[layer], c.headDim[layer]
	for t := 0; t < n; t++ {
		copy(k[t*hd:(t+1)*hd], c.k[layer][t*d+h*hd:])
		copy(v[t*hd:(t+1)*hd], c.v[layer][t*d+h*hd:])
	}
}

// F32 implements F32KV.
func (c *F32Cache) F32(layer int) (k, v []float32) { return c.k[layer], c.v[layer] }

// Commit implements KVCache.
func (c *F32Cache) Commit(n int) { c.n += n }

// Truncate implements KVCache.
func (c *F32Cache) Truncate(n int) {
	if n < c.n {
		c.n = n
	}
}

// Bytes implements KVCache: 8 bytes per stored element pair (K and V).
func (c *F32Cache) Bytes() int64 {
	var s int64
	for _, d := range c.kvDim {
		s += int64(c.n) * int64(d) * 8
	}
	return s
}

// F32CacheBytes returns the bytes an F32Cache for d holding capacity
// tokens allocates: 8·capacity·Σ_layers kvDim (K and V, float32).
func F32CacheBytes(d *arch.Description, capacity int) int64 {
	var per int64
	for i := range d.Layers {
		per += int64(d.Layers[i].KVDim())
	}
	return 8 * per * int64(capacity)
}

// QuantizedKV is an optional ability of a KVCache that keeps some tokens
// in a full-precision window (an fp16 sink and recent window) and moves
// the others into quantized storage as later tokens are written
// (runtime/kvcache). Forward uses it to give every query the view that
// token-by-token decode would give it (docs/METHODS.md §1):
//
//   - tokens of the same Forward call attend to each other through their
//     fresh float32 keys and values (prefill attention on fresh K/V, as
//     vLLM, SGLang and the KIVI/OSCAR references run it);
//   - a query at position p reads a token of an earlier call as the cache
//     serves it once it holds p+1 tokens: quantized (dequantized by Read)
//     at positions [sink, QuantizedEnd(layer, p+1)), in fp16 otherwise
//     (the sink, and the recent window counted back from p).
//
// Caches without this ability serve earlier tokens as Read returns them
// after the call's Write.
type QuantizedKV interface {
	// QuantizedEnd returns the end q of layer's quantized positions
	// [sink, q) once the layer holds n tokens, n ≥ its current length,
	// written from its current state: writing them one call at a time or
	// in one call gives the same q, and the cache does not change. For a
	// per-token method with sink S and recent window R, q = max(S, n−R)
	// (never below the current watermark); block methods step q a block
	// at a time.
	QuantizedEnd(layer, n int) int
}

// KVAttender is an optional ability of a KVCache that stores keys and
// values in a packed form (runtime/kvcache's quantized kinds): attention
// against its stored tokens without dequantizing them into float32
// history. Forward uses it for the tokens of earlier calls (positions
// [0, pos) of a call at pos, after the call's Write, the view Read would
// give); the call's own tokens stay fp32 (QuantizedKV). The scores and
// sums equal those of Read followed by float32 dot products up to float32
// rounding (the order of the sums differs; kvcache's tests state the
// bound). Calls for different kv heads or layers may run concurrently
// (each with its own scratch); none may run concurrently with Write or
// Truncate.
type KVAttender interface {
	// AttendsKV reports whether Scores and AccumV serve layer (a cache
	// may cover some of its layers' storage kinds only; callers Read the
	// others).
	AttendsKV(layer int) bool
	// AttendScratch is the number of float32 scratch elements one Scores
	// or AccumV call of layer with nq query rows needs.
	AttendScratch(layer, nq int) int
	// Scores writes, for kv head h, stored positions j in [p0, p1)
	// (p1 ≤ Len of the layer) and query rows i < nq,
	//
	//	s[i*lds + j−p0] = q_i · k_j   (no 1/√head_dim scaling)
	//
	// where q_i = q[i*ldq : i*ldq+head_dim] and k_j is key j as Read
	// would return it. scratch holds AttendScratch(layer, nq) elements.
	Scores(layer, h, p0, p1, nq int, q []float32, ldq int, s []float32, lds int, scratch []float32)
	// AccumV adds, for kv head h and query rows i < nq,
	//
	//	out[i*ldo : i*ldo+head_dim] += Σ_{j ∈ [p0, p1)} p[i*ldp + j−p0] · v_j
	//
	// with v_j value j as Read would return it.
	AccumV(layer, h, p0, p1, nq int, p []float32, ldp int, out []float32, ldo int, scratch []float32)
}
