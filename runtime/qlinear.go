package runtime

import (
	"fmt"
	"slices"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/quantize/weights"
	"github.com/lmpack/lmpack/runtime/kernels"
)

// Packed quantized linear weights (docs/QUANT.md, lmpack-wq v1) on the CPU.
//
// By default the CPU backend keeps every quantized weight of the attention
// projections, the MLPs (experts included) and lm_head packed in memory:
// codes at their stored width plus their F16 scales, zero-points and
// act-order permutation, so these weights take about bits/32 of their
// float32 size.
//
// Which kernel runs must not depend on the number of rows of x: a
// batched call (ForwardBatch) gives each sequence the bits it gets alone.
// So each packed weight has one path for every m, fixed at load:
//   - int8 activations (packedLinear.q8, every quantized segment of 1, 2,
//     3, 4 or 8 bits with the assembly: qseg.q8, chosen per width by
//     benchmark, q8Widths; 3-bit codes rearranged at load into blocks of
//     a 2-bit plane and the high bits, kernels.SplitU3), for decode and
//     prefill alike: every row of x
//     is permuted into storage order for an act-order weight and
//     quantized to int8 per block of 32 (kernels.QuantizeActQ8) once per
//     matmul, and kernels.DotQ8Matrix sums code·q in int32 per block
//     (AVX2 vpmaddubsw or AVX-512 VNNI vpdpbusd), scales each block once
//     and reads each packed row once for all rows of x; each output is
//     computed by the same kernel arithmetic whatever m is. The
//     activation rounding moves each output by at most
//     Σ_j |ŵ_j|·max|x_block|/254 (kernels' qdot8_test.go); the logits
//     are checked against the float path by one criterion, mean KL and
//     near-tie flips (q8logits_test.go).
//   - otherwise (groups that are not a multiple of 32, 2-bit
//     per-channel weights, builds without the assembly) every matmul
//     dequantizes tiles of qTileRows(…) rows of W
//     into a per-thread scratch buffer, in the original column order and
//     with exactly the arithmetic of weights.Quantized.Dequantize, and
//     runs kernels.MatMulNTRows on each tile, the tiles spread over the
//     pool's threads. Rows of 1-4-bit codes are decoded by
//     kernels.DequantU4Row / DequantBitsRow (AVX2), whose float32
//     arithmetic is exact for integer zero-points; 1-bit rows (fractional
//     zero-points) use per-group tables computed in float64; act-order
//     rows are decoded in storage order and scattered by Perm. Since
//     MatMulNTRows sums every output in an order fixed by k alone, every
//     output equals, bit for bit, that of the dequantize-at-load path
//     (LoadOptions.DequantizeWeights), on any number of threads.
//
// The float fused GEMV (kernels.DotQRow, kernels.DotU4RowIL: each group's
// sum accumulated in float32 and scaled once) is kept behind qFusedMaxM
// (0: off) for tests and benchmarks: it rounds differently from the tiles
// (within 1e-5·max|logit|), so with it a row's result would depend on m.

// linear is the weight W [n, k] of one linear map y = x·Wᵀ: a float32
// matrix f, or packed rows p. Exactly one is set, except for a weight of
// a decoder block loaded with LoadOptions.ConvertPerBlock: parts holds
// its row-stacked source tensors and f is set only while its block runs
// (blockweights.go).
type linear struct {
	f     []float32
	p     *packedLinear
	parts []*safetensors.Tensor
	h     *halfLinear // BF16/F16 in place (halflinear.go)
}

// packedLinear is W [n, k] as row-stacked segments (q, k and v, or gate
// and up, are fused by stacking their rows); each segment is a quantized
// weight or float32 rows.
type packedLinear struct {
	n, k  int
	segs  []qseg
	fused bool // every quantized segment suits kernels.DotQRow
	// q8: every quantized segment runs on int8 activations (qseg.q8):
	// the GEMV path for every m.
	q8 bool
}

// qFusedMaxM is the most rows of x for which a packed matmul uses the
// fused GEMV (kernels.DotQRow per row of W and row of x) when
// packedLinear.fused; larger m dequantizes tiles. It is 0: the fused GEMV
// rounds differently from the tiles, so with it a row's result would
// depend on how many rows the call has, and a batched call
// (ForwardBatch) must give each sequence the bits it gets alone. The
// fused GEMV decodes the codes once per row of x, so for m = 2 and 4 it is
// slower than the tiles (BenchmarkPackedMatMul); for m = 1 it is faster
// (BenchmarkBatchDecode's "fused" case measures what decode gives up).
// Tests set it to 1 or 4 to exercise the fused path.
var qFusedMaxM = 0

// fusable reports whether s can run the fused GEMV: float rows, 1-4-bit
// codes in natural column order (kernels.DotQRow), or any width on the
// int8-activation path (q8).
func (s *qseg) fusable() bool {
	return s.q == nil || (s.q.Bits <= 4 && s.q.Perm == nil) || s.q8()
}

// q8Widths marks the widths whose decode GEMV runs on int8 activations
// (kernels.QuantizeActQ8 once per matmul, kernels.DotQ8Matrix over W)
// instead of the float fused kernels (kernels.DotU4RowIL, DotQRow) or,
// for 8 bits, dequantized tiles: the faster by kernels' BenchmarkQ8GEMV
// (one thread, asymmetric group 32, m = 1, the 22M model's shapes
// [512, 512], [1408, 512], [512, 1408]; GB/s of packed bytes read, range
// of 3 runs on the shared, heavily loaded 2-core machine, int8 / float):
//
//	8 bit: 5.3–13, 8.9–12, 4.4–5.4 (VNNI) / 0.18, 0.15, 0.15 (there is
//	       no fused float kernel: a Go dequantizing loop and Dot);
//	4 bit: 13–14, 18, 3.3–12 / 0.9–4.6, 1.0–1.3, 1.1–4.2;
//	2 bit: 1.5–7.9, 9.6–10.6, 0.6–1.5 / 1.8–2.5, 0.4–1.1, 0.3–0.75;
//	1 bit: 1.4–1.6, 1.6–2.0, 0.6–1.2 / 0.30–0.33, 0.19–0.30, 0.2–0.65;
//	3 bits: 1.4, 2.7, 2.4 (the planes: kernels.DotQ8MatrixU3) / 0.69,
//	       0.92, 1.2 (DotQRow), one run at load average 10.
//
// 3 bits had stayed on the dequantized tiles (its codes have no assembly
// of their own); BenchmarkPackedMatMulU3 compares the two paths a 3-bit
// weight can take in the runtime's matmul (one thread, asymmetric group
// 32, the big bandwidth model's shapes [2048, 2048], [11264, 2048],
// [2048, 5632]; packed GB per CPU-second, range of 3 runs, load average
// 10-13 on the shared 2-core AVX2 machine), int8 planes / tiles:
//
//	m = 1 (decode):   7.1–7.2 / 0.80–1.10, 3.9–5.0 / 1.06–1.24,
//	                  4.8–5.3 / 1.22–1.24 (int8 3.1–9× faster);
//	m = 64 (prefill): 0.08–0.15 / 0.17–0.22, 0.13–0.15 / 0.21–0.22,
//	                  0.14–0.16 / 0.20–0.22 (tiles 1.3–1.6× faster).
//
// A weight has one path for every m (above), so 3 bits take int8 for
// both: decode gains 3-9×; prefill loses
// 1.3-1.6×. Whole-model decode of the 22M model at 3 bits
// (BenchmarkQuantDecode22M, one thread, -count 3): 264–287 tokens per
// CPU-second on int8 against 101–115 on the tiles. Those figures were
// the two planes' kernels; the fused 3-bit kernel (kernels.SplitU3's
// blocks, 2026-12-03, AVX-512 VNNI machine) runs m = 64 at 0.39–0.43
// packed GB/s (0.31–0.35 before the four-row kernels' VPERMPS change)
// against the tiles' 0.22–0.27, so prefill now gains as well
// (docs/QUANT.md).
//
// The int8 path also takes act-order weights of these widths (x is
// permuted into storage order once per matmul, never the weights; 3-bit
// codes are rearranged in storage order). 1, 2, 3 and 4 bits take it only
// where kernels.Q8Asm (3 bits: Q8AsmU3) reports assembly (without it the float Go loop is
// faster). Every width takes it only with activation blocks of 32 (a
// group that is a multiple of 32, or per-channel rows of such a length):
// a row length like stories260K's 172-column down_proj would share one
// int8 scale among all 172 activations, which measured 4× the KL of
// blocks of 32 against the float path (8 bits, 2048 positions of
// tinystories: mean 7.7e-4 against 1.9e-4 nats); such weights stay on
// the tiles. So do 2-bit per-channel weights (one scale per row): on
// int8 activations their logits missed the runtime's criterion for the
// int8 path (mean KL ≤ 1e-3 nats against the float path, runtime's
// q8logits_test.go: 1.4e-3 on stories260K).
var q8Widths = [9]bool{1: true, 2: true, 3: true, 4: true, 8: true}

// q8Capable reports whether bits-bit weights in groups of group columns
// can run on int8 activations in this build on this CPU: the width is
// marked in q8Widths, the activation blocks are of 32 (q8Widths' doc),
// and but for 8 bits the assembly takes its
// activation block (3 bits: kernels.Q8AsmU3, the kernels of
// kernels.DotQ8MatrixU3).
func q8Capable(bits, group int) bool {
	blk := kernels.ActBlock(group)
	switch {
	case !q8Widths[bits] || blk != 32:
		return false
	case bits == 8:
		return true
	case bits == 3:
		return kernels.Q8AsmU3(blk)
	}
	return kernels.Q8Asm(bits, blk)
}

// q8 reports whether s's decode GEMV runs on int8 activations: its width
// is q8Capable, and a 3-bit segment has its blocks (qseg.u3, setFused). A
// 3-bit segment whose codes were dropped at load for them (loadLinear)
// stays on them.
func (s *qseg) q8() bool {
	if s.q == nil || s.q.Bits == 2 && s.ng == 1 {
		return false
	}
	if s.q.Bits == 3 {
		return s.u3 != nil && (s.q.Codes == nil || q8Capable(3, s.q.GroupSize))
	}
	return q8Capable(s.q.Bits, s.q.GroupSize)
}

type qseg struct {
	row0, rows int
	q          *weights.Quantized // nil: float rows f
	f          []float32          // [rows, k] when q == nil
	rb, ng     int                // packed row bytes, groups per row
	zsym       float64            // implicit zero-point when symmetric
	// u3 [rows·3k/8]: a 3-bit weight's codes rearranged into blocks of a
	// 2-bit plane and the high bits (kernels.SplitU3) for the int8 path
	// (kernels.DotQ8MatrixU3); nil otherwise.
	u3 []byte
}

// bytes returns the resident bytes of w: packed codes, scales, zero-points
// and permutations, 4 bytes per element of float rows, and the source
// tensors' data bytes of a weight converted per block.
func (w *linear) bytes() int64 {
	if w.h != nil {
		return w.h.bytes()
	}
	if w.parts != nil {
		var b int64
		for _, t := range w.parts {
			b += int64(len(t.Data))
		}
		return b
	}
	if w.p == nil {
		return 4 * int64(len(w.f))
	}
	var b int64
	for _, s := range w.p.segs {
		if s.q == nil {
			b += 4 * int64(len(s.f))
		} else {
			b += s.q.Bytes() + int64(len(s.u3))
		}
	}
	return b
}

// loadLinear loads the weights names (each [rows[i], cols]) stacked by
// rows. When packed is set and at least one of them is quantized it keeps
// the quantized ones packed (read with ReadQuantized from raw, the source
// without the dequantizing wrapper); otherwise it returns the float32
// concatenation read through src. Errors wrap ErrBadWeights and name the
// tensor.
func loadLinear(d *arch.Description, src, raw TensorSource, packed bool, cols int, names []string, rows []int) (linear, error) {
	if !anyPacked(d, packed, names) {
		f, err := loadConcat(src, cols, names, rows)
		return linear{f: f}, err
	}
	p := &packedLinear{k: cols}
	for i, n := range names {
		s := qseg{row0: p.n, rows: rows[i]}
		if tq, ok := d.Quant.Tensors[n]; ok {
			q, file, err := ReadQuantized(raw, n, tq)
			if err != nil {
				return linear{}, err
			}
			if q.Rows != rows[i] || q.Cols != cols {
				return linear{}, fmt.Errorf("runtime: %w: %s: quantized weight %q: shape [%d, %d], want [%d, %d]", ErrBadWeights, file, n, q.Rows, q.Cols, rows[i], cols)
			}
			// The storage may be a read-only mapping of the file that is
			// unmapped when the checkpoint closes: keep a copy.
			q.Codes = slices.Clone(q.Codes)
			s.q, s.rb, s.ng = q, weights.RowBytes(cols, q.Bits), cols/q.GroupSize
			s.zsym = float64(int(1) << uint(q.Bits-1))
		} else {
			f, err := loadF32(src, n, rows[i], cols)
			if err != nil {
				return linear{}, err
			}
			s.f = f
		}
		p.segs = append(p.segs, s)
		p.n += rows[i]
	}
	p.setFused()
	if p.q8 {
		// Every quantized segment runs on int8 activations, so the tiles
		// never decode this weight: a 3-bit segment keeps only its
		// rearranged codes (the same bytes as its codes).
		for i := range p.segs {
			if s := &p.segs[i]; s.u3 != nil {
				s.q.Codes = nil
			}
		}
	}
	return linear{p: p}, nil
}

// anyPacked reports whether loadLinear keeps at least one of names packed:
// packed is set and d quantizes one of them.
func anyPacked(d *arch.Description, packed bool, names []string) bool {
	if !packed || d.Quant == nil {
		return false
	}
	for _, n := range names {
		if _, ok := d.Quant.Tensors[n]; ok {
			return true
		}
	}
	return false
}

// qTileBytes is the float32 bytes of W one dequantized tile aims at: it
// stays in L2 while the kernel reads it.
const qTileBytes = 96 << 10

// qTileRows returns the rows of W per tile for W [n, k] on threads
// threads: a multiple of 12, at least 12, no more than qTileBytes allows
// (unless 12 rows already exceed it), and small enough that every thread
// gets a tile when n allows.
func qTileRows(n, k, threads int) int {
	r := max(qTileBytes/(4*k)/12*12, 12)
	per := ((n+threads-1)/threads + 11) / 12 * 12
	return min(r, max(per, 12))
}

// qParallelMinMACs is the size m·n·k below which a packed matmul runs on
// the calling goroutine, as kernels.Pool.MatMulNT does for float weights.
const qParallelMinMACs = 1 << 15

// qScratchFloats is the float32 scratch one thread needs for tiles of any
// packed weight with row length at most k.
func qScratchFloats(k int) int { return max(qTileBytes/4, 12*k) }

// setFused splits the codes of every 3-bit segment that can run on int8
// activations (q8Capable) into kernels.SplitU3's blocks (qseg.u3) and sets w.fused
// and w.q8 from the segments.
func (w *packedLinear) setFused() {
	w.fused, w.q8 = true, true
	for i := range w.segs {
		s := &w.segs[i]
		if s.q != nil && s.q.Bits == 3 && s.u3 == nil && q8Capable(3, s.q.GroupSize) {
			s.u3 = make([]byte, s.rows*3*w.k/8)
			kernels.SplitU3(s.u3, s.q.Codes, s.rb, s.rows, w.k)
		}
	}
	for i := range w.segs {
		w.fused = w.fused && w.segs[i].fusable()
		if w.segs[i].q != nil && !w.segs[i].q8() {
			w.q8 = false
		}
	}
}

// qmmTask is the pool task of a packed matmul: unit u dequantizes and
// multiplies the tiles [u·tiles/units, (u+1)·tiles/units), or, when gemv
// is set, computes rows [u·n/units, (u+1)·n/units) of W with the fused
// GEMV (gemvRows).
type qmmTask struct {
	gemv              bool
	w                 *packedLinear
	m                 int
	x, y              []float32
	ldx, ldy          int
	tile, tiles, unit int
	buf               [][]float32     // per unit: [tile, k]
	codes             [][]uint8       // per unit: [k]
	row               [][]float32     // per unit: [k]
	acts              []kernels.Q8Act // per segment on the int8 path (q8)
	actOf             []int           // per segment: its index into acts
	xperm             []float32       // [m, k]: x in a segment's storage order
}

// quantizeActs fills t.acts[t.actOf[si]] for every segment si of t.w on
// the int8 path: t.x quantised per kernels.ActBlock(group) block,
// permuted into storage order first for an act-order weight (xp[j] =
// x[Perm[j]]), and prepared for the segment's width. Segments in natural
// order with the same block share one quantisation.
func (t *qmmTask) quantizeActs() {
	w, k, m := t.w, t.w.k, t.m
	if len(t.acts) < len(w.segs) {
		t.acts, t.actOf = make([]kernels.Q8Act, len(w.segs)), make([]int, len(w.segs))
	}
	for si := range w.segs {
		s := &w.segs[si]
		t.actOf[si] = si
		if !s.q8() {
			continue
		}
		blk := kernels.ActBlock(s.q.GroupSize)
		if s.q.Perm == nil {
			shared := false
			for sj := 0; sj < si && !shared; sj++ {
				o := &w.segs[sj]
				if o.q8() && o.q.Perm == nil && kernels.ActBlock(o.q.GroupSize) == blk {
					t.actOf[si], shared = t.actOf[sj], true
				}
			}
			if !shared {
				kernels.QuantizeActQ8(&t.acts[si], t.x, t.ldx, m, k, blk)
			}
			t.acts[t.actOf[si]].Prepare(s.q.Bits)
			continue
		}
		if cap(t.xperm) < m*k {
			t.xperm = make([]float32, m*k)
		}
		xp := t.xperm[:m*k]
		for i := 0; i < m; i++ {
			x, d := t.x[i*t.ldx:i*t.ldx+k], xp[i*k:(i+1)*k]
			for j, c := range s.q.Perm {
				d[j] = x[c]
			}
		}
		kernels.QuantizeActQ8(&t.acts[si], xp, k, m, k, blk)
		t.acts[si].Prepare(s.q.Bits)
	}
}

func (t *qmmTask) Run(lo, hi int) {
	w, k := t.w, t.w.k
	if t.gemv {
		t.gemvRows(lo*w.n/t.unit, hi*w.n/t.unit, t.row[lo][:k])
		return
	}
	for u := lo; u < hi; u++ {
		buf, codes, row := t.buf[u], t.codes[u], t.row[u]
		for ti := u * t.tiles / t.unit; ti < (u+1)*t.tiles/t.unit; ti++ {
			r0 := ti * t.tile
			r1 := min(r0+t.tile, w.n)
			tb := buf[:(r1-r0)*k]
			w.dequantRows(r0, r1, tb, codes, row)
			kernels.MatMulNTRows(t.m, r1-r0, k, t.x, t.ldx, tb, k, t.y[r0:], t.ldy)
		}
	}
}

// gemvRows computes y[i, r] = x[i]·W[r] for rows r in [r0, r1) of W and
// every row i < t.m of x: on segments of the int8 path (qseg.q8)
// kernels.DotQ8Matrix (3 bits: DotQ8MatrixU3 on qseg.u3) on t.acts
// (quantizeActs), all rows of x at once;
// otherwise kernels.DotQRow on the packed codes of quantized rows (each
// packed byte read once per row of x) — for 4-bit groups of multiples of
// 16 codes kernels.DotU4RowIL on x interleaved once into xi [k]
// (scratch) — and kernels.Dot on float rows.
func (t *qmmTask) gemvRows(r0, r1 int, xi []float32) {
	w, k := t.w, t.w.k
	for i := 0; i < t.m; i++ {
		x := t.x[i*t.ldx : i*t.ldx+k]
		interleaved := false
		for si := range w.segs {
			s := &w.segs[si]
			a, b := max(r0, s.row0), min(r1, s.row0+s.rows)
			if a >= b {
				continue
			}
			if s.q == nil {
				for r := a; r < b; r++ {
					lr := r - s.row0
					t.y[i*t.ldy+r] = kernels.Dot(x, s.f[lr*k:(lr+1)*k])
				}
				continue
			}
			q := s.q
			if s.q8() {
				if i > 0 {
					continue // all rows of x at once, below
				}
				la, lb := a-s.row0, b-s.row0
				var zeros []uint16
				if !q.Symmetric {
					zeros = q.Zeros[la*s.ng : lb*s.ng]
				}
				if s.u3 != nil {
					rb := 3 * k / 8
					kernels.DotQ8MatrixU3(t.y[a:], t.ldy, &t.acts[t.actOf[si]], s.u3[la*rb:lb*rb], b-a, q.Scales[la*s.ng:lb*s.ng], zeros, q.GroupSize, float32(s.zsym))
					continue
				}
				kernels.DotQ8Matrix(t.y[a:], t.ldy, &t.acts[t.actOf[si]], q.Codes[la*s.rb:lb*s.rb], s.rb, b-a, q.Bits, q.Scales[la*s.ng:lb*s.ng], zeros, q.GroupSize, float32(s.zsym))
				continue
			}
			il := q.Bits == 4 && q.GroupSize%16 == 0
			if il && !interleaved {
				kernels.InterleaveU4(xi, x)
				interleaved = true
			}
			for r := a; r < b; r++ {
				lr := r - s.row0
				var zeros []uint16
				if !q.Symmetric {
					zeros = q.Zeros[lr*s.ng : (lr+1)*s.ng]
				}
				// The row keeps its capacity to the end of Codes: the
				// kernel may read a few bytes past it.
				src, sc := q.Codes[lr*s.rb:], q.Scales[lr*s.ng:(lr+1)*s.ng]
				if il {
					t.y[i*t.ldy+r] = kernels.DotU4RowIL(xi, src, sc, zeros, q.GroupSize, float32(s.zsym))
				} else {
					t.y[i*t.ldy+r] = kernels.DotQRow(x, src, q.Bits, sc, zeros, q.GroupSize, float32(s.zsym))
				}
			}
		}
	}
}

// matMul computes y = x·Wᵀ for x [m, k] (leading dimension ldx) into y
// [m, n] (leading dimension ldy), with W = w [n, k]: the pool's
// row-independent float32 GEMM (kernels.Pool.MatMulNTRows); for a packed W
// the int8-activation GEMV for every m when W runs on it (packedLinear.q8),
// otherwise tiles dequantized on the fly, or, for m <= qFusedMaxM (0
// unless a test sets it), the float fused GEMV; GEMV rows are split over
// the pool's threads.
func (cm *cpuModel) matMul(m, n, k int, x []float32, ldx int, w *linear, y []float32, ldy int) {
	if w.h != nil {
		w.h.matMul(cm.pool, m, x, ldx, y, ldy)
		return
	}
	if w.p == nil {
		cm.pool.MatMulNTRows(m, n, k, x, ldx, w.f, k, y, ldy)
		return
	}
	if m == 0 || n == 0 {
		return
	}
	t := &cm.qmm
	th := len(cm.qbuf)
	t.w, t.m, t.x, t.ldx, t.y, t.ldy = w.p, m, x, ldx, y, ldy
	t.buf, t.codes, t.row = cm.qbuf, cm.qcodes, cm.qrow
	if w.p.q8 || (w.p.fused && m <= qFusedMaxM) {
		t.gemv = true
		t.quantizeActs()
		t.unit = min(th, n)
		if m*n*k < qParallelMinMACs {
			t.unit = 1
		}
		cm.pool.Run(t.unit, t)
		t.gemv, t.w, t.x, t.y = false, nil, nil, nil
		return
	}
	t.tile = qTileRows(n, k, th)
	t.tiles = (n + t.tile - 1) / t.tile
	t.unit = min(th, t.tiles)
	if m*n*k < qParallelMinMACs {
		t.unit = 1 // Pool.Run runs one unit on the calling goroutine
	}
	cm.pool.Run(t.unit, t)
	t.w, t.x, t.y = nil, nil, nil
}

// dequantRows writes rows [r0, r1) of W into dst [(r1−r0), k] in the
// original column order; codes [k] and row [k] are scratch.
func (w *packedLinear) dequantRows(r0, r1 int, dst []float32, codes []uint8, row []float32) {
	k := w.k
	si := 0
	for r := r0; r < r1; r++ {
		for r >= w.segs[si].row0+w.segs[si].rows {
			si++
		}
		s := &w.segs[si]
		out := dst[(r-r0)*k : (r-r0+1)*k]
		lr := r - s.row0
		if s.q == nil {
			copy(out, s.f[lr*k:(lr+1)*k])
			continue
		}
		s.dequantRow(lr, out, codes[:k], row[:k])
	}
}

// dequantRow writes row r of s's quantized weight into out [k] exactly as
// weights.Quantized.Dequantize does: float32(scale·(code − zero)) with
// scale and zero in float64, storage column j going to out[Perm[j]].
func (s *qseg) dequantRow(r int, out []float32, codes []uint8, tmp []float32) {
	q := s.q
	if q.Bits >= 2 && q.Bits <= 4 {
		// Integer zero-points and float16 scales: the float32 arithmetic
		// of the kernels is exact, so it equals the float64 formula.
		dst := out
		if q.Perm != nil {
			dst = tmp
		}
		var zeros []uint16
		if !q.Symmetric {
			zeros = q.Zeros[r*s.ng : (r+1)*s.ng]
		}
		// The row keeps its capacity to the end of Codes: the kernels may
		// read a few bytes past it.
		src, sc := q.Codes[r*s.rb:(r+1)*s.rb], q.Scales[r*s.ng:(r+1)*s.ng]
		if q.Bits == 4 && q.GroupSize%2 == 0 {
			kernels.DequantU4Row(dst, src, sc, zeros, q.GroupSize, float32(s.zsym))
		} else {
			kernels.DequantBitsRow(dst, src, q.Bits, sc, zeros, q.GroupSize, float32(s.zsym))
		}
		if q.Perm != nil {
			for j, p := range q.Perm {
				out[p] = tmp[j]
			}
		}
		return
	}
	if q.Perm == nil && q.Bits == 1 && q.GroupSize%8 == 0 {
		s.dequantRowFast(r, out)
		return
	}
	unpackCodes(codes, q.Codes[r*s.rb:(r+1)*s.rb], q.Bits)
	G := q.GroupSize
	nc := 1 << uint(q.Bits)
	useLUT := nc < G
	var lut [256]float32
	for g := 0; g < s.ng; g++ {
		sc := float64(safetensors.F16ToFloat32(q.Scales[r*s.ng+g]))
		z := s.zsym
		if !q.Symmetric {
			z = float64(safetensors.F16ToFloat32(q.Zeros[r*s.ng+g]))
		}
		cs := codes[g*G : (g+1)*G]
		if useLUT {
			for c := 0; c < nc; c++ {
				lut[c] = float32(sc * (float64(c) - z))
			}
			if q.Perm == nil {
				o := out[g*G : (g+1)*G]
				for j, c := range cs {
					o[j] = lut[c]
				}
			} else {
				p := q.Perm[g*G : (g+1)*G]
				for j, c := range cs {
					out[p[j]] = lut[c]
				}
			}
			continue
		}
		if q.Perm == nil {
			o := out[g*G : (g+1)*G]
			for j, c := range cs {
				o[j] = float32(sc * (float64(c) - z))
			}
		} else {
			p := q.Perm[g*G : (g+1)*G]
			for j, c := range cs {
				out[p[j]] = float32(sc * (float64(c) - z))
			}
		}
	}
}

// grid returns the scale and zero-point of group g of row r, in float64
// (exact: both are float16 values).
func (s *qseg) grid(r, g int) (float64, float64) {
	q := s.q
	sc := float64(safetensors.F16ToFloat32(q.Scales[r*s.ng+g]))
	if q.Symmetric {
		return sc, s.zsym
	}
	return sc, float64(safetensors.F16ToFloat32(q.Zeros[r*s.ng+g]))
}

// dequantRowFast is dequantRow for natural column order, 1 bit (the
// fractional zero-points make float32 arithmetic inexact) and groups of
// whole bytes: codes are decoded straight from the packed bytes
// through each group's table of its 2^bits values.
func (s *qseg) dequantRowFast(r int, out []float32) {
	q := s.q
	G := q.GroupSize
	row := q.Codes[r*s.rb : (r+1)*s.rb]
	for g := 0; g < s.ng; g++ {
		sc, z := s.grid(r, g)
		lut := [2]float32{float32(sc * (0 - z)), float32(sc * (1 - z))}
		o := out[g*G : (g+1)*G]
		for i, b := range row[g*G/8 : (g+1)*G/8] {
			d := o[8*i : 8*i+8 : 8*i+8]
			d[0], d[1], d[2], d[3] = lut[b&1], lut[b>>1&1], lut[b>>2&1], lut[b>>3&1]
			d[4], d[5], d[6], d[7] = lut[b>>4&1], lut[b>>5&1], lut[b>>6&1], lut[b>>7]
		}
	}
}

// unpackCodes unpacks len(dst) codes of width bits (1, 2, 3, 4 or 8) from
// the LSB-first bit stream src (weights.PackRow's layout).
func unpackCodes(dst []uint8, src []byte, bits int) {
	n := len(dst)
	j := 0
	switch bits {
	case 8:
		copy(dst, src[:n])
		return
	case 4:
		for ; j+2 <= n; j += 2 {
			b := src[j>>1]
			dst[j], dst[j+1] = b&15, b>>4
		}
	case 2:
		for ; j+4 <= n; j += 4 {
			b := src[j>>2]
			dst[j], dst[j+1], dst[j+2], dst[j+3] = b&3, b>>2&3, b>>4&3, b>>6
		}
	case 1:
		for ; j+8 <= n; j += 8 {
			b := src[j>>3]
			d := dst[j : j+8 : j+8]
			d[0], d[1], d[2], d[3] = b&1, b>>1&1, b>>2&1, b>>3&1
			d[4], d[5], d[6], d[7] = b>>4&1, b>>5&1, b>>6&1, b>>7
		}
	case 3:
		for ; j+8 <= n; j += 8 {
			p := j / 8 * 3
			v := uint32(src[p]) | uint32(src[p+1])<<8 | uint32(src[p+2])<<16
			d := dst[j : j+8 : j+8]
			for i := range d {
				d[i] = uint8(v >> (3 * uint(i)) & 7)
			}
		}
	}
	for ; j < n; j++ { // the tail, bit by bit
		p := j * bits
		b, off := p>>3, uint(p&7)
		v := uint16(src[b])
		if off+uint(bits) > 8 {
			v |= uint16(src[b+1]) << 8
		}
		dst[j] = uint8(v >> off & (1<<uint(bits) - 1))
	}
}

// LinearWeightBytes returns the bytes that the linear weights of a CPU
// model (attention q/k/v/o, MLP and expert gate/up/down, and lm_head when
// untied from the embedding) take in memory: 4 per element for float32
// weights, 2 for BF16/F16 weights used in place (halflinear.go; their
// pages are the mapped file's), the source tensors' bytes for weights converted per block
// (LoadOptions.ConvertPerBlock), and for packed quantized weights their packed codes, F16
// scales and zero-points and int32 permutations (weights.Quantized.Bytes).
// It returns -1 for a model of another backend.
func LinearWeightBytes(m Model) int64 {
	cm, ok := m.(*cpuModel)
	if !ok {
		return -1
	}
	return cm.weightBytes()
}
