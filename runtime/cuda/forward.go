package cuda

import (
	"context"
	"fmt"
	"math"

	"github.com/lmpack/lmpack/runtime"
)

// scratchDev holds the device activations of one Forward call, grown to
// the largest call seen.
type scratchDev struct {
	rows, ctx, splits int
	ids               DevPtr // int32 [rows]
	x, xn, qkv, att   DevPtr
	gu, logits        DevPtr
	partO, partML     DevPtr
	moeLogits, moeW   DevPtr
	moeSel, moeY      DevPtr
	moeGU             DevPtr
	deq               DevPtr // binary16 [Model.deqBytes/2]: prefill's dequantized weight
	sizes             map[*DevPtr]int64
}

// free releases every buffer and returns the first cuMemFree error.
func (s *scratchDev) free(d *Device) error {
	var first error
	for p := range s.sizes {
		if err := d.Free(*p); err != nil && first == nil {
			first = err
		}
		*p = 0
	}
	s.sizes = nil
	return first
}

// grow makes *p hold at least n bytes.
func (s *scratchDev) grow(d *Device, p *DevPtr, n int64) error {
	if s.sizes == nil {
		s.sizes = map[*DevPtr]int64{}
	}
	if s.sizes[p] >= n {
		return nil
	}
	if err := d.Free(*p); err != nil {
		return err
	}
	*p = 0
	delete(s.sizes, p)
	q, err := d.Alloc(n)
	if err != nil {
		delete(s.sizes, p)
		return err
	}
	*p, s.sizes[p] = q, n
	return nil
}

// attnSplit returns the split length (a multiple of 128 positions) and
// count for nTok positions and base blocks per split, aiming at 8 blocks
// per SM (up to 16 of 128 threads fit).
func (m *Model) attnSplit(nTok, base int) (splitLen, nsplit int) {
	target := 8 * max(m.dev.SMs, 1)
	want := max(1, (target+base-1)/base)
	tiles := (nTok + 127) / 128
	want = min(want, tiles)
	tilesPer := (tiles + want - 1) / want
	splitLen = 128 * tilesPer
	return splitLen, (nTok + splitLen - 1) / splitLen
}

// attnGrid returns attention's launch shape for layer l with R query rows
// over nTok positions: mg q heads per block (the smallest of 1, 2, 4, 8
// covering the GQA group, so one attn_split_g{mg} kernel), chunks blocks
// per KV head, and the split length and count (attnSplit with base
// nkv·chunks·R blocks per split).
func (m *Model) attnGrid(l *layerW, R, nTok int) (mg, chunks, splitLen, nsplit int) {
	group := l.nh / l.nkv
	mg = 8
	for _, g := range []int{1, 2, 4} {
		if group <= g {
			mg = g
			break
		}
	}
	chunks = (group + mg - 1) / mg
	splitLen, nsplit = m.attnSplit(nTok, l.nkv*chunks*R)
	return mg, chunks, splitLen, nsplit
}

// partSlots is the number of (q head, split) partial results attention
// writes per query row at most over the layers, for R rows over nTok
// positions: the part_o scratch holds R·partSlots·2·head_dim floats
// (max head_dim) and part_ml R·partSlots·2.
func (m *Model) partSlots(R, nTok int) int {
	n := 0
	for i := range m.layers {
		l := &m.layers[i]
		_, _, _, nsplit := m.attnGrid(l, R, nTok)
		n = max(n, l.nh*nsplit)
	}
	return n
}

// Forward implements runtime.Model. cache must be a *DeviceCache made by
// this model (NewCache or NewDeviceCache with Batch 1). Errors: those of
// runtime.Model.Forward, a foreign cache, device errors.
func (m *Model) Forward(ctx context.Context, tokens []int, cache runtime.KVCache, logits []float32, allLogits bool) error {
	c, ok := cache.(*DeviceCache)
	if !ok || c.m != m {
		return fmt.Errorf("cuda: Forward: the cache is a %T; the CUDA backend needs a cache from this model's NewCache or NewDeviceCache", cache)
	}
	if c.B != 1 {
		return fmt.Errorf("cuda: Forward: the cache holds %d sequences; use ForwardUniform", c.B)
	}
	T := len(tokens)
	if T == 0 {
		return fmt.Errorf("cuda: Forward: no tokens")
	}
	V := m.d.VocabSize
	want := V
	if allLogits {
		want = T * V
	}
	if len(logits) < want {
		return fmt.Errorf("cuda: Forward: logits has %d elements, want %d", len(logits), want)
	}
	return m.ForwardUniform(ctx, tokens, 1, c, logits, allLogits)
}

// ForwardUniform runs B sequences of T tokens each (ids [B·T], sequence b's
// tokens at [b·T, (b+1)·T)) at positions c.Len() .. c.Len()+T−1 of the
// B-sequence cache c, appends their keys and values and writes logits:
// [B·T, vocab] when allLogits, else [B, vocab] (each sequence's last
// token). Errors: an empty or ragged batch, an id out of range, the cache
// full or from another model, a short logits slice, ctx cancelled (the
// cache is then left at its old length), device errors.
func (m *Model) ForwardUniform(ctx context.Context, ids []int, B int, c *DeviceCache, logits []float32, allLogits bool) error {
	if B < 1 || len(ids) == 0 || len(ids)%B != 0 || c.B != B || c.m != m {
		return fmt.Errorf("cuda: ForwardUniform: %d ids for %d sequences and a cache of %d sequences", len(ids), B, c.B)
	}
	d := m.d
	T := len(ids) / B
	R := B * T
	H, V := d.HiddenSize, d.VocabSize
	pos := c.n
	if pos+T > c.cap {
		return fmt.Errorf("cuda: Forward: %d tokens at position %d exceed the KV cache capacity %d", T, pos, c.cap)
	}
	if R > maxGridYZ || 2*B > maxGridYZ {
		return fmt.Errorf("cuda: Forward: %d token rows of %d sequences in one call, at most %d rows and %d sequences (CUDA grid dimensions)", R, B, maxGridYZ, maxGridYZ/2)
	}
	outRows := B
	if allLogits {
		outRows = R
	}
	if len(logits) < outRows*V {
		return fmt.Errorf("cuda: Forward: logits has %d elements, want %d", len(logits), outRows*V)
	}
	id32 := make([]int32, R)
	for i, id := range ids {
		if id < 0 || id >= V {
			return fmt.Errorf("cuda: Forward: token %d at index %d out of range [0,%d)", id, i, V)
		}
		id32[i] = int32(id)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := m.ensureRope(c.cap); err != nil {
		return err
	}
	if err := m.ensureScratch(R, T, pos+T); err != nil {
		return err
	}
	s := &m.s
	dev, k := m.dev, m.k
	if err := Upload(dev, s.ids, id32); err != nil {
		return err
	}
	nTok := pos + T
	ws := c.quantFloor()
	xrow, xld, rows := s.x, H, R
	xnrow := s.xn
	if !allLogits {
		// Each sequence's last token: rows (b·T + T−1), T·H floats apart.
		xrow = s.x + DevPtr(4*(T-1)*H)
		xnrow = s.xn + DevPtr(4*(T-1)*H)
		xld, rows = T*H, B
	}
	// The ring slots of [pos, nTok) are overwritten even if the step is
	// cancelled: record it before launching.
	c.hi = max(c.hi, nTok)
	// Every launch of the step runs in one hand-off to the driver thread.
	err := k.Batch(func(bk *Kernels) error {
		attend := func(k *Kernels, li int, l *layerW) error {
			// q and k heads are adjacent in a qkv row (k head j is head
			// nh+j): one launch rotates both.
			rp := m.rope[l.hd]
			if err := k.Launch("rope", Dim{R, l.nh + l.nkv, 1}, Dim{min(roundUp(l.hd/2, 32), 128), 1, 1}, s.qkv, l.qkv, l.hd, T, pos, rp.cos, rp.sin); err != nil {
				return err
			}
			// Attention first: the call's own tokens are read fresh from
			// qkv, the earlier ones from the cache as it was before this
			// call (its ring still holds all of their window).
			if err := m.attention(k, l, &c.layers[li], c, s.qkv, s.att, R, T, pos, nTok, ws); err != nil {
				return err
			}
			return c.append(k, li, s.qkv, l.qkv, l.qdim, l.qdim+l.kvdim, pos, T, B)
		}
		final := func(k *Kernels) error {
			return k.Launch("rmsnorm", Dim{rows, 1, 1}, Dim{256, 1, 1}, xnrow, xrow, m.final, H, 1, xld, m.eps())
		}
		return m.layersForward(ctx, bk, R, attend, final, xnrow, xld, rows)
	})
	if err != nil {
		return err
	}
	if err := Download(dev, logits[:rows*V], s.logits); err != nil {
		return err
	}
	c.n += T
	return nil
}

// layersForward launches the embedding and every layer of the R rows of
// m.s.ids through k (the Kernels.Batch handle: no other device calls
// here), the linear maps once over all rows; attend runs layer li's
// per-sequence part (RoPE at each row's position, attention against the
// sequence's cache into m.s.att, the cache append) on m.s.qkv; final
// writes the final-normed rows that want logits (rows of them, ld floats
// apart, at xn), and lm_head maps them into m.s.logits [rows, vocab].
func (m *Model) layersForward(ctx context.Context, k *Kernels, R int, attend func(k *Kernels, li int, l *layerW) error, final func(k *Kernels) error, xn DevPtr, ld, rows int) error {
	d, s := m.d, &m.s
	H, V := d.HiddenSize, d.VocabSize
	if err := k.Launch("embed", Dim{R, 1, 1}, Dim{256, 1, 1}, s.x, m.embed.p, s.ids, H, b2i(m.embed.bf16)); err != nil {
		return err
	}
	eps := m.eps()
	for li := range m.layers {
		if li > 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		l := &m.layers[li]
		// Attention block.
		if err := k.Launch("rmsnorm", Dim{R, 1, 1}, Dim{256, 1, 1}, s.xn, s.x, l.attnNorm, H, 1, H, eps); err != nil {
			return err
		}
		if err := m.matmulX(k, s.qkv, l.qkv, s.xn, H, l.wqkv, R, 0); err != nil {
			return err
		}
		if l.bqkv != 0 {
			if err := k.Launch("add_bias", Dim{R, 1, 1}, Dim{256, 1, 1}, s.qkv, l.bqkv, l.qkv, l.qkv); err != nil {
				return err
			}
		}
		kptr := s.qkv + DevPtr(4*l.qdim)
		if l.qNorm != 0 {
			if err := k.Launch("rmsnorm", Dim{R * l.nh, 1, 1}, Dim{32, 1, 1}, s.qkv, s.qkv, l.qNorm, l.hd, l.nh, l.qkv, eps); err != nil {
				return err
			}
			if err := k.Launch("rmsnorm", Dim{R * l.nkv, 1, 1}, Dim{32, 1, 1}, kptr, kptr, l.kNorm, l.hd, l.nkv, l.qkv, eps); err != nil {
				return err
			}
		}
		if err := attend(k, li, l); err != nil {
			return err
		}
		if err := m.matmulX(k, s.x, H, s.att, l.qdim, l.wo, R, 1); err != nil {
			return err
		}
		if l.bo != 0 {
			if err := k.Launch("add_bias", Dim{R, 1, 1}, Dim{256, 1, 1}, s.x, l.bo, H, H); err != nil {
				return err
			}
		}
		// FFN block.
		if err := k.Launch("rmsnorm", Dim{R, 1, 1}, Dim{256, 1, 1}, s.xn, s.x, l.ffnNorm, H, 1, H, eps); err != nil {
			return err
		}
		if l.mlp != nil {
			I := l.mlp.inter
			if err := m.matmulX(k, s.gu, 2*I, s.xn, H, l.mlp.gu, R, 0); err != nil {
				return err
			}
			if err := k.Launch("silu_mul", Dim{R, 1, 1}, Dim{256, 1, 1}, s.gu, I); err != nil {
				return err
			}
			if err := m.matmulX(k, s.x, H, s.gu, 2*I, l.mlp.down, R, 1); err != nil {
				return err
			}
		} else if err := m.moeFFN(k, l.moe, R); err != nil {
			return err
		}
	}
	// Final norm and lm_head.
	if err := final(k); err != nil {
		return err
	}
	return m.matmulX(k, s.logits, V, xn, ld, m.lmHead, rows, 0)
}

// eps is the model's RMSNorm epsilon as the kernels take it.
func (m *Model) eps() float32 { return float32(m.d.RMSNormEps) }

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func (m *Model) ensureScratch(R, T, nTok int) error {
	d, s, dev := m.d, &m.s, m.dev
	H, V := d.HiddenSize, d.VocabSize
	// inter sizes s.gu (dense and shared-expert MLPs, and the routed
	// experts' width as well); expInter sizes moeGU (routed experts only:
	// a wide shared expert would inflate it K-fold).
	var qkv, qd, inter, expInter, heads, hd, E, K int
	for i := range m.layers {
		l := &m.layers[i]
		qkv, qd, heads, hd = max(qkv, l.qkv), max(qd, l.qdim), max(heads, l.nh), max(hd, l.hd)
		if l.mlp != nil {
			inter = max(inter, l.mlp.inter)
		}
		if l.moe != nil {
			inter, expInter, E, K = max(inter, l.moe.inter), max(expInter, l.moe.inter), max(E, l.moe.E), max(K, l.moe.topK)
			if l.moe.shared != nil {
				inter = max(inter, l.moe.shared.inter)
			}
		}
	}
	slots := int64(m.partSlots(R, nTok))
	r := int64(R)
	for _, g := range []struct {
		p *DevPtr
		n int64
	}{
		{&s.ids, 4 * r}, {&s.x, 4 * r * int64(H)}, {&s.xn, 4 * r * int64(H)},
		{&s.qkv, 4 * r * int64(qkv)}, {&s.att, 4 * r * int64(qd)},
		{&s.gu, 4 * r * int64(2*inter)}, {&s.logits, 4 * r * int64(V)},
		{&s.partO, 4 * r * slots * 2 * int64(hd)},
		{&s.partML, 4 * r * slots * 2},
	} {
		if err := s.grow(dev, g.p, g.n); err != nil {
			return err
		}
	}
	if R > maxGemvQRows && m.deqBytes > 0 {
		if err := s.grow(dev, &s.deq, m.deqBytes); err != nil {
			return err
		}
	}
	if E > 0 {
		for _, g := range []struct {
			p *DevPtr
			n int64
		}{
			{&s.moeLogits, 4 * r * int64(E)}, {&s.moeW, 4 * r * int64(K)}, {&s.moeSel, 4 * r * int64(K)},
			{&s.moeGU, 4 * r * int64(K) * int64(2*expInter)}, {&s.moeY, 4 * r * int64(K) * int64(H)},
		} {
			if err := s.grow(dev, g.p, g.n); err != nil {
				return err
			}
		}
	}
	return nil
}

// maxGemvQRows is the most rows of x a packed weight serves through
// gemv_q; more (a prefill) dequantize the weight first. gemv_q reads the
// weight's codes once per 4 rows, so 64 rows read a 4-bit weight 16 times
// (8 bytes per weight, mostly from L2 for weights that fit it) against
// about 4.5 bytes per weight through DRAM for dequant_q + gemm_f16 (codes
// in, binary16 out and back in): about even, without the binary16
// scratch. Decode batches up to 64 sequences therefore read no binary16
// weights (not measured on a GPU).
const maxGemvQRows = 64

// matmulX computes y[R, w.rows] (row stride ldy) = x[R, w.cols] (row
// stride ldx) · wᵀ, adding to y when beta = 1: the GEMV kernel (8 rows
// per block) for R ≤ 16 rows (decode, batches up to 16), the tiled GEMM
// otherwise. A packed weight runs gemv_q (4 rows per block, x gathered
// through its act-order perm) for R ≤ maxGemvQRows, else dequant_q
// (through the inverse perm, so in the original column order) into
// m.s.deq and gemm_f16.
func (m *Model) matmulX(k *Kernels, y DevPtr, ldy int, x DevPtr, ldx int, w dw, R, beta int) error {
	N, K := w.rows, w.cols
	if q := w.q; q != nil {
		if R <= maxGemvQRows {
			return k.Launch("gemv_q", Dim{(N + 3) / 4, (R + 3) / 4, 1}, Dim{128, 1, 1}, y, ldy, x, ldx,
				q.codes, q.scales, q.zeros, q.perm, R, N, K, q.bits, q.group, beta)
		}
		if err := k.Launch("dequant_q", Dim{N, (K + 255) / 256, 1}, Dim{256, 1, 1}, m.s.deq, q.codes, q.scales, q.zeros, q.iperm, N, K, q.bits, q.group); err != nil {
			return err
		}
		w = dw{p: m.s.deq, rows: N, cols: K}
	}
	suffix := "_f16"
	if w.bf16 {
		suffix = "_bf16"
	}
	if R <= 16 {
		return k.Launch("gemv"+suffix, Dim{(N + 3) / 4, (R + 7) / 8, 1}, Dim{128, 1, 1}, y, ldy, x, ldx, w.p, R, N, K, beta)
	}
	return k.Launch("gemm"+suffix, Dim{(N + 63) / 64, (R + 63) / 64, 1}, Dim{256, 1, 1}, y, ldy, x, ldx, w.p, R, N, K, beta)
}

// attention runs attn_split and attn_merge for the R = B·T new queries of
// layer l, rows of qkv (row stride l.qkv), into att [R, qdim]: the call's
// own tokens through their float32 keys and values in qkv, earlier tokens
// from the cache with
// the INT2 region of a query at pq ending at min(pos, max(ws, pq+1−Recent))
// (ws = quantFloor; runtime.QuantizedKV's semantics).
func (m *Model) attention(k *Kernels, l *layerW, L *cacheLayer, c *DeviceCache, qkv, att DevPtr, R, T, pos, nTok, ws int) error {
	s := &m.s
	mg, chunks, splitLen, nsplit := m.attnGrid(l, R, nTok)
	scale := float32(1 / math.Sqrt(float64(l.hd)))
	rk, rv := L.rk, L.rv
	shmem := 4 * mg * (4*l.hd + 256)
	if err := k.LaunchShared(fmt.Sprintf("attn_split%s_g%d", c.attnVariant(), mg), Dim{nsplit, l.nkv * chunks, R}, Dim{128, 1, 1}, shmem,
		s.partO, s.partML, qkv, l.qkv,
		L.sinkK, L.sinkV, c.sink, L.ringK, L.ringV, c.ring,
		L.codesK, L.codesV, L.parK, L.parV, c.capQ,
		rk, l.nh, l.nkv, l.hd, T, pos, ws, c.recent, l.window, nsplit, splitLen, scale, c.kind, c.bits); err != nil {
		return err
	}
	return k.Launch("attn_merge", Dim{l.nh, R, 1}, Dim{roundUp(l.hd, 32), 1, 1},
		att, l.qdim, s.partO, s.partML, rv, l.nh, l.hd, nsplit)
}

// moeGemvGrid is moe_gemv's grid for R tokens, K experts each and N
// outputs: (R·K pairs, ⌈N/4⌉ groups of 4 rows, one warp each).
func moeGemvGrid(R, K, N int) Dim { return Dim{R * K, (N + 3) / 4, 1} }

// moeFFN routes the R rows of m.s.xn and adds the weighted expert outputs
// (moe_gemv, or moe_gemv_q for packed experts, on every (token, expert)
// pair; decode and prefill alike) to m.s.x, then, with a shared expert,
// sigmoid(gate·xn)·shared(xn) per row (shared through matmulX into m.s.gu
// and m.s.moeY, then moe_shared). The order of the sums differs from the
// CPU backend's (which adds the shared output to the routed sum before
// the residual), a float32 rounding difference.
func (m *Model) moeFFN(k *Kernels, e *moeW, R int) error {
	s := &m.s
	H, I, K := m.d.HiddenSize, e.inter, e.topK
	if err := m.matmulX(k, s.moeLogits, e.E, s.xn, H, e.router, R, 0); err != nil {
		return err
	}
	if err := k.Launch("moe_route", Dim{(R + 31) / 32, 1, 1}, Dim{32, 1, 1}, s.moeSel, s.moeW, s.moeLogits, R, e.E, K, b2i(e.norm)); err != nil {
		return err
	}
	if err := moeGemv(k, s.moeGU, 2*I, s.xn, H, 0, e.gu, e.guQ, s.moeSel, R, K, 2*I, H); err != nil {
		return err
	}
	if err := k.Launch("silu_mul", Dim{R * K, 1, 1}, Dim{256, 1, 1}, s.moeGU, I); err != nil {
		return err
	}
	if err := moeGemv(k, s.moeY, H, s.moeGU, 2*I, 1, e.down, e.downQ, s.moeSel, R, K, H, I); err != nil {
		return err
	}
	if err := k.Launch("moe_combine", Dim{R, 1, 1}, Dim{256, 1, 1}, s.x, s.moeY, s.moeW, K, H); err != nil {
		return err
	}
	sh := e.shared
	if sh == nil {
		return nil
	}
	Is := sh.inter
	if err := m.matmulX(k, s.gu, 2*Is, s.xn, H, sh.gu, R, 0); err != nil {
		return err
	}
	if err := k.Launch("silu_mul", Dim{R, 1, 1}, Dim{256, 1, 1}, s.gu, Is); err != nil {
		return err
	}
	// moe_combine has read moeY ([R·K, H]): its first R rows hold shared(xn).
	if err := m.matmulX(k, s.moeY, H, s.gu, 2*Is, sh.down, R, 0); err != nil {
		return err
	}
	return k.Launch("moe_shared", Dim{R, 1, 1}, Dim{256, 1, 1}, moeSharedArgs(s.x, s.moeY, s.xn, e.sharedGate, H)...)
}

// moeSharedArgs are moe_shared's arguments: out [T, H] += g·y [T, H],
// g = sigmoid(gate [H] · x [T, H] row) or 1 when gate = 0.
func moeSharedArgs(out, y, x, gate DevPtr, H int) []any { return []any{out, y, x, gate, H} }

// moeGemv launches moe_gemv on the stacked binary16/bfloat16 experts w,
// or moe_gemv_q when q (the packed stack) is set: y rows r = t·K + k of
// width N (stride ldy) for the R·K pairs of sel, x rows of Kd (stride
// ldx, per token when xsel = 0, per pair when 1).
func moeGemv(k *Kernels, y DevPtr, ldy int, x DevPtr, ldx, xsel int, w dw, q *moeQW, sel DevPtr, R, K, N, Kd int) error {
	name, args := moeGemvArgs(y, ldy, x, ldx, xsel, w, q, sel, K, N, Kd)
	return k.Launch(name, moeGemvGrid(R, K, N), Dim{128, 1, 1}, args...)
}

// moeGemvArgs returns the kernel moeGemv launches and its arguments.
func moeGemvArgs(y DevPtr, ldy int, x DevPtr, ldx, xsel int, w dw, q *moeQW, sel DevPtr, K, N, Kd int) (string, []any) {
	if q != nil {
		return "moe_gemv_q", []any{y, ldy, x, ldx, xsel, q.codes, q.scales, q.zeros, q.perm, q.tab, sel, K, N, q.parts, Kd}
	}
	return "moe_gemv", []any{y, ldy, x, ldx, xsel, w.p, sel, K, N, Kd, b2i(w.bf16)}
}
