package kvcache

import (
	"unsafe"

	"github.com/lmpack/lmpack/quantize/kvq"
	"github.com/lmpack/lmpack/runtime/kernels"
)

// Raw-code kernels for rows with one scale and zero point per (token,
// head) (asymStore with group = head_dim: int8, int4, quarot2, oscar2,
// oscar4; sym2Store: int2-naive, zero 1.5). A row decodes to
// x̂_j = s_j·(c_j − z_j·1) with c_j its codes, so for a query x
//
//	x·x̂_j = s_j·(x·c_j − z_j·Σ_c x_c)
//	Σ_j p_j x̂_j = Σ_j (p_j s_j)·c_j − (Σ_j p_j s_j z_j)·1
//
// and the products run on the bare codes, the per-row scale and zero
// applied once per score or folded into the weights. Two paths:
//
//   - row kernels (decode: at most codeRowsMaxNQ (2-bit: codeRowsMaxNQ2)
//     query rows per KV head, head_dim (or group) a multiple of 32,
//     AVX2): kernels.CodeDots and
//     kernels.CodeAxpy read the packed codes directly, extracting them in
//     registers; nothing is expanded to memory. Rows of several channel
//     groups (kivi2's values) run per group; kivi2's per-channel keys and
//     llama.cpp's q8_0/q4_0 rows take the same kernels (scoresRows,
//     ggmlScores, ggmlAccum below). Rows of one group take faster
//     kernels: keys of 2, 4 and 8 bits are scored against the query
//     rounded once to int8 (codeScoresQ8, kernels.CodeDotsQ8: exact
//     integer products, a bounded rounding error; AVX-512 VNNI, or AVX2
//     with the same bits), 2-bit values of head_dim 64 and 128 accumulate
//     with int8-rounded weights (kernels.CodeAccumQ8, AVX-512 VBMI or
//     AVX2), and where the CPU has AVX-512 values of every width
//     accumulate by kernels.CodeAccumF16 (float32, the fp16 scale and
//     zero read in the kernel).
//   - block path (prefill chunks, other shapes, builds without the
//     assembly): a byte becomes its 4 (2-bit), 2 (4-bit) or 1 (8-bit)
//     code values by one table copy into a block that stays in L1, and
//     the block's matrix products (shared by the query rows) run in the
//     AVX2 matrix kernels.
//
// Both sum the same exact products (codes are small integers) in float32
// in different orders; TestAttendCodePaths checks each against Read.

// codeTab2, codeTab4 and codeTab8 give the code values of a byte of 2-bit,
// 4-bit and 8-bit codes, LSB first (a load instead of an int→float
// conversion).
var codeTab2, codeTab4, codeTab8 = func() (t2 [256][4]float32, t4 [256][2]float32, t8 [256]float32) {
	for v := 0; v < 256; v++ {
		t8[v] = float32(v)
		for k := 0; k < 4; k++ {
			t2[v][k] = float32(v >> (2 * k) & 3)
		}
		t4[v][0], t4[v][1] = float32(v&15), float32(v>>4)
	}
	return
}()

// codeStore is a rawStore of per-row codes with one scale and zero.
type codeStore interface {
	// codeBits returns the code width, ok false when the kernels do not
	// take the store (several groups per row, a width other than 2, 4, 8,
	// or a head_dim that splits a byte).
	codeBits() (bits int, ok bool)
	// codeRows returns the end e of the run of store indices from i
	// (before i1) in one page of kv head h, and the run's codes
	// ([e−i, rb]) and parameters (asym: [e−i, 2] scale, zero; sym: [e−i]
	// scales).
	codeRows(h, i, i1 int) (e int, codes []byte, params []uint16)
	// symZero returns whether the grid is symmetric, and its zero.
	symZero() (bool, float32)
	// codeGroups is the number of channel groups per row, each with its
	// own scale and zero (params [e−i, groups, 2]); the block path takes
	// only 1, the row kernels groups of a multiple of 32 channels.
	codeGroups() int
}

func codeBitsOK(bits, hd int) bool {
	switch bits {
	case 2:
		return hd%4 == 0
	case 4:
		return hd%2 == 0
	case 8:
		return true
	}
	return false
}

func (s asymRaw) codeBits() (int, bool)    { return s.bits, codeBitsOK(s.bits, s.hd) }
func (s asymRaw) codeGroups() int          { return s.ng }
func (s asymRaw) symZero() (bool, float32) { return false, 0 }
func (s asymRaw) codeRows(h, i, i1 int) (int, []byte, []uint16) {
	e := s.p.runEnd(i, i1)
	b := s.p.get(i)
	oc, op := s.codes.at(s.p, h, i), s.params.at(s.p, h, i)
	return e, b.u8[oc : oc+(e-i)*s.rb], b.u16[op : op+2*s.ng*(e-i)]
}

func (s sym2Raw) codeBits() (int, bool)    { return 2, codeBitsOK(2, s.hd) }
func (s sym2Raw) codeGroups() int          { return 1 }
func (s sym2Raw) symZero() (bool, float32) { return true, 1.5 }
func (s sym2Raw) codeRows(h, i, i1 int) (int, []byte, []uint16) {
	e := s.p.runEnd(i, i1)
	b := s.p.get(i)
	oc, os := s.codes.at(s.p, h, i), s.scales.at(s.p, h, i)
	return e, b.u8[oc : oc+(e-i)*s.rb], b.u16[os : os+(e-i)]
}

// codesOf returns the side's code kernels when they apply (no OScaR
// norm, one group per row).
func codesOf(sd *side) (codeStore, int, bool) {
	if sd.norm {
		return nil, 0, false
	}
	cs, ok := sd.raw.(codeStore)
	if !ok {
		return nil, 0, false
	}
	bits, ok := cs.codeBits()
	return cs, bits, ok
}

// decodeCodes writes the code values of n rows of hd codes of bits
// (codes [n, hd·bits/8]) into dst ([n, hd]).
func decodeCodes(dst []float32, codes []byte, bits, hd, n int) {
	dst = dst[:n*hd]
	switch bits {
	case 2:
		codes = codes[:n*hd/4]
		d := unsafe.Slice((*[4]float32)(unsafe.Pointer(&dst[0])), len(codes))
		for i, b := range codes {
			d[i] = codeTab2[b]
		}
	case 4:
		codes = codes[:n*hd/2]
		d := unsafe.Slice((*[2]float32)(unsafe.Pointer(&dst[0])), len(codes))
		for i, b := range codes {
			d[i] = codeTab4[b]
		}
	default:
		codes = codes[:len(dst)]
		for i, b := range codes {
			dst[i] = codeTab8[b]
		}
	}
}

// codeBlock decodes the codes of store indices [a, b) (at most
// attendTokens, possibly over several pages) of head h into blk and
// their scales and zeros into sz ([2, attendTokens]): the blocks start
// where the caller's range does, not at page boundaries, so the products
// are the same for every page size.
func codeBlock(cs codeStore, bits, hd, h, a, b int, blk, sz []float32) {
	sym, z0 := cs.symZero()
	for i := a; i < b; {
		e, codes, params := cs.codeRows(h, i, b)
		decodeCodes(blk[(i-a)*hd:], codes, bits, hd, e-i)
		for r := 0; r < e-i; r++ {
			if sym {
				sz[i-a+r], sz[attendTokens+i-a+r] = kvq.F16ToFloat32(params[r]), z0
			} else {
				sz[i-a+r], sz[attendTokens+i-a+r] = kvq.F16ToFloat32(params[2*r]), kvq.F16ToFloat32(params[2*r+1])
			}
		}
		i = e
	}
}

// codeRowsMaxNQ is the most query rows per KV head for which the row
// kernels (kernels.CodeDots, kernels.CodeAxpy: the codes are extracted
// once per query row) are used instead of the block path (the codes
// expanded to float32 once, then shared by the rows' matrix product), for
// 4- and 8-bit codes; codeRowsMaxNQ2 for 2-bit codes (cheaper to expand).
// Chosen by BenchmarkCodeKernels (CPU time per token and row, head_dim
// 64): rows are 4–7× faster at 1 row; at 8 rows int8 rows 16 vs block 24
// ns, int4 tied (12 vs 13), oscar2 block faster (17 vs 11); at 4 rows
// oscar2 rows 19 vs 30. Decode (1 row, or a GQA group of up to 8) takes
// the row kernels; prefill chunks (many rows) the block path.
var codeRowsMaxNQ, codeRowsMaxNQ2 = 8, 4

// useCodeRows reports whether nq rows of head_dim (or group) hd of bits
// take the row kernels.
func useCodeRows(hd, nq, bits int) bool {
	lim := codeRowsMaxNQ
	if bits == 2 {
		lim = codeRowsMaxNQ2
	}
	return nq <= lim && kernels.CodeRowsFast(hd)
}

// codeParams writes the scales and zeros of n rows of ng groups (params
// as codeRows returns them) into sz: sz[2(r·ng+g)] the scale, sz[2(r·ng+g)+1]
// the zero of group g of row r.
func codeParams(cs codeStore, params []uint16, n, ng int, sz []float32) {
	if sym, z0 := cs.symZero(); sym {
		kernels.WidenHalf(kernels.F16, sz[n:2*n], params[:n])
		for r := 0; r < n; r++ {
			sz[2*r], sz[2*r+1] = sz[n+r], z0
		}
		return
	}
	kernels.WidenHalf(kernels.F16, sz[:2*n*ng], params[:2*n*ng])
}

// codeRowsScratch splits blk ([attendTokens, hd]) for the row kernels of
// ng groups and nq rows: per-group query sums or corrections [nq·ng],
// scales and zeros [2·ng·attendTokens] and a row buffer [attendTokens].
func codeRowsScratch(blk []float32, nq, ng int) (qs, sz, tmp []float32) {
	qs, blk = blk[:nq*ng], blk[nq*ng:]
	sz, blk = blk[:2*ng*attendTokens], blk[2*ng*attendTokens:]
	return qs, sz, blk[:attendTokens]
}

// codeScoresRows is codeScores by the row kernels: for each run of rows
// in a page, attendTokens rows at a time, t = x_g·c_jg by kernels.CodeDots
// per group g, then s_j = Σ_g s_jg·(t − z_jg·Σ_{c∈g} x_c).
func codeScoresRows(cs codeStore, bits, hd, ng, h, i0, i1, nq int, xs, s []float32, lds int, blk []float32) {
	if ng == 1 && codeScoresQ8(cs, bits, hd, h, i0, i1, nq, xs, s, lds, blk) {
		return
	}
	G, gb := hd/ng, hd/ng*bits/8
	qsum, sz, tmp := codeRowsScratch(blk, nq, ng)
	for r := 0; r < nq; r++ {
		for g := 0; g < ng; g++ {
			var t float32
			for _, e := range xs[r*hd+g*G : r*hd+(g+1)*G] {
				t += e
			}
			qsum[r*ng+g] = t
		}
	}
	for i := i0; i < i1; {
		e, codes, params := cs.codeRows(h, i, i1)
		rb, pr := len(codes)/(e-i), len(params)/(e-i)
		for a := i; a < e; a += attendTokens {
			n := min(e-a, attendTokens)
			cb := codes[(a-i)*rb : (a-i+n)*rb]
			codeParams(cs, params[(a-i)*pr:], n, ng, sz)
			for r := 0; r < nq; r++ {
				row := s[r*lds+a-i0 : r*lds+a-i0+n]
				if ng == 1 {
					kernels.CodeDots(row, xs[r*hd:(r+1)*hd], cb, bits, rb, n)
					qr := qsum[r]
					for j := range row {
						row[j] = sz[2*j] * (row[j] - sz[2*j+1]*qr)
					}
					continue
				}
				clear(row)
				for g := 0; g < ng; g++ {
					t := tmp[:n]
					kernels.CodeDots(t, xs[r*hd+g*G:r*hd+(g+1)*G], cb[g*gb:], bits, rb, n)
					qg := qsum[r*ng+g]
					for j := range row {
						k := 2 * (j*ng + g)
						row[j] += sz[k] * (t[j] - sz[k+1]*qg)
					}
				}
			}
		}
		i = e
	}
}

// codeQ8MaxNQ is the most query rows codeScoresQ8 takes (its stack
// arrays; codeRowsMaxNQ is at most this).
const codeQ8MaxNQ = 8

// codeScoresQ8 is codeScoresRows for one group per row by integer dot
// products (kernels.CodeDotsQ8, AVX-512 VNNI or AVX2): each query row is rounded
// once to int8 with its absmax scale δ_r = max|x_r|/127, which moves a
// score by at most (δ_r/2)·‖x̂_j‖₁ (kernels codesq8.go; TestCodeDotsQ8,
// TestAttendCodesQ8Bound), and the row's scale and zero are applied in
// the kernel. It returns false, doing nothing, where the kernels do not
// take the shape (kernels.CodeQ8Fast) or nq exceeds codeQ8MaxNQ. 8-bit
// keys take it too, as llama.cpp scores q8_0 keys against a query
// rounded to q8_0: the float kernel (kernels.CodeDots, AVX2) and its
// scale/zero pass held int8 KV decode below fp16's at 8,192 tokens
// (BenchmarkDecodeLongKV mha-4bit: keys 3.9 of 9.0 ms per step; with
// this kernel 2.4 of 7.2 ms), and the query's rounding adds an error of
// the size of the codes' own (tiny1m decode-faithful KL, no windows,
// 0.00012 → 0.00019; with 16+64 windows 0.00000 either way).
func codeScoresQ8(cs codeStore, bits, hd, h, i0, i1, nq int, xs, s []float32, lds int, blk []float32) bool {
	if !roundsQuery(bits, hd, nq) {
		return false
	}
	_, sz, _ := codeRowsScratch(blk, nq, 1)
	L := kernels.CodeQ8Len(hd)
	rest := blk[nq+3*attendTokens:]
	if 4*len(rest) < nq*L {
		return false
	}
	qb := unsafe.Slice((*byte)(unsafe.Pointer(&rest[0])), 4*len(rest))[:nq*L]
	if sym, _ := cs.symZero(); !sym {
		codeScoresQ8F16(cs, bits, hd, h, i0, i1, nq, xs, s, lds, qb)
		return true
	}
	var sc, sm [codeQ8MaxNQ]float32
	for r := 0; r < nq; r++ {
		sc[r], sm[r] = kernels.CodeQ8Query(qb[r*L:(r+1)*L], xs[r*hd:(r+1)*hd], bits)
	}
	for i := i0; i < i1; {
		e, codes, params := cs.codeRows(h, i, i1)
		rb, pr := len(codes)/(e-i), len(params)/(e-i)
		for a := i; a < e; a += attendTokens {
			n := min(e-a, attendTokens)
			cb := codes[(a-i)*rb : (a-i+n)*rb]
			codeParams(cs, params[(a-i)*pr:], n, 1, sz)
			for r := 0; r < nq; r++ {
				row := s[r*lds+a-i0 : r*lds+a-i0+n]
				kernels.CodeDotsQ8(row, qb[r*L:(r+1)*L], sc[r], sm[r], cb, bits, rb, n, sz)
			}
		}
		i = e
	}
	return true
}

// codeScoresQ8F16 is codeScoresQ8 for rows with an fp16 scale and zero
// (asymmetric stores), read by the kernels themselves: one call per run
// and query row (kernels.CodeDotsQ8F16), or, for GQA groups of a multiple
// of 4 query rows, per run and 4 rows (kernels.CodeDotsQ8F16x4: each
// unit of codes loaded once for the 4 rows; more than 4 rows take the
// run in pieces of codeQ8Piece rows so that the later groups read them
// from L1). The scores have the bits codeScoresQ8's per-row path gives.
// qb is [nq·CodeQ8Len(hd)] bytes of scratch.
func codeScoresQ8F16(cs codeStore, bits, hd, h, i0, i1, nq int, xs, s []float32, lds int, qb []byte) {
	L := kernels.CodeQ8Len(hd)
	if nq%4 != 0 {
		var sc, sm [codeQ8MaxNQ]float32
		for r := 0; r < nq; r++ {
			sc[r], sm[r] = kernels.CodeQ8Query(qb[r*L:(r+1)*L], xs[r*hd:(r+1)*hd], bits)
		}
		for i := i0; i < i1; {
			e, codes, params := cs.codeRows(h, i, i1)
			rb := len(codes) / (e - i)
			for r := 0; r < nq; r++ {
				kernels.CodeDotsQ8F16(s[r*lds+i-i0:r*lds+e-i0], qb[r*L:(r+1)*L], sc[r], sm[r], codes, bits, rb, e-i, params)
			}
			i = e
		}
		return
	}
	var coef [2 * codeQ8MaxNQ]float32
	for g := 0; g < nq/4; g++ {
		kernels.CodeQ8Query4(qb[4*g*L:4*(g+1)*L], xs[4*g*hd:4*(g+1)*hd], bits, coef[8*g:8*(g+1)])
	}
	piece := i1 - i0
	if nq > 4 {
		piece = codeQ8Piece
	}
	for i := i0; i < i1; {
		e, codes, params := cs.codeRows(h, i, i1)
		rb := len(codes) / (e - i)
		for a := i; a < e; a += piece {
			b := min(e, a+piece)
			cb, pb := codes[(a-i)*rb:(b-i)*rb], params[2*(a-i):2*(b-i)]
			for g := 0; g < nq/4; g++ {
				kernels.CodeDotsQ8F16x4(s[4*g*lds+a-i0:], lds, qb[4*g*L:4*(g+1)*L], coef[8*g:8*(g+1)], cb, bits, rb, b-a, pb)
			}
		}
		i = e
	}
}

// codeQ8Piece is the rows of a run codeScoresQ8F16 and codeAccumRows
// give each group of 4 query rows in turn when more than 4 share a KV
// head (256 rows: 16 KiB of int8 codes).
const codeQ8Piece = 256

// roundsQuery reports whether codeScoresQ8 takes nq query rows of codes
// of bits, head_dim hd (one group per row).
func roundsQuery(bits, hd, nq int) bool {
	return codeQ8 && nq <= codeQ8MaxNQ && kernels.CodeQ8Fast(hd, bits)
}

// codeQ8 enables codeScoresQ8 and the int8-weight and AVX-512 value
// kernels of codeAccumRows (tests compare them with the AVX2 float
// kernels).
var codeQ8 = true

// codeScores writes s[i*lds + j−i0] = x_i·x̂_j for the nq query rows xs
// ([nq, hd], in the side's space), store indices [i0, i1) of head h;
// blk is [attendTokens, hd] scratch, sz [2·attendTokens] and qsum [nq].
// It returns false, doing nothing, for rows of several groups that the
// row kernels do not take (the caller decodes them with getRaw).
func codeScores(cs codeStore, bits, hd, h, i0, i1, nq int, xs, s []float32, lds int, blk, sz, qsum []float32) bool {
	ng := cs.codeGroups()
	if useCodeRows(hd/ng, nq, bits) {
		codeScoresRows(cs, bits, hd, ng, h, i0, i1, nq, xs, s, lds, blk)
		return true
	}
	if ng != 1 {
		return false
	}
	for i := 0; i < nq; i++ {
		var t float32
		for _, e := range xs[i*hd : (i+1)*hd] {
			t += e
		}
		qsum[i] = t
	}
	for a := i0; a < i1; a += attendTokens {
		b := min(i1, a+attendTokens)
		codeBlock(cs, bits, hd, h, a, b, blk, sz)
		kernels.MatMulNT(nq, b-a, hd, xs, hd, blk, hd, s[a-i0:], lds)
		scs, zs := sz[:b-a], sz[attendTokens:attendTokens+b-a]
		for r := 0; r < nq; r++ {
			row, qr := s[r*lds+a-i0:r*lds+b-i0], qsum[r]
			row = row[:len(scs)]
			zs := zs[:len(scs)]
			for j, sc := range scs {
				row[j] = sc * (row[j] - zs[j]*qr)
			}
		}
	}
	return true
}

// codeAccum adds Σ_j p[i*ldp + j−i0]·x̂_j over store indices [i0, i1) of
// head h to acc[i] ([nq, hd]); blk is [attendTokens, hd], w
// [nq, attendTokens] and tmp [nq, hd] scratch, sz [2·attendTokens], cz
// [nq]. It returns false, doing nothing, where codeScores does.
func codeAccum(cs codeStore, bits, hd, h, i0, i1, nq int, p []float32, ldp int, acc, blk, w, tmp, sz, cz []float32) bool {
	ng := cs.codeGroups()
	if useCodeRows(hd/ng, nq, bits) {
		codeAccumRows(cs, bits, hd, ng, h, i0, i1, nq, p, ldp, acc, blk)
		return true
	}
	if ng != 1 {
		return false
	}
	clear(cz[:nq])
	for a := i0; a < i1; a += attendTokens {
		b := min(i1, a+attendTokens)
		codeBlock(cs, bits, hd, h, a, b, blk, sz)
		scs, zs := sz[:b-a], sz[attendTokens:attendTokens+b-a]
		for r := 0; r < nq; r++ {
			pr, wr := p[r*ldp+a-i0:r*ldp+b-i0], w[r*attendTokens:r*attendTokens+b-a]
			pr = pr[:len(scs)]
			wr = wr[:len(scs)]
			for j, sc := range scs {
				wr[j] = pr[j] * sc
			}
			cz[r] += kernels.Dot(wr, zs)
		}
		kernels.MatMulNN(nq, hd, b-a, w, attendTokens, blk, hd, tmp, hd)
		kernels.Axpy(1, tmp[:nq*hd], acc[:nq*hd])
	}
	for r := 0; r < nq; r++ {
		row := acc[r*hd : (r+1)*hd]
		for c := range row {
			row[c] -= cz[r]
		}
	}
	return true
}

// codeAccumRows is codeAccum by the row kernels: for each run of rows in
// a page, attendTokens rows at a time, per group g: w_j = p_j·s_jg,
// acc_g += Σ_j w_j·c_jg by kernels.CodeAxpy and cz_g += Σ_j w_j·z_jg,
// subtracted from the group's channels at the end.
func codeAccumRows(cs codeStore, bits, hd, ng, h, i0, i1, nq int, p []float32, ldp int, acc, blk []float32) {
	if avx512 := accumAVX512(cs, bits, hd, ng); avx512 || accumQ8(cs, bits, hd, ng, nq, kvq.PackedLen(hd, bits)) {
		// One call per run and query row (AVX-512: w_j = p_j·s_j and
		// the zero term in the kernel, fp16 parameters read directly),
		// or per run and 4 query rows for GQA groups of a multiple of 4
		// (kernels.CodeAccumF16x4: each row's codes widened once for the
		// 4; more than 4 take the run in pieces of codeQ8Piece rows, so
		// that the later groups read them from L1).
		if nq%4 == 0 && avx512 {
			piece := i1 - i0
			if nq > 4 {
				piece = codeQ8Piece
			}
			for i := i0; i < i1; {
				e, codes, params := cs.codeRows(h, i, i1)
				rb := len(codes) / (e - i)
				for a := i; a < e; a += piece {
					b := min(e, a+piece)
					cb, pb := codes[(a-i)*rb:(b-i)*rb], params[2*(a-i):2*(b-i)]
					for g := 0; g < nq/4; g++ {
						kernels.CodeAccumF16x4(acc[4*g*hd:4*(g+1)*hd], p[4*g*ldp+a-i0:], ldp, pb, cb, bits, rb, b-a, blk[:4*hd])
					}
				}
				i = e
			}
			return
		}
		// Other row counts (MHA: one per KV head): 2-bit rows of
		// head_dim 64 or 128 with the weights rounded to int8 per 16 rows
		// (kernels.CodeAccumQ8, VNNI: a quarter of the float kernel's
		// instructions; AVX2 CPUs without AVX-512 take this branch only
		// for it), else the float kernel.
		for i := i0; i < i1; {
			e, codes, params := cs.codeRows(h, i, i1)
			rb := len(codes) / (e - i)
			accum := kernels.CodeAccumF16
			if accumQ8(cs, bits, hd, ng, nq, rb) {
				accum = kernels.CodeAccumQ8
			}
			for r := 0; r < nq; r++ {
				accum(acc[r*hd:(r+1)*hd], p[r*ldp+i-i0:r*ldp+e-i0], params, codes, bits, rb, e-i, blk[:hd])
			}
			i = e
		}
		return
	}
	G, gb := hd/ng, hd/ng*bits/8
	cz, sz, w := codeRowsScratch(blk, nq, ng)
	clear(cz)
	for i := i0; i < i1; {
		e, codes, params := cs.codeRows(h, i, i1)
		rb, pr := len(codes)/(e-i), len(params)/(e-i)
		for a := i; a < e; a += attendTokens {
			n := min(e-a, attendTokens)
			cb := codes[(a-i)*rb : (a-i+n)*rb]
			codeParams(cs, params[(a-i)*pr:], n, ng, sz)
			wr := w[:n]
			for r := 0; r < nq; r++ {
				prow := p[r*ldp+a-i0 : r*ldp+a-i0+n]
				for g := 0; g < ng; g++ {
					var z float32
					for j, pj := range prow {
						k := 2 * (j*ng + g)
						wj := pj * sz[k]
						wr[j] = wj
						z += wj * sz[k+1]
					}
					cz[r*ng+g] += z
					kernels.CodeAxpy(acc[r*hd+g*G:r*hd+(g+1)*G], wr, cb[g*gb:], bits, rb, n)
				}
			}
		}
		i = e
	}
	for r := 0; r < nq; r++ {
		for g := 0; g < ng; g++ {
			z := cz[r*ng+g]
			for c := r*hd + g*G; c < r*hd+(g+1)*G; c++ {
				acc[c] -= z
			}
		}
	}
}

// rowsOK reports whether kivi2's per-channel keys take the row kernels
// for nq query rows: 2, 4 or 8 bits and a head_dim the kernels take.
func (s channelRaw) rowsOK(nq int) bool {
	return (s.bits == 2 || s.bits == 4 || s.bits == 8) && useCodeRows(s.hd, nq, s.bits)
}

// scoresRows writes s[r*lds + j−i0] = x_r·x̂_j for store indices [i0, i1)
// of head h of a per-channel store: in a block of tokens sharing the
// channel scales σ_c and zeros z_c, x̂_jc = σ_c·(c_jc − z_c), so with
// x' = x∘σ (once per block and row) x·x̂_j = x'·c_j − x'·z by
// kernels.CodeDots on the block's codes. blk is [attendTokens, hd]
// scratch (σ, z and x' take 3·hd).
func (s channelRaw) scoresRows(h, i0, i1, nq int, xs, out []float32, lds int, blk []float32) {
	hd := s.hd
	sc, z, xp := blk[:hd], blk[hd:2*hd], blk[2*hd:3*hd]
	for i := i0; i < i1; {
		e := min(i1, (i/s.block+1)*s.block)
		b := s.p.get(i)
		op := s.params.at(s.p, h, i)
		kernels.WidenHalf(kernels.F16, sc, b.u16[op:op+hd])
		kernels.WidenHalf(kernels.F16, z, b.u16[op+hd:op+2*hd])
		oc := s.codes.at(s.p, h, i)
		codes := b.u8[oc : oc+(e-i)*s.rb]
		for r := 0; r < nq; r++ {
			var off float32
			for c, x := range xs[r*hd : (r+1)*hd] {
				xp[c] = x * sc[c]
				off += xp[c] * z[c]
			}
			row := out[r*lds+i-i0 : r*lds+e-i0]
			kernels.CodeDots(row, xp, codes, s.bits, s.rb, e-i)
			for j := range row {
				row[j] -= off
			}
		}
		i = e
	}
}

// llama.cpp's q8_0/q4_0 rows (store_ggml.go) in their raw space (the
// block Hadamard applied to q once, kept on the output): a row is hd/32
// blocks of an fp16 scale d_b and 32 codes; q8_0 codes are int8 (x̂ =
// d_b·c), q4_0 codes nibbles with byte j holding elements j (low) and
// j+16 (high) of the block (x̂ = d_b·(c − 8)). For q4_0 the query is
// permuted per block into the kernels' order (element 2j ← j, 2j+1 ←
// j+16), and the accumulated output permuted back.

// ggmlRows returns the store's q8_0/q4_0 codec when the row kernels take
// nq query rows (blocks of 32: kernels.CodeRowsFast(32); at most 32 rows,
// the scratch of blk).
func ggmlRows(sd *side, nq int) (rowRaw, *ggmlCodec, bool) {
	rr, ok := sd.raw.(rowRaw)
	if !ok || sd.norm || nq > 32 {
		return rowRaw{}, nil, false
	}
	g, ok := rr.c.(*ggmlCodec)
	return rr, g, ok && g.hd%ggmlBlock == 0 && useCodeRows(ggmlBlock, nq, g.bits)
}

// kernelBits is the codes' kernels.CodeDots width.
func (c *ggmlCodec) kernelBits() int {
	if c.bits == 8 {
		return kernels.CodeS8
	}
	return 4
}

// permute writes x ([hd], model order) into dst in the kernels' order
// (q4_0; a copy for q8_0); unpermute adds src (kernels' order) to dst.
func (c *ggmlCodec) permute(dst, x []float32) {
	if c.bits == 8 {
		copy(dst[:c.hd], x[:c.hd])
		return
	}
	for b := 0; b < c.hd; b += ggmlBlock {
		for j := 0; j < ggmlBlock/2; j++ {
			dst[b+2*j], dst[b+2*j+1] = x[b+j], x[b+j+ggmlBlock/2]
		}
	}
}

func (c *ggmlCodec) unpermuteAdd(dst, src []float32) {
	if c.bits == 8 {
		kernels.Axpy(1, src[:c.hd], dst[:c.hd])
		return
	}
	for b := 0; b < c.hd; b += ggmlBlock {
		for j := 0; j < ggmlBlock/2; j++ {
			dst[b+j] += src[b+2*j]
			dst[b+j+ggmlBlock/2] += src[b+2*j+1]
		}
	}
}

// ggmlScratch splits blk ([attendTokens, hd]) for nq ≤ 32 rows of nb
// blocks: permuted queries or accumulators [nq·hd], per-block query sums
// or corrections [nq·nb], the chunk's scales [attendTokens·nb] and a row
// buffer [attendTokens].
func ggmlScratch(blk []float32, hd, nq, nb int) (xp, qs, d, tmp []float32) {
	xp, blk = blk[:nq*hd], blk[nq*hd:]
	qs, blk = blk[:nq*nb], blk[nq*nb:]
	d, blk = blk[:attendTokens*nb], blk[attendTokens*nb:]
	return xp, qs, d, blk[:attendTokens]
}

// ggmlChunk calls f(a, n, cb) for the chunks of at most attendTokens rows
// of head h in [i0, i1) within one page (cb: their bytes, rb apart),
// with d[j·nb+b] the scale of block b of the chunk's row j.
func (s rowRaw) ggmlChunk(g *ggmlCodec, h, i0, i1 int, d []float32, f func(a, n int, cb []byte)) {
	nb, bb := g.hd/ggmlBlock, g.blockBytes()
	for i := i0; i < i1; {
		e := s.p.runEnd(i, i1)
		b := s.p.get(i)
		o := s.vals.at(s.p, h, i)
		codes := b.u8[o : o+(e-i)*s.rb]
		for a := i; a < e; a += attendTokens {
			n := min(e-a, attendTokens)
			cb := codes[(a-i)*s.rb : (a-i+n)*s.rb]
			for j := 0; j < n; j++ {
				for k := 0; k < nb; k++ {
					d[j*nb+k] = getF16(cb[j*s.rb+k*bb:])
				}
			}
			f(a, n, cb)
		}
		i = e
	}
}

// ggmlScores writes out[r*lds + j−i0] = x_r·x̂_j (raw space) for store
// indices [i0, i1) of head h: per block b, t = x'_b·c_jb by
// kernels.CodeDots, s_j = Σ_b d_jb·(t − 8·Σ_{c∈b} x_c) (q4_0; q8_0 without
// the offset).
func (s rowRaw) ggmlScores(g *ggmlCodec, h, i0, i1, nq int, xs, out []float32, lds int, blk []float32) {
	hd, nb, bb, kb := g.hd, g.hd/ggmlBlock, g.blockBytes(), g.kernelBits()
	xp, qsum, d, tmp := ggmlScratch(blk, hd, nq, nb)
	for r := 0; r < nq; r++ {
		g.permute(xp[r*hd:], xs[r*hd:])
		for k := 0; k < nb; k++ {
			var t float32
			if g.bits == 4 {
				for _, e := range xs[r*hd+k*ggmlBlock : r*hd+(k+1)*ggmlBlock] {
					t += e
				}
			}
			qsum[r*nb+k] = 8 * t
		}
	}
	s.ggmlChunk(g, h, i0, i1, d, func(a, n int, cb []byte) {
		for r := 0; r < nq; r++ {
			row := out[r*lds+a-i0 : r*lds+a-i0+n]
			clear(row)
			for k := 0; k < nb; k++ {
				t := tmp[:n]
				kernels.CodeDots(t, xp[r*hd+k*ggmlBlock:r*hd+(k+1)*ggmlBlock], cb[k*bb+2:], kb, s.rb, n)
				off := qsum[r*nb+k]
				for j := range row {
					row[j] += d[j*nb+k] * (t[j] - off)
				}
			}
		}
	})
}

// ggmlAccum adds Σ_j p[r*ldp + j−i0]·x̂_j (raw space) over store indices
// [i0, i1) of head h to acc[r] ([nq, hd]): per block b, w_j = p_j·d_jb,
// Σ_j w_j·c_jb by kernels.CodeAxpy (permuted back at the end) and, for
// q4_0, 8·Σ_j w_j subtracted from the block's channels.
func (s rowRaw) ggmlAccum(g *ggmlCodec, h, i0, i1, nq int, p []float32, ldp int, acc, blk []float32) {
	hd, nb, bb, kb := g.hd, g.hd/ggmlBlock, g.blockBytes(), g.kernelBits()
	ap, cz, d, w := ggmlScratch(blk, hd, nq, nb)
	clear(ap)
	clear(cz)
	s.ggmlChunk(g, h, i0, i1, d, func(a, n int, cb []byte) {
		wr := w[:n]
		for r := 0; r < nq; r++ {
			prow := p[r*ldp+a-i0 : r*ldp+a-i0+n]
			for k := 0; k < nb; k++ {
				var z float32
				for j, pj := range prow {
					wj := pj * d[j*nb+k]
					wr[j] = wj
					z += wj
				}
				cz[r*nb+k] += z
				kernels.CodeAxpy(ap[r*hd+k*ggmlBlock:r*hd+(k+1)*ggmlBlock], wr, cb[k*bb+2:], kb, s.rb, n)
			}
		}
	})
	for r := 0; r < nq; r++ {
		if g.bits == 4 {
			for k := 0; k < nb; k++ {
				z := 8 * cz[r*nb+k]
				for c := r*hd + k*ggmlBlock; c < r*hd+(k+1)*ggmlBlock; c++ {
					ap[c] -= z
				}
			}
		}
		g.unpermuteAdd(acc[r*hd:], ap[r*hd:])
	}
}

// QueryRounder is implemented by the caches of New and Pool: whether
// their KVAttender scores a layer's quantized keys against a query
// rounded to int8 for nq query rows (codeScoresQ8; depends on the CPU),
// or accumulates its values with the attention weights rounded to int8
// (kernels.CodeAccumQ8), so that a comparison with the
// dequantise-then-attend path (Read) must allow the rounding's bound:
// (max|x|/254)·‖x̂_j‖₁ per score for the side-space query x and key x̂_j;
// for values, each weight p_j·s_j moved by at most 1/254 of the largest
// of its block of 16 rows.
type QueryRounder interface {
	RoundsQuery(layer, nq int) bool
}

var _ QueryRounder = (*cache)(nil)

// RoundsQuery implements QueryRounder: true where the layer's keys are
// scored against the int8-rounded query or its values accumulated with
// int8-rounded weights (roundsWeights).
func (c *cache) RoundsQuery(layer, nq int) bool {
	L := &c.layers[layer]
	cs, bits, ok := codesOf(&L.k)
	return ok && cs.codeGroups() == 1 && useCodeRows(L.hd, nq, bits) && roundsQuery(bits, L.hd, nq) || c.roundsWeights(layer, nq)
}

// roundsWeights reports whether AccumV of layer for nq query rows takes
// kernels.CodeAccumQ8 (the weights p_j·s_j rounded to int8 per 16 rows):
// codeAccumRows's condition.
func (c *cache) roundsWeights(layer, nq int) bool {
	L := &c.layers[layer]
	cs, bits, ok := codesOf(&L.v)
	if !ok {
		return false
	}
	ng := cs.codeGroups()
	return useCodeRows(L.hd/ng, nq, bits) && accumQ8(cs, bits, L.hd, ng, nq, kvq.PackedLen(L.hd, bits))
}

// accumAVX512 reports whether codeAccumRows takes rows of cs (bits,
// head_dim hd, ng groups) by the AVX-512 value kernels: one group of an
// asymmetric grid.
func accumAVX512(cs codeStore, bits, hd, ng int) bool {
	sym, _ := cs.symZero()
	return ng == 1 && !sym && codeQ8 && kernels.CodeAccumFast(hd, bits)
}

// accumQ8 reports whether codeAccumRows accumulates nq query rows of
// rows of cs (rb bytes apart) by kernels.CodeAccumQ8 (int8-rounded
// weights; AVX-512 VBMI or AVX2): one group of an asymmetric grid, a
// shape the kernel takes, and not a GQA group of a multiple of 4 where
// AVX-512 runs (kernels.CodeAccumF16x4 takes those). Without AVX-512 a
// GQA group's rows take one CodeAccumQ8 call each (BenchmarkDecodeLongKV
// gqa-f32 oscar2 at 8,192 tokens, AMD EPYC without AVX-512: 78.5 → 97–125
// tokens/cpu-s, fp16 78–91 in the same runs).
func accumQ8(cs codeStore, bits, hd, ng, nq, rb int) bool {
	sym, _ := cs.symZero()
	return ng == 1 && !sym && codeQ8 && (nq%4 != 0 || !kernels.CodeAccumFast(hd, bits)) && kernels.CodeAccumQ8Fast(hd, bits, rb)
}
