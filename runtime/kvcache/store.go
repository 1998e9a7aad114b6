package kvcache

import (
	"github.com/lmpack/lmpack/quantize/kvq"
	"github.com/lmpack/lmpack/runtime/kernels"
)

// Paged storage.
//
// Every store keeps its tokens in pages of pageTokens (bt) store indices
// (index i = position − sink). One physical page, a block, holds page j
// of every store of a cache, K and V of every layer: its codes, scales,
// zero points and OScaR norms, in three typed arrays (float32, uint16,
// byte). The cache's page table (pages) maps page j to a block taken from
// a blockSource (a Pool, or the private source of New) when the first
// token of the page is stored.
//
// How a store adopts it: at construction it claims, for each kind of data
// it keeps, a region of every block from the cache's layout —
// layout.u8Rows(nkv, rowBytes), layout.u16Rows(nkv, row) or
// layout.f32Rows(nkv, row) — laid out [kv head][bt][row] within the
// block. The one accessor it then needs is "the row of (kv head h, store
// index i)": region.at(p, h, i) is that row's offset in the block that
// p.put(i) (when storing) or p.get(i) (when decoding) returns, and rows
// i..e of one head are contiguous while they stay in one page
// (e = p.runEnd(i, i1)). A region claimed with div > 1 (layout.u16Rows
// with per-block parameters) has one row per div tokens. Nothing else
// changes: put, get and bytes keep their meaning, and bytes(t) must stay
// the bytes of t tokens so that a block is exactly bytes(bt) summed over
// the stores.

// block is one physical page: the storage of bt store indices of every
// store of a cache, split between the stores by the regions of a layout.
type block struct {
	f32 []float32
	u16 []uint16
	u8  []byte
}

// layout counts the elements of each type one block needs, as stores
// claim their regions.
type layout struct{ bt, nf32, nu16, nu8 int }

// region is a store's part of every block: rows of row elements at base,
// laid out [kv head][bt/div][row] (div tokens share a row).
type region struct{ base, row, div int }

// f32Rows, u16Rows and u8Rows claim a region of nkv heads × bt/div rows of
// row elements in the block's float32, uint16 or byte array.
func (l *layout) f32Rows(nkv, row, div int) region {
	r := region{l.nf32, row, div}
	l.nf32 += nkv * l.bt / div * row
	return r
}

func (l *layout) u16Rows(nkv, row, div int) region {
	r := region{l.nu16, row, div}
	l.nu16 += nkv * l.bt / div * row
	return r
}

func (l *layout) u8Rows(nkv, row, div int) region {
	r := region{l.nu8, row, div}
	l.nu8 += nkv * l.bt / div * row
	return r
}

// bytes is the size of one block in bytes.
func (l *layout) bytes() int64 { return 4*int64(l.nf32) + 2*int64(l.nu16) + int64(l.nu8) }

// newBlock allocates one block of the layout.
func (l *layout) newBlock() *block {
	return &block{f32: make([]float32, l.nf32), u16: make([]uint16, l.nu16), u8: make([]byte, l.nu8)}
}

// at is the offset of the row of kv head h holding store index i, in the
// block of i's page.
func (r region) at(p *pages, h, i int) int {
	return r.base + (h*(p.bt/r.div)+(i%p.bt)/r.div)*r.row
}

// blockSource hands out blocks of one layout.
type blockSource interface{ take() *block }

// pages is a cache's page table: tab[j] holds store indices
// [j·bt, (j+1)·bt), nil until its first token is stored.
type pages struct {
	bt  int
	tab []*block
	src blockSource
}

// put returns the block of store index i for storing, taking it from the
// source on the page's first token.
func (p *pages) put(i int) *block {
	j := i / p.bt
	if b := p.tab[j]; b != nil {
		return b
	}
	b := p.src.take()
	p.tab[j] = b
	return b
}

// get returns the block of store index i (stored before).
func (p *pages) get(i int) *block { return p.tab[i/p.bt] }

// runEnd is the end of the run of indices from i, before i1, in i's page.
func (p *pages) runEnd(i, i1 int) int { return min(i1, (i/p.bt+1)*p.bt) }

// held is the number of blocks in the table.
func (p *pages) held() int {
	n := 0
	for _, b := range p.tab {
		if b != nil {
			n++
		}
	}
	return n
}

// store holds one side (K or V) of one layer's quantized tokens, indexed
// from 0 (the first token after the sink), in the cache's pages. Tokens
// are put in the space the side quantizes in (rotated, clipped,
// normalized) and come back in it.
type store interface {
	// put stores tokens [i0, i0+t): x is [t, ld] row-major float32 with
	// kv head h in columns [h·head_dim, (h+1)·head_dim). For channel
	// stores t is the block size and i0 a multiple of it.
	put(i0, t int, x []float32, ld int)
	// get decodes tokens [i0, i1) of kv head h into dst, [i1−i0, head_dim]
	// row-major float32.
	get(h, i0, i1 int, dst []float32)
	// bytes is the storage of t tokens (t a multiple of the block for
	// channel stores), in bytes.
	bytes(t int) int64
}

// f16Store keeps binary16 rows: vals [kv head][bt][hd] uint16 per block.
type f16Store struct {
	nkv, hd int
	p       *pages
	vals    region
}

func newF16Store(l *layout, p *pages, nkv, hd int) *f16Store {
	return &f16Store{nkv, hd, p, l.u16Rows(nkv, hd, 1)}
}

func (s *f16Store) put(i0, t int, x []float32, ld int) {
	for r := 0; r < t; r++ {
		b := s.p.put(i0 + r)
		for h := 0; h < s.nkv; h++ {
			o := s.vals.at(s.p, h, i0+r)
			kvq.EncodeF16(b.u16[o:o+s.hd], x[r*ld+h*s.hd:r*ld+(h+1)*s.hd])
		}
	}
}

func (s *f16Store) get(h, i0, i1 int, dst []float32) {
	for i := i0; i < i1; {
		e := s.p.runEnd(i, i1)
		o := s.vals.at(s.p, h, i)
		// Exact, as kvq.DecodeF16; F16C where the CPU has it.
		kernels.WidenHalf(kernels.F16, dst[(i-i0)*s.hd:(e-i0)*s.hd], s.p.get(i).u16[o:o+(e-i)*s.hd])
		i = e
	}
}

func (s *f16Store) bytes(t int) int64 { return int64(t) * int64(s.nkv*s.hd) * 2 }

// f32Store keeps float32 rows (fp32, and tests: rotation without
// quantization): vals [kv head][bt][hd] float32 per block.
type f32Store struct {
	nkv, hd int
	p       *pages
	vals    region
}

func newF32Store(l *layout, p *pages, nkv, hd int) *f32Store {
	return &f32Store{nkv, hd, p, l.f32Rows(nkv, hd, 1)}
}

func (s *f32Store) put(i0, t int, x []float32, ld int) {
	for r := 0; r < t; r++ {
		b := s.p.put(i0 + r)
		for h := 0; h < s.nkv; h++ {
			o := s.vals.at(s.p, h, i0+r)
			copy(b.f32[o:o+s.hd], x[r*ld+h*s.hd:r*ld+(h+1)*s.hd])
		}
	}
}

func (s *f32Store) get(h, i0, i1 int, dst []float32) {
	for i := i0; i < i1; {
		e := s.p.runEnd(i, i1)
		o := s.vals.at(s.p, h, i)
		copy(dst[(i-i0)*s.hd:(e-i0)*s.hd], s.p.get(i).f32[o:o+(e-i)*s.hd])
		i = e
	}
}

func (s *f32Store) bytes(t int) int64 { return int64(t) * int64(s.nkv*s.hd) * 4 }

// asymStore keeps asymmetric min-max codes per (token, head, group): per
// block, codes [kv head][bt][hd·bits/8] uint8 (packed LSB first), params
// [kv head][bt][hd/group][2] binary16 (scale, zero).
type asymStore struct {
	nkv, hd, bits, group, ng, rb int
	p                            *pages
	codes, params                region
}

func newAsymStore(l *layout, p *pages, nkv, hd, bits, group int) *asymStore {
	rb := kvq.PackedLen(hd, bits)
	ng := hd / group
	return &asymStore{nkv: nkv, hd: hd, bits: bits, group: group, ng: ng, rb: rb, p: p,
		codes: l.u8Rows(nkv, rb, 1), params: l.u16Rows(nkv, 2*ng, 1)}
}

func (s *asymStore) put(i0, t int, x []float32, ld int) {
	gb := kvq.PackedLen(s.group, s.bits)
	for r := 0; r < t; r++ {
		i := i0 + r
		b := s.p.put(i)
		for h := 0; h < s.nkv; h++ {
			row := x[r*ld+h*s.hd : r*ld+(h+1)*s.hd]
			oc, op := s.codes.at(s.p, h, i), s.params.at(s.p, h, i)
			codes := b.u8[oc : oc+s.rb]
			p := b.u16[op : op+s.ng*2]
			for g := 0; g < s.ng; g++ {
				xg := row[g*s.group : (g+1)*s.group]
				lo, hi := kvq.MinMax(xg)
				sc, z := kvq.AsymParamsF16(lo, hi, s.bits)
				kvq.EncodeAsym(codes[g*gb:(g+1)*gb], xg, s.bits, sc, z)
				p[2*g], p[2*g+1] = kvq.F16FromFloat32(sc), kvq.F16FromFloat32(z)
			}
		}
	}
}

func (s *asymStore) get(h, i0, i1 int, dst []float32) {
	for i := i0; i < i1; {
		e := s.p.runEnd(i, i1)
		b := s.p.get(i)
		oc, op := s.codes.at(s.p, h, i), s.params.at(s.p, h, i)
		n := e - i
		out := dst[(i-i0)*s.hd : (e-i0)*s.hd]
		if s.ng == 1 {
			s.getRows(b.u8[oc:oc+n*s.rb], b.u16[op:op+2*n], n, out)
		} else {
			s.getGroups(b.u8[oc:oc+n*s.rb], b.u16[op:op+2*s.ng*n], n, out)
		}
		i = e
	}
}

// getGroups decodes n rows of several groups each: codes [n, rb],
// params [n, ng, 2], dst [n, hd].
func (s *asymStore) getGroups(codes []byte, params []uint16, n int, dst []float32) {
	gb := kvq.PackedLen(s.group, s.bits)
	for r := 0; r < n; r++ {
		c := codes[r*s.rb : (r+1)*s.rb]
		p := params[r*s.ng*2 : (r+1)*s.ng*2]
		row := dst[r*s.hd : (r+1)*s.hd]
		for g := 0; g < s.ng; g++ {
			kvq.DecodeAsym(row[g*s.group:(g+1)*s.group], c[g*gb:(g+1)*gb], s.bits,
				kvq.F16ToFloat32(p[2*g]), kvq.F16ToFloat32(p[2*g+1]))
		}
	}
}

// getRows decodes n rows of one group each (group = head_dim), codes
// [n, rb], params [n, 2], dst [n, hd], in one loop: with head_dim 8 a row
// is only 2 bytes of codes, so per-row call overhead would dominate.
func (s *asymStore) getRows(codes []byte, params []uint16, n int, dst []float32) {
	dst = dst[:n*s.hd]
	switch {
	case s.bits == 2 && s.hd%4 == 0:
		for r := 0; r < n; r++ {
			sc, z := kvq.F16ToFloat32(params[2*r]), kvq.F16ToFloat32(params[2*r+1])
			lut := [4]float32{-z * sc, (1 - z) * sc, (2 - z) * sc, (3 - z) * sc}
			row := dst[r*s.hd : (r+1)*s.hd]
			in := codes[r*s.rb : (r+1)*s.rb]
			for i, b := range in {
				o := row[4*i : 4*i+4 : 4*i+4]
				o[0], o[1], o[2], o[3] = lut[b&3], lut[b>>2&3], lut[b>>4&3], lut[b>>6]
			}
		}
	case s.bits == 4 && s.hd%2 == 0:
		for r := 0; r < n; r++ {
			sc, z := kvq.F16ToFloat32(params[2*r]), kvq.F16ToFloat32(params[2*r+1])
			row := dst[r*s.hd : (r+1)*s.hd]
			in := codes[r*s.rb : (r+1)*s.rb]
			for i, b := range in {
				o := row[2*i : 2*i+2 : 2*i+2]
				o[0], o[1] = (float32(b&15)-z)*sc, (float32(b>>4)-z)*sc
			}
		}
	case s.bits == 8:
		for r := 0; r < n; r++ {
			sc, z := kvq.F16ToFloat32(params[2*r]), kvq.F16ToFloat32(params[2*r+1])
			row := dst[r*s.hd : (r+1)*s.hd]
			in := codes[r*s.rb : (r+1)*s.rb]
			in = in[:len(row)]
			for i, b := range in {
				row[i] = (float32(b) - z) * sc
			}
		}
	default:
		for r := 0; r < n; r++ {
			kvq.DecodeAsym(dst[r*s.hd:(r+1)*s.hd], codes[r*s.rb:(r+1)*s.rb], s.bits,
				kvq.F16ToFloat32(params[2*r]), kvq.F16ToFloat32(params[2*r+1]))
		}
	}
}

func (s *asymStore) bytes(t int) int64 {
	return int64(t) * int64(s.nkv) * int64(s.rb+4*s.ng)
}

// sym2Store keeps symmetric INT2 codes per (token, head) row on the
// mid-rise grid {−1.5, −0.5, 0.5, 1.5}·scale: per block, codes
// [kv head][bt][hd/4], scales [kv head][bt] binary16.
type sym2Store struct {
	nkv, hd, rb   int
	p             *pages
	codes, scales region
}

func newSym2Store(l *layout, p *pages, nkv, hd int) *sym2Store {
	rb := kvq.PackedLen(hd, 2)
	return &sym2Store{nkv: nkv, hd: hd, rb: rb, p: p, codes: l.u8Rows(nkv, rb, 1), scales: l.u16Rows(nkv, 1, 1)}
}

func (s *sym2Store) put(i0, t int, x []float32, ld int) {
	for r := 0; r < t; r++ {
		i := i0 + r
		b := s.p.put(i)
		for h := 0; h < s.nkv; h++ {
			row := x[r*ld+h*s.hd : r*ld+(h+1)*s.hd]
			sc := kvq.SymScale(kvq.AbsMax(row), 2)
			// Round the scale up to a binary16 value so the grid still
			// reaches max|x|.
			h16 := kvq.F16FromFloat32(sc)
			if kvq.F16ToFloat32(h16) < sc {
				h16++
			}
			oc := s.codes.at(s.p, h, i)
			kvq.EncodeSym(b.u8[oc:oc+s.rb], row, 2, kvq.F16ToFloat32(h16))
			b.u16[s.scales.at(s.p, h, i)] = h16
		}
	}
}

func (s *sym2Store) get(h, i0, i1 int, dst []float32) {
	for i := i0; i < i1; i++ {
		b := s.p.get(i)
		row := dst[(i-i0)*s.hd : (i-i0+1)*s.hd]
		oc := s.codes.at(s.p, h, i)
		codes := b.u8[oc : oc+s.rb]
		sc := kvq.F16ToFloat32(b.u16[s.scales.at(s.p, h, i)])
		if s.hd%4 != 0 {
			kvq.DecodeSym(row, codes, 2, sc)
			continue
		}
		lut := [4]float32{-1.5 * sc, -0.5 * sc, 0.5 * sc, 1.5 * sc}
		for k, b := range codes {
			o := row[4*k : 4*k+4 : 4*k+4]
			o[0], o[1], o[2], o[3] = lut[b&3], lut[b>>2&3], lut[b>>4&3], lut[b>>6]
		}
	}
}

func (s *sym2Store) bytes(t int) int64 { return int64(t) * int64(s.nkv) * int64(s.rb+2) }

// channelStore keeps KIVI per-channel codes: each block of `block` tokens
// (a divisor of the page) and each (head, channel) has its own asymmetric
// min-max scale and zero over the block's tokens. Per page: codes
// [kv head][bt][hd·bits/8] (token rows, packed LSB first), params
// [kv head][bt/block][2][hd] binary16 (scales then zeros).
type channelStore struct {
	nkv, hd, bits, block, rb int
	p                        *pages
	codes, params            region
	// scratch: one head's block [block, hd], and its parameters.
	x, lo, hi, sc, z []float32
}

func newChannelStore(l *layout, p *pages, nkv, hd, bits, block int) *channelStore {
	rb := kvq.PackedLen(hd, bits)
	return &channelStore{nkv: nkv, hd: hd, bits: bits, block: block, rb: rb, p: p,
		codes: l.u8Rows(nkv, rb, 1), params: l.u16Rows(nkv, 2*hd, block),
		x: make([]float32, block*hd), lo: make([]float32, hd), hi: make([]float32, hd),
		sc: make([]float32, hd), z: make([]float32, hd)}
}

func (s *channelStore) put(i0, t int, x []float32, ld int) {
	b := s.p.put(i0)
	for h := 0; h < s.nkv; h++ {
		for r := 0; r < t; r++ {
			copy(s.x[r*s.hd:(r+1)*s.hd], x[r*ld+h*s.hd:])
		}
		kvq.ChannelMinMax(s.lo, s.hi, s.x, t, s.hd)
		op := s.params.at(s.p, h, i0)
		p := b.u16[op : op+2*s.hd]
		for c := 0; c < s.hd; c++ {
			s.sc[c], s.z[c] = kvq.AsymParamsF16(s.lo[c], s.hi[c], s.bits)
			p[c], p[s.hd+c] = kvq.F16FromFloat32(s.sc[c]), kvq.F16FromFloat32(s.z[c])
		}
		oc := s.codes.at(s.p, h, i0)
		kvq.EncodeChannels(b.u8[oc:oc+t*s.rb], s.x, t, s.hd, s.bits, s.sc, s.z)
	}
}

func (s *channelStore) get(h, i0, i1 int, dst []float32) { s.getWith(h, i0, i1, dst, s.sc, s.z) }

// getWith is get with the scale and zero scratch sc, z ([head_dim] each)
// given, for concurrent readers (attend.go).
func (s *channelStore) getWith(h, i0, i1 int, dst, sc, z []float32) {
	for i := i0; i < i1; {
		e := min(i1, (i/s.block+1)*s.block)
		b := s.p.get(i)
		op := s.params.at(s.p, h, i)
		p := b.u16[op : op+2*s.hd]
		kvq.DecodeF16(sc, p[:s.hd])
		kvq.DecodeF16(z, p[s.hd:])
		oc := s.codes.at(s.p, h, i)
		kvq.DecodeChannels(dst[(i-i0)*s.hd:(e-i0)*s.hd], b.u8[oc:oc+(e-i)*s.rb], e-i, s.hd, s.bits, sc, z)
		i = e
	}
}

func (s *channelStore) bytes(t int) int64 {
	nb := (t + s.block - 1) / s.block
	return int64(t)*int64(s.nkv*s.rb) + int64(nb)*int64(s.nkv*s.hd*4)
}
