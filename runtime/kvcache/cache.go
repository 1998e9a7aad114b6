package kvcache

import (
	"fmt"
	"math"

	"github.com/lmpack/lmpack/quantize/kvq"
	"github.com/lmpack/lmpack/runtime"
	"github.com/lmpack/lmpack/runtime/kernels"
)

// chunkTokens is how many tokens are transformed and quantized together
// (a multiple of every block size); readTokens how many are dequantized
// and un-rotated together on Read.
const (
	chunkTokens = 32
	readTokens  = 64
	ringSlack   = 32
)

// side is the K or the V half of one layer.
type side struct {
	st  store
	rot rotKind
	// r is the layer's rotation R and rt its transpose, [head_dim,
	// head_dim] row-major, for rotMatrix (both directions then run as
	// kernels.MatMulNT, whose m = 1 path is the fast decode GEMV).
	r, rt []float32
	// clip is the clipping ratio; 0 = none.
	clip float64
	// norm: one fp32 ℓ2 norm per quantized token (OScaR keys), in the
	// region norms of the cache's pages ([bt] float32 per block).
	norm  bool
	norms region
	// raw is st's form for attention (attend.go); nil when it has none.
	raw rawStore
}

// layerState is one layer's tokens. Positions [0, min(len, sink)) are in
// sinkK/sinkV, [sink, q) in the quantized stores (store index p−sink),
// [q, len) in the fp16 ring (slot p mod ring). ringPos[slot] is the
// position whose binary16 row the slot holds (−1: none); rows stay in the
// ring after they are quantized until overwritten, so Truncate can bring
// them back into the fp16 window. The sink and the ring are head-major
// ([kv head][rows][head_dim]: row16), so that one head's window is
// contiguous for attention.
type layerState struct {
	nkv, hd, kvDim int
	len, q         int
	sinkK, sinkV   []uint16 // [nkv, sink, head_dim] binary16
	ringK, ringV   []uint16 // [nkv, ring, head_dim] binary16
	ringPos        []int    // [ring]
	k, v           side
}

// cache is the quantized runtime.KVCache of every method but fp32 from
// New, and of every method from a Pool.
type cache struct {
	name                      string
	layers                    []layerState
	kvDim                     []int
	n, cap                    int
	sink, recent, block, ring int
	// pg maps store indices to blocks; pool is the Pool the cache came
	// from (nil for New), reserved the bytes it reserved there.
	pg       *pages
	pool     *Pool
	reserved int64
	// scratch: [chunkTokens, max kvDim] rows for K and V and their
	// rotated copies; [readTokens, max head_dim] for Read.
	xk, xv, yk, yv, tmp []float32
}

var (
	_ runtime.KVCache     = (*cache)(nil)
	_ Sizer               = (*cache)(nil)
	_ runtime.QuantizedKV = (*cache)(nil)
)

// checkSpec validates what newCache needs beyond checkLayers: rotations
// and Hadamard head_dims.
func checkSpec(sp spec, layers []Layer, opt Options) error {
	if sp.needRot {
		if opt.Rotations == nil {
			return fmt.Errorf("%w: method %q", ErrNoRotations, sp.name)
		}
		if err := checkRotations(opt.Rotations, layers, sp.mixed); err != nil {
			return fmt.Errorf("method %q: %w", sp.name, err)
		}
	}
	for i, l := range layers {
		if (sp.k.rot == rotHadamard || sp.v.rot == rotHadamard) && !isPow2(l.HeadDim) {
			return fmt.Errorf("%w: method %q: layer %d: head_dim %d is not a power of two (Hadamard rotation)", ErrBadShape, sp.name, i, l.HeadDim)
		}
	}
	if sp.check != nil {
		if err := sp.check(layers); err != nil {
			return fmt.Errorf("%w: method %q: %v", ErrBadShape, sp.name, err)
		}
	}
	return nil
}

// windows returns the sink and recent window of sp for capacity.
func windows(sp spec, capacity int, opt Options) (sink, recent int) {
	sink, recent = opt.Sink, opt.Recent
	if sp.noWindows {
		sink, recent = 0, 0
	}
	if recent == 0 && !opt.ExactWindows {
		recent = sp.defaultRecent
	}
	return min(sink, capacity), recent
}

// ringSize is the fp16 ring of a cache, at most capacity rows. New's
// caches (slack ringSlack) hold max(Recent, block) + slack rows (at least
// 1), so that a cancelled Forward of up to slack tokens finds the rows it
// pushed out of the window. A Pool's (slack 0) hold exactly the window:
// at most max(Recent, block−1) tokens are ever pending (Write quantizes
// a block while more than Recent and at least a block are), so 0 rows
// when no token ever waits (per-token methods without a recent window).
func ringSize(sp spec, recent, slack, capacity int) int {
	if slack > 0 {
		return max(1, min(max(recent, sp.block)+slack, capacity))
	}
	return min(max(recent, sp.block-1), capacity)
}

// newCache returns an empty cache of sp for New: its pages come from a
// private source, all taken at once, each page one block of pageTokens
// tokens (capacity−sink rounded up to the method's block: one page, so
// the storage is laid out [kv head][capacity][row] as contiguous
// preallocated arrays would be), and its ring has ringSlack slack.
func newCache(sp spec, layers []Layer, capacity int, opt Options) (*cache, error) {
	return newCachePaged(sp, layers, capacity, opt, 0, ringSlack)
}

// newCachePaged is newCache with pages of bt tokens (0: one page) and the
// given ring slack.
func newCachePaged(sp spec, layers []Layer, capacity int, opt Options, bt, slack int) (*cache, error) {
	if err := checkLayers(layers, capacity, opt); err != nil {
		return nil, err
	}
	if err := checkSpec(sp, layers, opt); err != nil {
		return nil, err
	}
	sink, _ := windows(sp, capacity, opt)
	if bt == 0 {
		bt = max(1, (capacity-sink+sp.block-1)/sp.block*sp.block)
	}
	c := &cache{}
	lay := c.init(sp, layers, capacity, opt, bt, slack)
	src := &privateSource{lay: lay}
	c.pg.src = src
	for j := range c.pg.tab {
		c.pg.tab[j] = src.take()
	}
	return c, nil
}

// privateSource makes fresh blocks of one layout (New's caches: no
// budget).
type privateSource struct{ lay layout }

func (s *privateSource) take() *block { return s.lay.newBlock() }

// init initializes c as an empty cache of sp (validated) with pages of
// bt tokens (a multiple of sp.block) and ring slack, and returns the
// block layout. The page table is empty (nil pages) and c.pg.src unset.
// A cache released to a Pool is initialized again by reset.
func (c *cache) init(sp spec, layers []Layer, capacity int, opt Options, bt, slack int) layout {
	c.name, c.block = sp.name, sp.block
	c.pg = &pages{bt: bt}
	lay := layout{bt: bt}
	var maxKV, maxHD int
	for i, l := range layers {
		kvDim := l.NumKVHeads * l.HeadDim
		maxKV, maxHD = max(maxKV, kvDim), max(maxHD, l.HeadDim)
		L := layerState{nkv: l.NumKVHeads, hd: l.HeadDim, kvDim: kvDim}
		ks, vs := sp.k, sp.v
		if sp.mixed {
			ks.bits, vs.bits = opt.Rotations.BitsK[i], opt.Rotations.BitsV[i]
		}
		if sp.stores != nil {
			kst, vst := sp.stores(i, len(layers), l, &lay, c.pg)
			L.k, L.v = side{st: kst}, side{st: vst}
		} else {
			L.k = newSide(ks, l, &lay, c.pg, sp.block)
			L.v = newSide(vs, l, &lay, c.pg, sp.block)
		}
		if sp.needRot && opt.Rotations != nil { // nil: BitsAt's probe
			r := opt.Rotations
			L.k.r, L.v.r = r.K[i], r.V[i]
			L.k.rt, L.v.rt = transpose(r.K[i], l.HeadDim), transpose(r.V[i], l.HeadDim)
			// Each side clips with the ratios of its own width (the INT2
			// ratios only at 2 bits).
			if ck, _ := r.clipFor(ks.bits); ck != nil && ks.clip {
				L.k.clip = ck[i]
			}
			if _, cv := r.clipFor(vs.bits); cv != nil && vs.clip {
				L.v.clip = cv[i]
			}
		}
		L.k.raw, L.v.raw = rawOf(L.k.st), rawOf(L.v.st)
		c.layers = append(c.layers, L)
		c.kvDim = append(c.kvDim, kvDim)
	}
	c.xk, c.xv = make([]float32, chunkTokens*maxKV), make([]float32, chunkTokens*maxKV)
	c.yk, c.yv = make([]float32, chunkTokens*maxKV), make([]float32, chunkTokens*maxKV)
	c.tmp = make([]float32, readTokens*maxHD)
	c.reset(sp, capacity, opt, slack)
	return lay
}

// reset empties c (built by init for sp) for capacity tokens: windows,
// ring and an empty page table sized for capacity, reusing the buffers
// that are large enough. Its stores keep their regions: they do not
// depend on the capacity.
func (c *cache) reset(sp spec, capacity int, opt Options, slack int) {
	c.sink, c.recent = windows(sp, capacity, opt)
	c.n, c.cap = 0, capacity
	c.ring = ringSize(sp, c.recent, slack, capacity)
	c.pg.tab = resize(c.pg.tab, (capacity-c.sink+c.pg.bt-1)/c.pg.bt)
	clear(c.pg.tab)
	for i := range c.layers {
		L := &c.layers[i]
		L.len, L.q = 0, c.sink
		L.sinkK, L.sinkV = resize(L.sinkK, c.sink*L.kvDim), resize(L.sinkV, c.sink*L.kvDim)
		L.ringK, L.ringV = resize(L.ringK, c.ring*L.kvDim), resize(L.ringV, c.ring*L.kvDim)
		L.ringPos = resize(L.ringPos, c.ring)
		for j := range L.ringPos {
			L.ringPos[j] = -1
		}
	}
}

// resize returns s[:n] when s can hold n elements, else a new slice.
func resize[T any](s []T, n int) []T {
	if cap(s) >= n {
		return s[:n]
	}
	return make([]T, n)
}

// row16 is the binary16 row of kv head h at row r of a head-major
// window buffer buf ([nkv, rows, hd]: the sink or the ring).
func row16(buf []uint16, rows, hd, h, r int) []uint16 {
	o := (h*rows + r) * hd
	return buf[o : o+hd]
}

// putRow16 writes the token x ([nkv·hd] float32, head-major as Write's
// rows) into row r of every head of buf ([nkv, rows, hd]) as binary16.
func putRow16(buf []uint16, rows, nkv, hd, r int, x []float32) {
	for h := 0; h < nkv; h++ {
		kvq.EncodeF16(row16(buf, rows, hd, h, r), x[h*hd:(h+1)*hd])
	}
}

// getRow16 is putRow16's inverse (exact): row r of every head into x.
func getRow16(x []float32, buf []uint16, rows, nkv, hd, r int) {
	for h := 0; h < nkv; h++ {
		kvq.DecodeF16(x[h*hd:(h+1)*hd], row16(buf, rows, hd, h, r))
	}
}

// newSide builds a side of ss for layer l, claiming its regions of lay in
// the pages p.
func newSide(ss sideSpec, l Layer, lay *layout, p *pages, block int) side {
	nkv, hd := l.NumKVHeads, l.HeadDim
	s := side{rot: ss.rot}
	switch ss.store {
	case storeF16:
		s.st = newF16Store(lay, p, nkv, hd)
	case storeF32:
		s.st = newF32Store(lay, p, nkv, hd)
	case storeAsym:
		g := ss.group
		switch {
		case g == groupKIVI && hd%32 == 0:
			g = 32
		case g <= 0 || hd%g != 0:
			g = hd
		}
		s.st = newAsymStore(lay, p, nkv, hd, ss.bits, g)
	case storeSym2:
		s.st = newSym2Store(lay, p, nkv, hd)
	case storeChannel:
		s.st = newChannelStore(lay, p, nkv, hd, ss.bits, block)
	}
	if ss.tokenNorm {
		s.norm = true
		s.norms = lay.f32Rows(1, 1, 1)
	}
	return s
}

// transpose returns the transpose of a [d, d] row-major matrix.
func transpose(r []float32, d int) []float32 {
	t := make([]float32, d*d)
	for i := 0; i < d; i++ {
		for j := 0; j < d; j++ {
			t[j*d+i] = r[i*d+j]
		}
	}
	return t
}

// Len implements runtime.KVCache.
func (c *cache) Len() int { return c.n }

// Cap implements runtime.KVCache.
func (c *cache) Cap() int { return c.cap }

// Commit implements runtime.KVCache.
func (c *cache) Commit(n int) { c.n += n }

// Truncate implements runtime.KVCache. The fp16 windows are rebuilt for
// the new length from the binary16 rows still in the ring (always the
// case after a cancelled Forward of up to 32 tokens, and for the window
// rows not yet overwritten otherwise); tokens whose rows are gone stay
// quantized. A per-channel key block cut by the truncation whose rows are
// gone is decoded back into the fp16 residual as its dequantized values,
// so that blocks stay whole.
func (c *cache) Truncate(n int) {
	n = max(n, 0)
	for i := range c.layers {
		c.truncateLayer(&c.layers[i], n)
	}
	c.n = min(c.n, n)
}

// idealQ returns the quantized watermark that writing n tokens into an
// empty layer gives: the oldest pending tokens are quantized a block at a
// time while more than Recent (and at least a block) are pending.
func (c *cache) idealQ(q, n int) int { return idealQ(q, n, c.recent, c.block) }

// idealQ is cache.idealQ for a window of recent tokens and blocks of
// block tokens.
func idealQ(q, n, recent, block int) int {
	for m := n - q; m > recent && m >= block; m -= block {
		q += block
	}
	return q
}

// inRing reports whether the ring holds the rows of positions [a, b).
func (c *cache) inRing(L *layerState, a, b int) bool {
	if c.ring == 0 {
		return a >= b
	}
	for p := a; p < b; p++ {
		if L.ringPos[p%c.ring] != p {
			return false
		}
	}
	return true
}

func (c *cache) truncateLayer(L *layerState, n int) {
	if n >= L.len {
		return
	}
	L.len = n
	for j, p := range L.ringPos {
		if p >= n {
			L.ringPos[j] = -1
		}
	}
	if n <= c.sink {
		L.q = c.sink
		return
	}
	if n < L.q {
		bs := c.sink + (n-c.sink)/c.block*c.block
		if t := n - bs; t > 0 && !c.inRing(L, bs, n) {
			c.decodeToRing(L, bs, n)
		}
		L.q = bs
	}
	// Give back to the window what the ring still holds.
	for want := c.idealQ(c.sink, n); L.q > want && L.q-c.block >= c.sink && c.inRing(L, L.q-c.block, L.q); {
		L.q -= c.block
	}
}

// decodeToRing writes the dequantized rows of positions [a, b) (fewer
// than chunkTokens) into the ring as binary16.
func (c *cache) decodeToRing(L *layerState, a, b int) {
	t := b - a
	for h := 0; h < L.nkv; h++ {
		for s, sd := range []*side{&L.k, &L.v} {
			x, y := c.xk, c.yk
			if s == 1 {
				x, y = c.xv, c.yv
			}
			c.decode(L, sd, h, a-c.sink, b-c.sink, y[:t*L.hd])
			for r := 0; r < t; r++ {
				copy(x[r*L.kvDim+h*L.hd:r*L.kvDim+(h+1)*L.hd], y[r*L.hd:(r+1)*L.hd])
			}
		}
	}
	for r := 0; r < t; r++ {
		slot := (a + r) % c.ring
		putRow16(L.ringK, c.ring, L.nkv, L.hd, slot, c.xk[r*L.kvDim:(r+1)*L.kvDim])
		putRow16(L.ringV, c.ring, L.nkv, L.hd, slot, c.xv[r*L.kvDim:(r+1)*L.kvDim])
		L.ringPos[slot] = a + r
	}
}

// Write implements runtime.KVCache: k, v are [n, kvDim] row-major float32
// post-RoPE keys and values of positions [pos, pos+n) of layer. pos may
// be at most the layer's length (writing at an earlier position first
// forgets the tokens from there on). Tokens in the sink go to fp16; the
// oldest pending tokens are transformed and quantized while more than
// Recent are pending (a block at a time for per-channel keys); the rest
// wait in the fp16 window. It panics (a caller bug) when [pos, pos+n)
// passes the capacity, leaves a gap, or k, v are short.
func (c *cache) Write(layer, pos, n int, k, v []float32) {
	L := &c.layers[layer]
	d := L.kvDim
	if pos < 0 || n < 0 || pos+n > c.cap {
		panic(fmt.Sprintf("kvcache: %s: Write: positions [%d,%d) outside capacity %d", c.name, pos, pos+n, c.cap))
	}
	if pos > L.len {
		panic(fmt.Sprintf("kvcache: %s: Write: layer %d holds %d tokens, cannot write at position %d", c.name, layer, L.len, pos))
	}
	if len(k) < n*d || len(v) < n*d {
		panic(fmt.Sprintf("kvcache: %s: Write: k has %d, v %d values, want %d×%d", c.name, len(k), len(v), n, d))
	}
	if pos < L.len {
		c.truncateLayer(L, pos)
	}
	end := pos + n
	for p := pos; p < min(end, c.sink); p++ {
		putRow16(L.sinkK, c.sink, L.nkv, L.hd, p, k[(p-pos)*d:(p-pos+1)*d])
		putRow16(L.sinkV, c.sink, L.nkv, L.hd, p, v[(p-pos)*d:(p-pos+1)*d])
	}
	q := c.idealQ(L.q, end)
	for a := L.q; a < q; a += chunkTokens {
		b := min(q, a+chunkTokens)
		for p := a; p < b; p++ {
			xk, xv := c.xk[(p-a)*d:(p-a+1)*d], c.xv[(p-a)*d:(p-a+1)*d]
			if p < pos {
				slot := p % c.ring
				getRow16(xk, L.ringK, c.ring, L.nkv, L.hd, slot)
				getRow16(xv, L.ringV, c.ring, L.nkv, L.hd, slot)
			} else {
				copy(xk, k[(p-pos)*d:])
				copy(xv, v[(p-pos)*d:])
			}
		}
		c.encode(L, &L.k, a-c.sink, b-a, c.xk, c.yk)
		c.encode(L, &L.v, a-c.sink, b-a, c.xv, c.yv)
	}
	for p := max(q, pos, c.sink); p < end; p++ {
		slot := p % c.ring
		putRow16(L.ringK, c.ring, L.nkv, L.hd, slot, k[(p-pos)*d:(p-pos+1)*d])
		putRow16(L.ringV, c.ring, L.nkv, L.hd, slot, v[(p-pos)*d:(p-pos+1)*d])
		L.ringPos[slot] = p
	}
	L.q, L.len = q, end
}

// encode transforms t tokens x ([t, kvDim], modified; y is scratch of the
// same size) into the side's quantization space and stores them at store
// index i0: rotation per head, token norm, clipping, quantization.
func (c *cache) encode(L *layerState, sd *side, i0, t int, x, y []float32) {
	d, hd := L.kvDim, L.hd
	switch sd.rot {
	case rotHadamard:
		for r := 0; r < t; r++ {
			for h := 0; h < L.nkv; h++ {
				kvq.FWHT(x[r*d+h*hd : r*d+(h+1)*hd])
			}
		}
	case rotMatrix:
		for h := 0; h < L.nkv; h++ {
			kernels.MatMulNT(t, hd, hd, x[h*hd:], d, sd.rt, hd, y[h*hd:], d)
		}
		x = y
	}
	if sd.norm {
		for r := 0; r < t; r++ {
			row := x[r*d : (r+1)*d]
			var s float64
			for _, e := range row {
				s += float64(e) * float64(e)
			}
			nrm := float32(math.Sqrt(s))
			c.pg.put(i0 + r).f32[sd.norms.at(c.pg, 0, i0+r)] = nrm
			if nrm > 0 {
				kernels.Scale(1/nrm, row)
			}
		}
	}
	if sd.clip > 0 && sd.clip < 1 {
		for r := 0; r < t; r++ {
			for h := 0; h < L.nkv; h++ {
				kvq.Clip(x[r*d+h*hd:r*d+(h+1)*hd], sd.clip)
			}
		}
	}
	sd.st.put(i0, t, x, d)
}

// decode writes store tokens [i0, i1) of head h in the original space
// into dst ([i1−i0, head_dim]).
func (c *cache) decode(L *layerState, sd *side, h, i0, i1 int, dst []float32) {
	hd := L.hd
	if sd.rot == rotNone && !sd.norm {
		sd.st.get(h, i0, i1, dst)
		return
	}
	for a := i0; a < i1; a += readTokens {
		b := min(i1, a+readTokens)
		t := b - a
		out := dst[(a-i0)*hd : (b-i0)*hd]
		x := out
		if sd.rot == rotMatrix {
			x = c.tmp[:t*hd]
		}
		sd.st.get(h, a, b, x)
		if sd.norm {
			for r := 0; r < t; r++ {
				kernels.Scale(c.pg.get(a + r).f32[sd.norms.at(c.pg, 0, a+r)], x[r*hd:(r+1)*hd])
			}
		}
		switch sd.rot {
		case rotHadamard:
			for r := 0; r < t; r++ {
				kvq.FWHT(x[r*hd : (r+1)*hd])
			}
		case rotMatrix:
			kernels.MatMulNT(t, hd, hd, x, hd, sd.r, hd, out, hd)
		}
	}
}

// Read implements runtime.KVCache: tokens [0, n) of layer and kv head h
// into k, v ([n, head_dim] row-major float32), dequantized and un-rotated
// (fp16 windows converted). It panics if n exceeds the layer's length.
func (c *cache) Read(layer, h, n int, k, v []float32) {
	L := &c.layers[layer]
	if n > L.len || n < 0 {
		panic(fmt.Sprintf("kvcache: %s: Read: %d tokens of layer %d, which holds %d", c.name, n, layer, L.len))
	}
	hd := L.hd
	for p := 0; p < min(n, c.sink); p++ {
		kvq.DecodeF16(k[p*hd:(p+1)*hd], row16(L.sinkK, c.sink, hd, h, p))
		kvq.DecodeF16(v[p*hd:(p+1)*hd], row16(L.sinkV, c.sink, hd, h, p))
	}
	if qe := min(n, L.q); qe > c.sink {
		c.decode(L, &L.k, h, 0, qe-c.sink, k[c.sink*hd:qe*hd])
		c.decode(L, &L.v, h, 0, qe-c.sink, v[c.sink*hd:qe*hd])
	}
	for p := max(L.q, c.sink); p < n; p++ {
		slot := p % c.ring
		kvq.DecodeF16(k[p*hd:(p+1)*hd], row16(L.ringK, c.ring, hd, h, slot))
		kvq.DecodeF16(v[p*hd:(p+1)*hd], row16(L.ringV, c.ring, hd, h, slot))
	}
}

// Bytes implements runtime.KVCache: the bytes held for the Len() stored
// tokens: fp16 sink and recent rows (2 bytes per element), the quantized
// stores' codes, scales and zero points, and OScaR's fp32 token norms.
// Allocated but unused capacity is not counted.
func (c *cache) Bytes() int64 {
	var s int64
	for i := range c.layers {
		L := &c.layers[i]
		n := c.n
		nq := max(0, min(L.q, n)-c.sink)
		fp := n - nq
		s += int64(fp) * int64(L.kvDim) * 4
		s += L.k.st.bytes(nq) + L.v.st.bytes(nq)
		if L.k.norm {
			s += 4 * int64(nq)
		}
		if L.v.norm {
			s += 4 * int64(nq)
		}
	}
	return s
}

// BitsPerElement implements Sizer.
func (c *cache) BitsPerElement() float64 { return bitsPerElement(c.Bytes(), c.n, c.kvDim) }

// QuantizedEnd implements runtime.QuantizedKV: the quantized watermark
// of layer once it holds n tokens (n ≥ its length; a smaller n gives the
// current watermark).
func (c *cache) QuantizedEnd(layer, n int) int {
	L := &c.layers[layer]
	if n <= L.len {
		return L.q
	}
	return c.idealQ(L.q, n)
}
