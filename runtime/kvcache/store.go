package kvcache

import (
	"github.com/lmpack/lmpack/quantize/kvq"
)

// store holds one side (K or V) of one layer's quantized tokens, indexed
// from 0 (the first token after the sink). Tokens are put in the space the
// side quantizes in (rotated, clipped, normalized) and come back in it.
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

// f16Store keeps binary16 rows: vals [nkv][cap][hd] uint16.
type f16Store struct {
	nkv, hd, cap int
	vals         []uint16
}

func newF16Store(nkv, hd, cap int) *f16Store {
	return &f16Store{nkv, hd, cap, make([]uint16, nkv*cap*hd)}
}

func (s *f16Store) put(i0, t int, x []float32, ld int) {
	for h := 0; h < s.nkv; h++ {
		for r := 0; r < t; r++ {
			kvq.EncodeF16(s.vals[(h*s.cap+i0+r)*s.hd:], x[r*ld+h*s.hd:r*ld+(h+1)*s.hd])
		}
	}
}

func (s *f16Store) get(h, i0, i1 int, dst []float32) {
	kvq.DecodeF16(dst[:(i1-i0)*s.hd], s.vals[(h*s.cap+i0)*s.hd:(h*s.cap+i1)*s.hd])
}

func (s *f16Store) bytes(t int) int64 { return int64(t) * int64(s.nkv*s.hd) * 2 }

// f32Store keeps float32 rows (tests only: rotation without quantization).
type f32Store struct {
	nkv, hd, cap int
	vals         []float32
}

func (s *f32Store) put(i0, t int, x []float32, ld int) {
	for h := 0; h < s.nkv; h++ {
		for r := 0; r < t; r++ {
			copy(s.vals[(h*s.cap+i0+r)*s.hd:], x[r*ld+h*s.hd:r*ld+(h+1)*s.hd])
		}
	}
}

func (s *f32Store) get(h, i0, i1 int, dst []float32) {
	copy(dst[:(i1-i0)*s.hd], s.vals[(h*s.cap+i0)*s.hd:(h*s.cap+i1)*s.hd])
}

func (s *f32Store) bytes(t int) int64 { return int64(t) * int64(s.nkv*s.hd) * 4 }

// asymStore keeps asymmetric min-max codes per (token, head, group):
// codes [nkv][cap][hd·bits/8] uint8 (packed LSB first), params
// [nkv][cap][hd/group][2] binary16 (scale, zero).
type asymStore struct {
	nkv, hd, cap, bits, group, ng, rb int
	codes                             []byte
	params                            []uint16
}

func newAsymStore(nkv, hd, cap, bits, group int) *asymStore {
	rb := kvq.PackedLen(hd, bits)
	ng := hd / group
	return &asymStore{nkv: nkv, hd: hd, cap: cap, bits: bits, group: group, ng: ng, rb: rb,
		codes: make([]byte, nkv*cap*rb), params: make([]uint16, nkv*cap*ng*2)}
}

func (s *asymStore) put(i0, t int, x []float32, ld int) {
	gb := kvq.PackedLen(s.group, s.bits)
	for h := 0; h < s.nkv; h++ {
		for r := 0; r < t; r++ {
			i := h*s.cap + i0 + r
			row := x[r*ld+h*s.hd : r*ld+(h+1)*s.hd]
			codes := s.codes[i*s.rb : (i+1)*s.rb]
			p := s.params[i*s.ng*2 : (i+1)*s.ng*2]
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
	if s.ng == 1 {
		s.getRows(h, i0, i1, dst)
		return
	}
	gb := kvq.PackedLen(s.group, s.bits)
	for i := i0; i < i1; i++ {
		j := h*s.cap + i
		codes := s.codes[j*s.rb : (j+1)*s.rb]
		p := s.params[j*s.ng*2 : (j+1)*s.ng*2]
		row := dst[(i-i0)*s.hd : (i-i0+1)*s.hd]
		for g := 0; g < s.ng; g++ {
			kvq.DecodeAsym(row[g*s.group:(g+1)*s.group], codes[g*gb:(g+1)*gb], s.bits,
				kvq.F16ToFloat32(p[2*g]), kvq.F16ToFloat32(p[2*g+1]))
		}
	}
}

// getRows is get for one group per row (group = head_dim), decoding the
// run of rows in one loop: with head_dim 8 a row is only 2 bytes of codes,
// so per-row call overhead would dominate.
func (s *asymStore) getRows(h, i0, i1 int, dst []float32) {
	j0 := h*s.cap + i0
	n := i1 - i0
	codes := s.codes[j0*s.rb : (j0+n)*s.rb]
	params := s.params[2*j0 : 2*(j0+n)]
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
// mid-rise grid {−1.5, −0.5, 0.5, 1.5}·scale: codes [nkv][cap][hd/4],
// scales [nkv][cap] binary16.
type sym2Store struct {
	nkv, hd, cap, rb int
	codes            []byte
	scales           []uint16
}

func newSym2Store(nkv, hd, cap int) *sym2Store {
	rb := kvq.PackedLen(hd, 2)
	return &sym2Store{nkv: nkv, hd: hd, cap: cap, rb: rb, codes: make([]byte, nkv*cap*rb), scales: make([]uint16, nkv*cap)}
}

func (s *sym2Store) put(i0, t int, x []float32, ld int) {
	for h := 0; h < s.nkv; h++ {
		for r := 0; r < t; r++ {
			i := h*s.cap + i0 + r
			row := x[r*ld+h*s.hd : r*ld+(h+1)*s.hd]
			sc := kvq.SymScale(kvq.AbsMax(row), 2)
			// Round the scale up to a binary16 value so the grid still
			// reaches max|x|.
			h16 := kvq.F16FromFloat32(sc)
			if kvq.F16ToFloat32(h16) < sc {
				h16++
			}
			kvq.EncodeSym(s.codes[i*s.rb:(i+1)*s.rb], row, 2, kvq.F16ToFloat32(h16))
			s.scales[i] = h16
		}
	}
}

func (s *sym2Store) get(h, i0, i1 int, dst []float32) {
	for i := i0; i < i1; i++ {
		j := h*s.cap + i
		row := dst[(i-i0)*s.hd : (i-i0+1)*s.hd]
		codes := s.codes[j*s.rb : (j+1)*s.rb]
		sc := kvq.F16ToFloat32(s.scales[j])
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
// and each (head, channel) has its own asymmetric min-max scale and zero
// over the block's tokens. codes [nkv][cap][hd·bits/8] (token rows, packed
// LSB first), params [nkv][cap/block][2][hd] binary16 (scales then
// zeros).
type channelStore struct {
	nkv, hd, cap, bits, block, rb int
	codes                         []byte
	params                        []uint16
	// scratch: one head's block [block, hd], and its parameters.
	x, lo, hi, sc, z []float32
}

func newChannelStore(nkv, hd, cap, bits, block int) *channelStore {
	rb := kvq.PackedLen(hd, bits)
	nb := (cap + block - 1) / block
	return &channelStore{nkv: nkv, hd: hd, cap: cap, bits: bits, block: block, rb: rb,
		codes: make([]byte, nkv*cap*rb), params: make([]uint16, nkv*nb*2*hd),
		x: make([]float32, block*hd), lo: make([]float32, hd), hi: make([]float32, hd),
		sc: make([]float32, hd), z: make([]float32, hd)}
}

func (s *channelStore) blockParams(h, b int) []uint16 {
	nb := (s.cap + s.block - 1) / s.block
	i := h*nb + b
	return s.params[i*2*s.hd : (i+1)*2*s.hd]
}

func (s *channelStore) put(i0, t int, x []float32, ld int) {
	b := i0 / s.block
	for h := 0; h < s.nkv; h++ {
		for r := 0; r < t; r++ {
			copy(s.x[r*s.hd:(r+1)*s.hd], x[r*ld+h*s.hd:])
		}
		kvq.ChannelMinMax(s.lo, s.hi, s.x, t, s.hd)
		p := s.blockParams(h, b)
		for c := 0; c < s.hd; c++ {
			s.sc[c], s.z[c] = kvq.AsymParamsF16(s.lo[c], s.hi[c], s.bits)
			p[c], p[s.hd+c] = kvq.F16FromFloat32(s.sc[c]), kvq.F16FromFloat32(s.z[c])
		}
		j := h*s.cap + i0
		kvq.EncodeChannels(s.codes[j*s.rb:(j+t)*s.rb], s.x, t, s.hd, s.bits, s.sc, s.z)
	}
}

func (s *channelStore) get(h, i0, i1 int, dst []float32) {
	for i := i0; i < i1; {
		b := i / s.block
		e := min(i1, (b+1)*s.block)
		p := s.blockParams(h, b)
		kvq.DecodeF16(s.sc, p[:s.hd])
		kvq.DecodeF16(s.z, p[s.hd:])
		j := h*s.cap + i
		kvq.DecodeChannels(dst[(i-i0)*s.hd:(e-i0)*s.hd], s.codes[j*s.rb:(j+e-i)*s.rb], e-i, s.hd, s.bits, s.sc, s.z)
		i = e
	}
}

func (s *channelStore) bytes(t int) int64 {
	nb := (t + s.block - 1) / s.block
	return int64(t)*int64(s.nkv*s.rb) + int64(nb)*int64(s.nkv*s.hd*4)
}
