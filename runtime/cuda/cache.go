package cuda

import (
	"fmt"
	"math"
	"runtime"
	"strings"
	"sync"

	"github.com/lmpack/lmpack/quantize/kvq"
	lmruntime "github.com/lmpack/lmpack/runtime"
	"github.com/lmpack/lmpack/runtime/kvcache"
)

// CacheOptions configure a device KV cache.
type CacheOptions struct {
	// Method is "fp16" (every token binary16), "oscar2" (fp16 sink and
	// recent window, INT2 rotated and clipped rows otherwise; kvcache's
	// oscar2 method, docs/METHODS.md §1), "oscar4" (the same at INT4,
	// clipped with Rotations.ClipK4/ClipV4), or one of kvcache's per-token-row
	// kinds "int8", "int4", "q8_0", "q4_0", "fp8" (docs/METHODS.md §1, §3;
	// the table in doc.go), each with the same fp16 windows as oscar2.
	Method string
	// Sink and Recent are the fp16 windows of the quantized methods in
	// tokens (kvcache Options; OSCAR publishes 64 and 256; the
	// serving-engine kinds q8_0, q4_0 and fp8 reproduce their engines with
	// 0 and 0).
	Sink, Recent int
	// Rotations are oscar2's and oscar4's per-layer rotations and
	// clipping ratios.
	Rotations *kvcache.Rotations
	// Batch is the number of sequences (≥ 1; Model.Forward uses 1).
	Batch int
}

// DeviceCache is a KV cache in GPU memory (layout in kernels/kvcache.cu):
// binary16 rows, and for oscar2 INT2 codes with binary16 (scale, zero) per
// (token, kv head) row. Every token past the sink is quantized when it is
// appended and also kept in a binary16 ring of Recent+32 slots; attention
// reads positions [max(sink, n−Recent), n) from the ring, which is the CPU
// cache's window. It implements runtime.KVCache (Write and Read copy
// through the host) but only Model.Forward of the model that made it
// fills it on the device.
type DeviceCache struct {
	m                        *Model
	method                   string
	kind, bits               int // row format of the codes (kvKinds), 0 for fp16
	B, n, cap                int
	sink, recent, ring, capQ int
	hi                       int // highest position+1 ever written
	layers                   []cacheLayer
	mem                      *cacheMem
}

type cacheLayer struct {
	nkv, hd                    int
	rb                         int // bytes per quantized row (kvRowBytes)
	sinkK, sinkV, ringK, ringV DevPtr
	codesK, codesV, parK, parV DevPtr
	rk, rv                     DevPtr // rotations [hd, hd] f32, or 0
	clipK, clipV               int    // k-th smallest |y| index, −1 = none
	hostRK, hostRV             []float32
}

var _ lmruntime.KVCache = (*DeviceCache)(nil)

// Row kinds of the quantized region (kernels/common.cuh KV_*).
const (
	kvASYM = 1
	kvQ8_0 = 2
	kvQ4_0 = 3
	kvFP8  = 4
)

// kvKinds maps the quantized device methods to their row kind and width.
var kvKinds = map[string]struct{ kind, bits int }{
	"oscar2": {kvASYM, 2},
	"oscar4": {kvASYM, 4},
	"int8":   {kvASYM, 8},
	"int4":   {kvASYM, 4},
	"q8_0":   {kvQ8_0, 8},
	"q4_0":   {kvQ4_0, 4},
	"fp8":    {kvFP8, 8},
}

// DeviceKVMethods returns the KV cache methods NewDeviceCache takes
// (runtime/kvcache names), sorted.
func DeviceKVMethods() []string {
	return []string{"fp16", "fp8", "int4", "int8", "oscar2", "oscar4", "q4_0", "q8_0"}
}

// attnVariant is the infix of the attention kernel a cache's layout
// takes: "" (attn_split_g<MG>, compiled for fp16 and oscar2's INT2 rows)
// or "_kv" (attn_split_kv_g<MG>, every row kind at run time).
func (c *DeviceCache) attnVariant() string {
	if c.kind == 0 || (c.kind == kvASYM && c.bits == 2) {
		return ""
	}
	return "_kv"
}

// kvRowBytes is kernels/common.cuh kv_row_bytes: the bytes of one
// quantized (token, kv head) row of hd values.
func kvRowBytes(kind, bits, hd int) int {
	switch kind {
	case kvASYM:
		return hd * bits / 8
	case kvQ8_0:
		return hd / 32 * 34
	case kvQ4_0:
		return hd / 32 * 18
	}
	return hd
}

// ggmlHadamard returns llama.cpp's q8_0/q4_0 KV rotation at head_dim hd
// as a dense [hd, hd] float32 matrix (runtime/kvcache store_ggml.go:
// the normalized Hadamard matrix of size n, block diagonal over runs of
// n values, n the largest power of two ≥ 64 dividing hd for K and 64 for
// V), or nil when hd is not a multiple of 64 (no rotation).
func ggmlHadamard(hd int, key bool) []float32 {
	if hd%64 != 0 {
		return nil
	}
	n := 64
	for key && hd%(2*n) == 0 {
		n *= 2
	}
	h := kvq.HadamardMatrix(n)
	r := make([]float32, hd*hd)
	for b := 0; b < hd; b += n {
		for i := 0; i < n; i++ {
			for j := 0; j < n; j++ {
				r[(b+i)*hd+b+j] = float32(h[i*n+j])
			}
		}
	}
	return r
}

// NewCache implements runtime.Model with an fp16 DeviceCache of one
// sequence. It panics when device memory runs out (runtime.Model's
// NewCache has no error); use NewDeviceCache to get the error.
func (m *Model) NewCache(capacity int) lmruntime.KVCache {
	c, err := m.NewDeviceCache(capacity, CacheOptions{Method: "fp16"})
	if err != nil {
		panic(err)
	}
	return c
}

// NewDeviceCache returns an empty device cache of capacity tokens per
// sequence. Errors: an unknown method, oscar2/oscar4 without rotations or with
// rotations of the wrong size (kvcache.ErrBadShape), q8_0/q4_0 at a
// head_dim that is not a multiple of 32 (kvcache.ErrBadShape, naming the
// layer), device memory. Other kvcache methods (kivi2, quarot2, oscar4,
// oscar-mixed, oscars2, int2-naive, turboquant_*, int4_per_token_head)
// are refused with an error naming the method and DeviceKVMethods.
func (m *Model) NewDeviceCache(capacity int, o CacheOptions) (*DeviceCache, error) {
	if capacity < 1 {
		return nil, fmt.Errorf("cuda: cache capacity %d, want ≥ 1", capacity)
	}
	B := max(o.Batch, 1)
	c := &DeviceCache{m: m, method: o.Method, B: B, cap: capacity}
	switch o.Method {
	case "fp16":
		c.ring = capacity
	case "oscar2", "oscar4":
		if o.Rotations == nil {
			return nil, fmt.Errorf("%w: method %q", kvcache.ErrNoRotations, o.Method)
		}
		if o.Sink < 0 || o.Recent < 0 {
			return nil, fmt.Errorf("%w: Sink %d, Recent %d, want ≥ 0", kvcache.ErrBadShape, o.Sink, o.Recent)
		}
		c.sink = min(o.Sink, capacity)
		c.recent = o.Recent
		c.ring = max(1, min(c.recent+32, capacity))
		c.capQ = capacity - c.sink
	case "int8", "int4", "q8_0", "q4_0", "fp8":
		if o.Sink < 0 || o.Recent < 0 {
			return nil, fmt.Errorf("%w: Sink %d, Recent %d, want ≥ 0", kvcache.ErrBadShape, o.Sink, o.Recent)
		}
		c.sink = min(o.Sink, capacity)
		c.recent = o.Recent
		c.ring = max(1, min(c.recent+32, capacity))
		c.capQ = capacity - c.sink
		if o.Method == "q8_0" || o.Method == "q4_0" {
			for i, l := range m.layers {
				if l.hd%32 != 0 {
					return nil, fmt.Errorf("%w: layer %d: head_dim %d is not a multiple of 32 (llama.cpp's block size for %s KV)", kvcache.ErrBadShape, i, l.hd, o.Method)
				}
			}
		}
	default:
		return nil, fmt.Errorf("cuda: KV cache method %q: the CUDA backend's device cache supports %s (the other kvcache methods run on the CPU backend)", o.Method, strings.Join(DeviceKVMethods(), ", "))
	}
	if kk, ok := kvKinds[o.Method]; ok {
		c.kind, c.bits = kk.kind, kk.bits
	}
	if err := m.ensureRope(capacity); err != nil {
		return nil, err
	}
	r := o.Rotations
	oscar := o.Method == "oscar2" || o.Method == "oscar4"
	// oscar2 clips with ClipK/ClipV, oscar4 with ClipK4/ClipV4 (kvcache's
	// Rotations.clipFor).
	var clipK, clipV []float64
	nameK, nameV := "ClipK", "ClipV"
	if r != nil && oscar {
		clipK, clipV = r.ClipK, r.ClipV
		if o.Method == "oscar4" {
			clipK, clipV, nameK, nameV = r.ClipK4, r.ClipV4, "ClipK4", "ClipV4"
		}
		if len(r.K) != len(m.layers) || len(r.V) != len(m.layers) {
			return nil, fmt.Errorf("%w: Rotations has %d K and %d V matrices, want %d", kvcache.ErrBadShape, len(r.K), len(r.V), len(m.layers))
		}
		if (clipK != nil && len(clipK) != len(m.layers)) || (clipV != nil && len(clipV) != len(m.layers)) {
			return nil, fmt.Errorf("%w: Rotations has %d %s and %d %s ratios, want %d (or none)", kvcache.ErrBadShape, len(clipK), nameK, len(clipV), nameV, len(m.layers))
		}
	}
	c.mem = &cacheMem{dev: m.dev}
	m.trackCache(c.mem)
	// A cache dropped without Free gives its memory back when collected;
	// Model.Close frees the rest.
	runtime.AddCleanup(c, func(cm *cacheMem) {
		m.untrackCache(cm)
		cm.free()
	}, c.mem)
	alloc := func(n int64) (DevPtr, error) {
		p, err := m.dev.Alloc(n)
		if err == nil {
			c.mem.add(p)
		}
		return p, err
	}
	for i := range m.layers {
		l := &m.layers[i]
		L := cacheLayer{nkv: l.nkv, hd: l.hd, clipK: -1, clipV: -1}
		rows := int64(B) * int64(l.nkv)
		var err error
		for _, p := range []*DevPtr{&L.ringK, &L.ringV} {
			if *p, err = alloc(2 * rows * int64(c.ring) * int64(l.hd)); err != nil {
				c.Free()
				return nil, err
			}
		}
		if c.kind != 0 {
			d := l.hd
			L.rb = kvRowBytes(c.kind, c.bits, d)
			for _, p := range []*DevPtr{&L.sinkK, &L.sinkV} {
				if *p, err = alloc(2 * rows * int64(max(c.sink, 1)) * int64(d)); err != nil {
					c.Free()
					return nil, err
				}
			}
			for _, p := range []*DevPtr{&L.codesK, &L.codesV} {
				if *p, err = alloc(rows * int64(max(c.capQ, 1)) * int64(L.rb)); err != nil {
					c.Free()
					return nil, err
				}
			}
			if c.kind == kvASYM {
				for _, p := range []*DevPtr{&L.parK, &L.parV} {
					if *p, err = alloc(4 * rows * int64(max(c.capQ, 1))); err != nil {
						c.Free()
						return nil, err
					}
				}
			}
		}
		if o.Method == "q8_0" || o.Method == "q4_0" {
			L.hostRK, L.hostRV = ggmlHadamard(l.hd, true), ggmlHadamard(l.hd, false)
		}
		if oscar {
			d := l.hd
			if len(r.K[i]) != d*d || len(r.V[i]) != d*d {
				c.Free()
				return nil, fmt.Errorf("%w: layer %d: rotation sizes %d and %d, want head_dim² = %d", kvcache.ErrBadShape, i, len(r.K[i]), len(r.V[i]), d*d)
			}
			L.hostRK, L.hostRV = r.K[i], r.V[i]
			if clipK != nil {
				L.clipK = clipIndex(clipK[i], d)
			}
			if clipV != nil {
				L.clipV = clipIndex(clipV[i], d)
			}
		}
		for _, x := range []struct {
			p *DevPtr
			v []float32
		}{{&L.rk, L.hostRK}, {&L.rv, L.hostRV}} {
			if x.v == nil {
				continue
			}
			if *x.p, err = alloc(int64(4 * len(x.v))); err != nil {
				c.Free()
				return nil, err
			}
			if err := Upload(m.dev, *x.p, x.v); err != nil {
				c.Free()
				return nil, err
			}
		}
		c.layers = append(c.layers, L)
	}
	return c, nil
}

// clipIndex is kvq.Clip's τ index ⌊ratio·n⌋ clamped to [0, n−1], or −1
// (no clipping) for ratios ≥ 1 or ≤ 0 (the CPU cache clips only for
// 0 < ratio < 1).
func clipIndex(ratio float64, n int) int {
	if !(ratio > 0 && ratio < 1) {
		return -1
	}
	return min(int(math.Floor(ratio*float64(n))), n-1)
}

// Free releases the cache's device memory (also done when the cache is
// garbage collected, and by Model.Close); it returns the first cuMemFree
// error. The cache must not be used afterwards.
func (c *DeviceCache) Free() error {
	c.m.untrackCache(c.mem)
	return c.mem.free()
}

// cacheMem is the device memory of one DeviceCache, kept apart from it so
// that a cleanup can free it once the cache is unreachable.
type cacheMem struct {
	dev    *Device
	mu     sync.Mutex
	allocs []DevPtr
}

func (cm *cacheMem) add(p DevPtr) {
	cm.mu.Lock()
	cm.allocs = append(cm.allocs, p)
	cm.mu.Unlock()
}

// free releases every allocation (once) and returns the first error.
func (cm *cacheMem) free() error {
	cm.mu.Lock()
	defer cm.mu.Unlock()
	var first error
	for _, p := range cm.allocs {
		if err := cm.dev.Free(p); err != nil && first == nil {
			first = err
		}
	}
	cm.allocs = nil
	return first
}

// trackCache and untrackCache keep the live caches' memory for Close.
func (m *Model) trackCache(cm *cacheMem) {
	m.cachesMu.Lock()
	defer m.cachesMu.Unlock()
	if m.caches == nil {
		m.caches = map[*cacheMem]struct{}{}
	}
	m.caches[cm] = struct{}{}
}

func (m *Model) untrackCache(cm *cacheMem) {
	m.cachesMu.Lock()
	delete(m.caches, cm)
	m.cachesMu.Unlock()
}

// Len implements runtime.KVCache.
func (c *DeviceCache) Len() int { return c.n }

// Cap implements runtime.KVCache.
func (c *DeviceCache) Cap() int { return c.cap }

// Commit implements runtime.KVCache.
func (c *DeviceCache) Commit(n int) { c.n += n }

// Truncate implements runtime.KVCache.
func (c *DeviceCache) Truncate(n int) { c.n = max(0, min(c.n, n)) }

// quantFloor is the lowest end of the INT2 region that attention may use
// for a query of the next call (before its append): max(sink, hi − ring),
// positions whose ring slot a later write overwrote being INT2 only; 0
// for fp16.
func (c *DeviceCache) quantFloor() int {
	if c.kind == 0 {
		return 0
	}
	return max(c.sink, c.hi-c.ring)
}

// windowStart is the first position read from the ring for a cache of n
// tokens: max(sink, n − Recent, hi − ring) for oscar2 (rows older than
// hi − ring may have been overwritten), 0 for fp16.
func (c *DeviceCache) windowStart(n int) int {
	if c.kind == 0 {
		return 0
	}
	return max(c.sink, n-c.recent, c.hi-c.ring)
}

// Bytes implements runtime.KVCache: binary16 rows (sink and window) at 2
// bytes per element, quantized rows at kvRowBytes (INT2: hd/4) plus 4
// bytes of parameters for the asymmetric kinds,
// for the Len() stored tokens of every sequence (the ring's copies of
// quantized tokens and unused capacity are not counted).
func (c *DeviceCache) Bytes() int64 {
	var s int64
	ws := c.windowStart(c.n)
	for _, L := range c.layers {
		rows := int64(c.B) * int64(L.nkv)
		if c.method == "fp16" {
			s += rows * int64(c.n) * int64(L.hd) * 4
			continue
		}
		fp := int64(min(c.n, c.sink) + max(0, c.n-ws))
		q := int64(max(0, ws-c.sink))
		par := 0
		if c.kind == kvASYM {
			par = 4
		}
		s += rows * (fp*int64(L.hd)*4 + q*2*int64(L.rb+par))
	}
	return s
}

// Write implements runtime.KVCache for sequence 0: k, v [n, kvDim]
// float32 rows are uploaded and appended (quantized for oscar2) by the
// kv_append kernel. It panics on a device error (KVCache.Write has no
// error) or when pos+n passes the capacity.
func (c *DeviceCache) Write(layer, pos, n int, k, v []float32) {
	if pos+n > c.cap || pos < 0 {
		panic(fmt.Sprintf("cuda: DeviceCache.Write: positions [%d,%d) outside capacity %d", pos, pos+n, c.cap))
	}
	L := &c.layers[layer]
	kvDim := L.nkv * L.hd
	buf := make([]float32, 2*n*kvDim)
	for t := 0; t < n; t++ {
		copy(buf[t*2*kvDim:], k[t*kvDim:(t+1)*kvDim])
		copy(buf[t*2*kvDim+kvDim:], v[t*kvDim:(t+1)*kvDim])
	}
	p, err := c.m.dev.Alloc(int64(4 * len(buf)))
	if err != nil {
		panic(err)
	}
	defer c.m.dev.Free(p)
	if err := Upload(c.m.dev, p, buf); err != nil {
		panic(err)
	}
	if err := c.append(c.m.k, layer, p, 2*kvDim, 0, kvDim, pos, n, 1); err != nil {
		panic(err)
	}
	c.hi = max(c.hi, pos+n)
}

// append launches kv_append for T tokens of B sequences whose rows are at
// rows (ld floats apart, keys at koff, values at voff).
func (c *DeviceCache) append(k *Kernels, layer int, rows DevPtr, ld, koff, voff, pos, T, B int) error {
	L := &c.layers[layer]
	return k.Launch("kv_append", Dim{T, L.nkv, 2 * B}, Dim{roundUp(L.hd, 32), 1, 1},
		rows, ld, koff, voff, T, pos, L.nkv, L.hd,
		L.sinkK, L.sinkV, c.sink, L.ringK, L.ringV, c.ring,
		L.codesK, L.codesV, L.parK, L.parV, c.capQ,
		L.rk, L.rv, L.clipK, L.clipV, c.kind, c.bits)
}

// Read implements runtime.KVCache for sequence 0: tokens [0, n) of layer
// and kv head h, dequantized and un-rotated on the host. It panics on a
// device error.
func (c *DeviceCache) Read(layer, h, n int, k, v []float32) {
	L := &c.layers[layer]
	hd := L.hd
	dev := c.m.dev
	ws := c.windowStart(n)
	row16 := func(base DevPtr, slots, slot int, dst []float32) {
		b := make([]uint16, hd)
		if err := Download(dev, b, base+DevPtr(2*((h*slots+slot)*hd))); err != nil {
			panic(err)
		}
		kvq.DecodeF16(dst, b)
	}
	for p := 0; p < n; p++ {
		kd, vd := k[p*hd:(p+1)*hd], v[p*hd:(p+1)*hd]
		switch {
		case p < c.sink:
			row16(L.sinkK, c.sink, p, kd)
			row16(L.sinkV, c.sink, p, vd)
		case p < ws:
			qi := h*c.capQ + p - c.sink
			for _, x := range []struct {
				codes, par DevPtr
				r          []float32
				dst        []float32
			}{{L.codesK, L.parK, L.hostRK, kd}, {L.codesV, L.parV, L.hostRV, vd}} {
				cb := make([]byte, L.rb)
				if err := Download(dev, cb, x.codes+DevPtr(qi*L.rb)); err != nil {
					panic(err)
				}
				var pr []uint16
				if c.kind == kvASYM {
					pr = make([]uint16, 2)
					if err := Download(dev, pr, x.par+DevPtr(4*qi)); err != nil {
						panic(err)
					}
				}
				rot := make([]float32, hd)
				decodeKVRow(rot, cb, pr, c.kind, c.bits)
				if x.r == nil {
					copy(x.dst, rot)
					continue
				}
				// x = x_rot·Rᵀ: x[j] = Σ_i x_rot[i]·R[j, i].
				for j := 0; j < hd; j++ {
					var a float32
					for i := 0; i < hd; i++ {
						a += rot[i] * x.r[j*hd+i]
					}
					x.dst[j] = a
				}
			}
		default:
			row16(L.ringK, c.ring, p%c.ring, kd)
			row16(L.ringV, c.ring, p%c.ring, vd)
		}
	}
}

func roundUp(n, m int) int { return (n + m - 1) / m * m }

// decodeKVRow writes the len(dst) values of one quantized row (codes,
// kvRowBytes bytes; par the binary16 (scale, zero) of kvASYM rows) into
// dst, in the space the codes hold (rotated for oscar2, q8_0, q4_0), as
// kernels/common.cuh kv_code and kv_deq read them.
func decodeKVRow(dst []float32, codes []byte, par []uint16, kind, bits int) {
	switch kind {
	case kvASYM:
		kvq.DecodeAsym(dst, codes, bits, kvq.F16ToFloat32(par[0]), kvq.F16ToFloat32(par[1]))
	case kvQ8_0:
		for j := range dst {
			b := codes[j/32*34:]
			dst[j] = float32(int8(b[2+j%32])) * kvq.F16ToFloat32(uint16(b[0])|uint16(b[1])<<8)
		}
	case kvQ4_0:
		for j := range dst {
			b := codes[j/32*18:]
			jj := j % 32
			by := b[2+jj%16]
			q := int(by & 15)
			if jj >= 16 {
				q = int(by >> 4)
			}
			dst[j] = float32(q-8) * kvq.F16ToFloat32(uint16(b[0])|uint16(b[1])<<8)
		}
	case kvFP8:
		for j := range dst {
			dst[j] = kvq.F8E4M3ToFloat32(codes[j])
		}
	}
}
