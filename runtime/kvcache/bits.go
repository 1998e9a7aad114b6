package kvcache

import (
	"fmt"
	"strings"
)

// BitsAt returns the bits per cached K/V element, Bytes()·8 / (2·ctx·Σ
// kvDim), that a cache New(method, layers, capacity ≥ ctx, opt) holds once
// ctx tokens are written, computed analytically from the method's
// per-token bytes (codes, scales, zero points, token norms) and its fixed
// fp16 sink and recent windows (2 bytes per element), without allocating
// the cache: the figure at a serving context (e.g. 32768 tokens) that a
// measured cache at the evaluated context cannot give. Rotations are not
// needed (they do not change the storage), except by oscar-mixed, whose
// per-layer widths they carry.
//
// Errors: ErrUnknownMethod, ErrBadShape for ctx < 1 or bad layers or
// windows (as New), ErrNoRotations for oscar-mixed without Rotations.
func BitsAt(method string, layers []Layer, opt Options, ctx int) (float64, error) {
	if err := checkLayers(layers, ctx, opt); err != nil {
		return 0, err
	}
	kvDim := make([]int, len(layers))
	for i, l := range layers {
		kvDim[i] = l.NumKVHeads * l.HeadDim
	}
	if method == "fp32" {
		return 32, nil
	}
	sp, ok := methods[method]
	if !ok {
		return 0, fmt.Errorf("%w %q (known: %s)", ErrUnknownMethod, method, strings.Join(Methods(), ", "))
	}
	if sp.mixed && opt.Rotations == nil {
		return 0, fmt.Errorf("%w: method %q (its per-layer widths)", ErrNoRotations, method)
	}
	nq, err := QuantizedAt(method, opt, ctx)
	if err != nil {
		return 0, err
	}
	// The stores' bytes for nq tokens: nq/block blocks of the layout a
	// cache with pages of one quantization block claims (codes, scales,
	// zero points, token norms); nq is a multiple of the block.
	probe := &cache{}
	sp.name = method
	lay := probe.init(sp, layers, 1, opt, sp.block, 0)
	s := int64(nq/sp.block) * lay.bytes()
	for i := range layers {
		s += int64(ctx-nq) * int64(kvDim[i]) * 4
	}
	return bitsPerElement(s, ctx, kvDim), nil
}

// QuantizedAt returns how many of ctx written tokens (per layer) a cache
// of method under opt holds in its quantized store rather than in the
// fp16 sink and recent windows: 0 means the windows cover the whole
// context and nothing is quantised. fp32 and fp16 store every token in
// their one format and return ctx. Errors: ErrUnknownMethod, ErrBadShape
// for ctx < 1 or negative windows.
func QuantizedAt(method string, opt Options, ctx int) (int, error) {
	if ctx < 1 || opt.Sink < 0 || opt.Recent < 0 {
		return 0, fmt.Errorf("%w: ctx %d, Sink %d, Recent %d, want ctx ≥ 1 and windows ≥ 0", ErrBadShape, ctx, opt.Sink, opt.Recent)
	}
	if method == "fp32" {
		return ctx, nil
	}
	sp, ok := methods[method]
	if !ok {
		return 0, fmt.Errorf("%w %q (known: %s)", ErrUnknownMethod, method, strings.Join(Methods(), ", "))
	}
	if sp.noWindows {
		return ctx, nil
	}
	sink, recent := windows(sp, ctx, opt)
	return max(0, idealQ(sink, ctx, recent, sp.block)-sink), nil
}

// ReadAt returns what the query at position p of a Forward call that
// begins at position c0 (0 ≤ c0 ≤ p < capacity) reads of the c0 tokens
// that earlier calls cached, in a cache New(method, layers, capacity,
// opt), averaged over the layers weighted by their K/V width
// (num_key_value_heads·head_dim): read, how many cached tokens it
// attends to (c0, or fewer in a layer with a sliding window w: positions
// j ≥ p − w + 1 only); quantized, how many of those it reads from the
// quantized store; and bits, the bits per K/V element of what it reads
// (quantized tokens at the layout's bytes per token, a block's scales
// spread over its tokens; the others in the fp16 windows at 16), 0 when
// it reads no cached token. The rule is the runtime's
// (runtime.QuantizedKV, doc.go): token j < c0 is read quantized when
// Sink ≤ j < QuantizedEnd(p+1), the watermark once p+1 tokens are
// written, so the recent window counts back from the query itself and a
// kivi2 block that the call completes is read quantized by the call's
// queries that come after the Write. fp32 and fp16 read every token in
// their one format (quantized = read, bits 32 or 16).
//
// Errors: as BitsAt, and ErrBadShape unless 0 ≤ c0 ≤ p < capacity.
func ReadAt(method string, layers []Layer, opt Options, capacity, c0, p int) (read, quantized, bits float64, err error) {
	if c0 < 0 || p < c0 || p >= capacity {
		return 0, 0, 0, fmt.Errorf("%w: call start %d, query position %d, capacity %d, want 0 ≤ start ≤ position < capacity", ErrBadShape, c0, p, capacity)
	}
	if err := checkLayers(layers, capacity, opt); err != nil {
		return 0, 0, 0, err
	}
	var sp spec
	if method != "fp32" {
		var ok bool
		if sp, ok = methods[method]; !ok {
			return 0, 0, 0, fmt.Errorf("%w %q (known: %s)", ErrUnknownMethod, method, strings.Join(Methods(), ", "))
		}
		if sp.mixed && opt.Rotations == nil {
			return 0, 0, 0, fmt.Errorf("%w: method %q (its per-layer widths)", ErrNoRotations, method)
		}
	}
	// Per layer: the visible cached positions [lo, c0), the quantized
	// ones [max(lo, sink), min(c0, qend)), at the layer's bytes per token
	// (its stores' bytes for one block, as cache.Bytes counts them).
	var perToken []float64
	qend, sink := c0, 0
	if method != "fp32" {
		var recent int
		sink, recent = windows(sp, capacity, opt)
		qend = idealQ(sink, p+1, recent, sp.block)
		probe := &cache{}
		sp.name = method
		probe.init(sp, layers, 1, opt, sp.block, 0)
		for i := range probe.layers {
			L := &probe.layers[i]
			b := L.k.st.bytes(sp.block) + L.v.st.bytes(sp.block)
			if L.k.norm {
				b += 4 * int64(sp.block)
			}
			if L.v.norm {
				b += 4 * int64(sp.block)
			}
			perToken = append(perToken, float64(b)/float64(sp.block))
		}
	}
	var wsum, rsum, qsum, bytes, elems float64
	for i, l := range layers {
		kv := float64(l.NumKVHeads * l.HeadDim)
		lo := 0
		if w := l.SlidingWindow; w > 0 {
			lo = max(0, p-w+1)
		}
		n := max(0, c0-lo)
		nq := n
		b := float64(n) * kv * 8 // fp32: 4 bytes per K and per V element
		if method != "fp32" {
			nq = max(0, min(c0, qend)-max(lo, sink))
			b = float64(nq)*perToken[i] + float64(n-nq)*kv*4
		}
		wsum += kv
		rsum += kv * float64(n)
		qsum += kv * float64(nq)
		bytes += b
		elems += 2 * kv * float64(n)
	}
	if elems > 0 {
		bits = bytes * 8 / elems
	}
	return rsum / wsum, qsum / wsum, bits, nil
}
