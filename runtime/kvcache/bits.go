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
