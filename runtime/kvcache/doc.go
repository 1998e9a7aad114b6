// Package kvcache provides quantized KV caches for the runtime: stores of
// past keys and values that implement runtime.KVCache with packed low-bit
// codes instead of float32, selected by name (New): fp32, fp16, int8,
// int4, int2-naive, kivi2, quarot2, oscar2, oscar2-g32 (oscar2 with a
// scale and zero per 32 channels, kivi2's cost), oscar4 and oscars2, the
// methods of docs/METHODS.md §1–3 that the eval runs side by side, the
// caches serving engines ship (§3): vLLM's TurboQuant presets, fp8 and
// int4_per_token_head, llama.cpp's q8_0 and q4_0, and oscar-mixed (OSCAR
// with a width of 2, 4 or 8 bits per layer and side, chosen by lmpack
// quantize kv --kv-bits).
//
// The caches hold codes, binary16 scales and zero points, fp32 token
// norms and fp16 windows — never a float32 copy of a quantized token —
// and Bytes reports exactly that storage, so Sizer.BitsPerElement is the
// real cost including scales and windows.
//
// Read returns keys and values in the model's original space: rotated
// methods dequantize and then un-rotate (x = x_rot·Rᵀ). For keys this is
// the same attention score as rotating the query instead, since
// (q·R)·(k̂·R) = q·(k̂·R)·Rᵀ for orthogonal R. For values OSCAR and QuaRot
// fold the rotation into v_proj and o_proj offline; here it is applied
// inside the cache instead, which is equivalent (the rotation is
// orthogonal and per head, so attention's weighted sum commutes with it)
// and keeps the checkpoint unchanged, so one loaded model can be
// evaluated with every cache method side by side in one run. Read
// un-rotates every cached token (a [n, head_dim]×[head_dim, head_dim]
// product per head for oscar2/4, a fast Walsh–Hadamard transform per row
// for quarot2/oscars2); Forward does not use it for these caches: they
// implement runtime.KVAttender (attend.go, attend_codes.go), which
// rotates q once per head and call, scores the packed codes (per-row
// scale and zero, the OScaR norm) and accumulates the values from their
// codes, un-rotating the summed output once; the fp16 sink and window are
// read in fp16. Rows of several groups (kivi2's values, oscar2-g32) are
// dequantized attendTokens at a time into L1 scratch there instead of
// being scored on the bare codes (attend_codes.go takes one group per
// row). Every kind but the TurboQuant ones' quantized layers has
// that form (their Lloyd–Max codecs fall back to Read, as does a Pool's
// fp32).
//
// Behaviour shared by every method but fp32:
//
//   - Write quantizes at once, but the Forward that writes tokens does not
//     read them back: runtime's Forward attends a call's own tokens through
//     their fresh float32 keys and values and reads the tokens of earlier
//     calls as the cache serves them to each query (runtime.QuantizedKV:
//     a query at p reads position j quantized when Sink ≤ j <
//     QuantizedEnd(layer, p+1), i.e. j ≤ p−Recent for per-token methods,
//     in fp16 otherwise), as vLLM, SGLang and the KIVI/OSCAR references
//     run prefill. A prompt prefilled in one call so gives the fp32-KV
//     logits; decode and chunked prefill read the earlier tokens
//     quantized. NewFakeQuant gives the other protocol (KVQuant's: every
//     token, a call's own included, read as stored).
//   - A token that leaves the fp16 window within its own Write is quantized
//     from its float32 row, one that leaves it in a later Write from its
//     binary16 row, so chunked and token-by-token writes can differ by that
//     rounding.
//   - The first Sink tokens stay fp16; of the rest, tokens are quantized
//     oldest first while more than Recent are pending (a 32-token block at a
//     time for per-channel keys), so the newest ones wait in an fp16 window.
//   - Write may start at any position up to the layer's length; starting
//     earlier forgets the later tokens first. Truncate(n) forgets positions
//     from n on and rebuilds the fp16 windows for the new length from the
//     binary16 rows still held (for New's caches always enough after a
//     cancelled Forward of up to 32 tokens, which then leaves no trace; a
//     Pool's caches keep no such slack); tokens whose rows are
//     gone stay quantized, and a per-channel key block cut in two whose rows
//     are gone goes back to the window as its dequantized values.
//     Truncate(0) resets the cache to its fresh state.
//   - Write panics (a caller bug, like runtime.F32Cache) on positions past
//     the capacity, a gap after the layer's length or short k, v; Read
//     panics when asked for more tokens than the layer holds.
//
// Storage is paged (store.go): the quantized tokens of every store live
// in blocks of a fixed number of tokens, each block holding those tokens
// for every layer, K and V. New gives a cache one private block sized to
// its capacity; a Pool (KV memory as a budget in bytes, for a server)
// hands out blocks of BlockTokens tokens from a shared free list as
// tokens are stored, within what each cache reserved (BytesFor). The
// paging changes no decoded value.
//
// Not here: computing OSCAR's rotations and clipping ratios (calibration,
// package quantize/oscar) and the row quantizers themselves
// (quantize/kvq).
package kvcache
