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
// and the products over a block run on the bare codes: a byte becomes
// its 4 (2-bit), 2 (4-bit) or 1 (8-bit) code values by one table copy,
// without the per-row scale and zero (applied once per score, or folded
// into the weights), into a block that stays in L1, and the block's
// matrix products (shared by the query heads of a GQA group) run in the
// AVX2 kernels.

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

func (s asymRaw) codeBits() (int, bool)    { return s.bits, s.ng == 1 && codeBitsOK(s.bits, s.hd) }
func (s asymRaw) symZero() (bool, float32) { return false, 0 }
func (s asymRaw) codeRows(h, i, i1 int) (int, []byte, []uint16) {
	e := s.p.runEnd(i, i1)
	b := s.p.get(i)
	oc, op := s.codes.at(s.p, h, i), s.params.at(s.p, h, i)
	return e, b.u8[oc : oc+(e-i)*s.rb], b.u16[op : op+2*(e-i)]
}

func (s sym2Raw) codeBits() (int, bool)    { return 2, codeBitsOK(2, s.hd) }
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
// expanded to float32 once, then shared by the rows' matrix product).
// Chosen by BenchmarkCodeKernels: decode (1 row, or a GQA group of 2–8)
// takes the row kernels; prefill chunks (many rows) the block path.
var codeRowsMaxNQ = 8

// useCodeRows reports whether nq rows of head_dim hd take the row kernels.
func useCodeRows(hd, nq int) bool { return nq <= codeRowsMaxNQ && kernels.CodeRowsFast(hd) }

// codeParams writes the scales and zeros of n rows (params as codeRows
// returns them) into sz: sz[2r] the scale, sz[2r+1] the zero of row r.
func codeParams(cs codeStore, params []uint16, n int, sz []float32) {
	if sym, z0 := cs.symZero(); sym {
		kernels.WidenHalf(kernels.F16, sz[n:2*n], params[:n])
		for r := 0; r < n; r++ {
			sz[2*r], sz[2*r+1] = sz[n+r], z0
		}
		return
	}
	kernels.WidenHalf(kernels.F16, sz[:2*n], params[:2*n])
}

// codeScoresRows is codeScores by the row kernels: for each run of rows
// in a page, attendTokens rows at a time, s = x·c_j by kernels.CodeDots,
// then s_j·(s − z_j·Σ_c x_c).
func codeScoresRows(cs codeStore, bits, hd, h, i0, i1, nq int, xs, s []float32, lds int, sz, qsum []float32) {
	for i := i0; i < i1; {
		e, codes, params := cs.codeRows(h, i, i1)
		rb := len(codes) / (e - i)
		for a := i; a < e; a += attendTokens {
			n := min(e-a, attendTokens)
			cb := codes[(a-i)*rb : (a-i+n)*rb]
			pa := params[(a-i)*len(params)/(e-i):]
			codeParams(cs, pa, n, sz)
			for r := 0; r < nq; r++ {
				row := s[r*lds+a-i0 : r*lds+a-i0+n]
				kernels.CodeDots(row, xs[r*hd:(r+1)*hd], cb, bits, rb, n)
				qr := qsum[r]
				for j := range row {
					row[j] = sz[2*j] * (row[j] - sz[2*j+1]*qr)
				}
			}
		}
		i = e
	}
}

// codeScores writes s[i*lds + j−i0] = x_i·x̂_j for the nq query rows xs
// ([nq, hd], in the side's space), store indices [i0, i1) of head h;
// blk is [attendTokens, hd] scratch, sz [2·attendTokens] and qsum [nq].
func codeScores(cs codeStore, bits, hd, h, i0, i1, nq int, xs, s []float32, lds int, blk, sz, qsum []float32) {
	for i := 0; i < nq; i++ {
		var t float32
		for _, e := range xs[i*hd : (i+1)*hd] {
			t += e
		}
		qsum[i] = t
	}
	if useCodeRows(hd, nq) {
		codeScoresRows(cs, bits, hd, h, i0, i1, nq, xs, s, lds, sz, qsum)
		return
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
}

// codeAccum adds Σ_j p[i*ldp + j−i0]·x̂_j over store indices [i0, i1) of
// head h to acc[i] ([nq, hd]); blk is [attendTokens, hd], w
// [nq, attendTokens] and tmp [nq, hd] scratch, sz [2·attendTokens], cz
// [nq].
func codeAccum(cs codeStore, bits, hd, h, i0, i1, nq int, p []float32, ldp int, acc, blk, w, tmp, sz, cz []float32) {
	clear(cz[:nq])
	if useCodeRows(hd, nq) {
		codeAccumRows(cs, bits, hd, h, i0, i1, nq, p, ldp, acc, w, sz, cz)
		return
	}
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
}

// codeAccumRows is codeAccum by the row kernels: for each run of rows in
// a page, attendTokens rows at a time, w_j = p_j·s_j, acc += Σ_j w_j·c_j
// by kernels.CodeAxpy and cz += Σ_j w_j·z_j, subtracted from every
// channel at the end.
func codeAccumRows(cs codeStore, bits, hd, h, i0, i1, nq int, p []float32, ldp int, acc, w, sz, cz []float32) {
	for i := i0; i < i1; {
		e, codes, params := cs.codeRows(h, i, i1)
		rb := len(codes) / (e - i)
		for a := i; a < e; a += attendTokens {
			n := min(e-a, attendTokens)
			cb := codes[(a-i)*rb : (a-i+n)*rb]
			pa := params[(a-i)*len(params)/(e-i):]
			codeParams(cs, pa, n, sz)
			wr := w[:n]
			for r := 0; r < nq; r++ {
				pr := p[r*ldp+a-i0 : r*ldp+a-i0+n]
				var z float32
				for j, pj := range pr {
					wj := pj * sz[2*j]
					wr[j] = wj
					z += wj * sz[2*j+1]
				}
				cz[r] += z
				kernels.CodeAxpy(acc[r*hd:(r+1)*hd], wr, cb, bits, rb, n)
			}
		}
		i = e
	}
	for r := 0; r < nq; r++ {
		row := acc[r*hd : (r+1)*hd]
		for c := range row {
			row[c] -= cz[r]
		}
	}
}
