package kvcache

import "fmt"

// rowCodec is the storage format of one side (K or V) of one layer for
// the serving-engine kinds (vLLM TurboQuant, fp8, int4_per_token_head;
// llama.cpp q8_0/q4_0): every (token, kv head) row of head_dim float32
// values becomes a fixed number of bytes, laid out as the engine lays out
// one head's slot, and back. The codec does its whole transform (norms,
// rotations, scales) itself, so the cache's side has no rotation of its
// own and Read returns rows in the model's space. Codecs may keep scratch
// buffers: one codec serves one store and is not safe for concurrent use.
type rowCodec interface {
	// rowBytes is the encoded size of one row in bytes.
	rowBytes() int
	// encode writes the encoding of x ([head_dim] float32) into dst
	// ([rowBytes] bytes).
	encode(dst []byte, x []float32)
	// decode writes the row that src ([rowBytes] bytes) encodes into dst
	// ([head_dim] float32).
	decode(dst []float32, src []byte)
}

// rowStore is a store of rowCodec rows: rb bytes per (kv head, token)
// in a byte region of the cache's blocks, [kv head][bt][rb] per block
// (store.go "Paged storage"). All access to the bytes goes through row.
type rowStore struct {
	nkv, hd, rb int
	p           *pages
	vals        region
	c           rowCodec
}

func newRowStore(lay *layout, p *pages, nkv, hd int, c rowCodec) *rowStore {
	rb := c.rowBytes()
	return &rowStore{nkv: nkv, hd: hd, rb: rb, p: p, vals: lay.u8Rows(nkv, rb, 1), c: c}
}

// row returns the bytes of (kv head h, store index i) in block b (the
// block of i's page).
func (s *rowStore) row(b *block, h, i int) []byte {
	o := s.vals.at(s.p, h, i)
	return b.u8[o : o+s.rb : o+s.rb]
}

func (s *rowStore) put(i0, t int, x []float32, ld int) {
	for r := 0; r < t; r++ {
		b := s.p.put(i0 + r)
		for h := 0; h < s.nkv; h++ {
			s.c.encode(s.row(b, h, i0+r), x[r*ld+h*s.hd:r*ld+(h+1)*s.hd])
		}
	}
}

func (s *rowStore) get(h, i0, i1 int, dst []float32) {
	for i := i0; i < i1; i++ {
		s.c.decode(dst[(i-i0)*s.hd:(i-i0+1)*s.hd], s.row(s.p.get(i), h, i))
	}
}

func (s *rowStore) bytes(t int) int64 { return int64(t) * int64(s.nkv) * int64(s.rb) }

// rowSpec returns a method whose K and V are stored as rows of the codecs
// that codecs returns for each layer (nil codecs: binary16 rows, a layer
// the engine leaves unquantized); check validates the layers first.
func rowSpec(codecs func(layer, nLayers int, l Layer) (k, v rowCodec), check func(i int, l Layer) error) spec {
	return spec{block: 1,
		check: func(layers []Layer) error {
			for i, l := range layers {
				if err := check(i, l); err != nil {
					return fmt.Errorf("layer %d: %w", i, err)
				}
			}
			return nil
		},
		stores: func(layer, nLayers int, l Layer, lay *layout, p *pages) (store, store) {
			kc, vc := codecs(layer, nLayers, l)
			if kc == nil || vc == nil {
				return newF16Store(lay, p, l.NumKVHeads, l.HeadDim), newF16Store(lay, p, l.NumKVHeads, l.HeadDim)
			}
			return newRowStore(lay, p, l.NumKVHeads, l.HeadDim, kc), newRowStore(lay, p, l.NumKVHeads, l.HeadDim, vc)
		}}
}

// packBits packs codes (each < 2^bits) into dst as one LSB-first bit
// stream: code i occupies bits [i·bits, (i+1)·bits) (byte ⌊i·bits/8⌋ at
// bit i·bits mod 8, spilling into the next byte). dst holds
// ⌈len(codes)·bits/8⌉ bytes and is overwritten. For bits 4 this is two
// codes per byte, even index in the low nibble; for bits 3, eight codes in
// three bytes, as vLLM's TurboQuant kernels pack them.
func packBits(dst []byte, codes []uint8, bits int) {
	clear(dst[:(len(codes)*bits+7)/8])
	for i, c := range codes {
		o := i * bits
		w := uint16(c) << (o & 7)
		dst[o>>3] |= uint8(w)
		if (o&7)+bits > 8 {
			dst[o>>3+1] |= uint8(w >> 8)
		}
	}
}

// unpackBits is the inverse of packBits: len(dst) codes from src.
func unpackBits(dst []uint8, src []byte, bits int) {
	mask := uint16(1)<<bits - 1
	for i := range dst {
		o := i * bits
		w := uint16(src[o>>3])
		if (o&7)+bits > 8 {
			w |= uint16(src[o>>3+1]) << 8
		}
		dst[i] = uint8(w >> (o & 7) & mask)
	}
}
