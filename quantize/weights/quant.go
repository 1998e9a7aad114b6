package weights

import (
	"errors"
	"fmt"
	"math"
	goruntime "runtime"
	"sync"
)

// Sentinel errors; returned errors wrap one of these (test with errors.Is).
var (
	// ErrOptions: unsupported bits, group size or block size, or a shape
	// that the group size does not divide.
	ErrOptions = errors.New("weights: invalid options")
	// ErrShape: slice lengths that do not match rows×cols.
	ErrShape = errors.New("weights: shape mismatch")
	// ErrNonFinite: a NaN or ±Inf weight, activation or Hessian entry.
	ErrNonFinite = errors.New("weights: non-finite value")
	// ErrRange: a group's scale does not fit in float16 (|w| too large).
	ErrRange = errors.New("weights: scale out of float16 range")
	// ErrNotPositiveDefinite: the damped Hessian (or its inverse) has no
	// Cholesky factorisation.
	ErrNotPositiveDefinite = errors.New("weights: Hessian not positive definite")
)

// Options selects the quantization grid (docs/METHODS.md §7).
type Options struct {
	// Bits is the code width: 1 (asymmetric only, see binaryGrid), 2, 3,
	// 4 or 8.
	Bits int
	// GroupSize is the number of consecutive input columns sharing one
	// scale (and zero-point): 32, 64 or 128, or 0 for per output channel
	// (one group spanning all columns).
	GroupSize int
	// Symmetric selects the symmetric grid: scale = 2·max|w|/(2^bits−1),
	// implicit zero-point 2^(bits−1), no zero-points stored. Otherwise the
	// grid is asymmetric min-max with a stored zero-point.
	Symmetric bool
	// MSEClip shrinks each group's range [min, max] by the factor in
	// {1, 0.99, …, 0.20} that minimises the group's squared rounding error
	// (clipping the outliers), instead of using the full range: the "mse"
	// grid search of the GPTQ reference quantizer (find_params, with the
	// squared error). It matters at 2-3 bits on heavy-tailed rows; the
	// per-element bound |w − ŵ| ≤ scale/2 then holds only inside the
	// clipped range. Ignored at 1 bit (binaryGrid is already least-squares).
	MSEClip bool
}

// Quantized is a packed quantized weight matrix.
//
// Element (r, c) of the original [Rows, Cols] matrix (c in storage order,
// see Perm) is ŵ = Scales[r·G + c/GroupSize] · (q − z), where G =
// Cols/GroupSize, q is the code and z = Zeros[r·G + c/GroupSize] when
// asymmetric or 2^(Bits−1) when symmetric.
type Quantized struct {
	// Rows and Cols are the shape of the weight matrix [out, in].
	Rows, Cols int
	// Bits is the code width (1, 2, 3, 4 or 8).
	Bits int
	// GroupSize is the columns per group; Cols for per-channel.
	GroupSize int
	// Symmetric tells whether Zeros is implicit (2^(Bits−1)).
	Symmetric bool
	// Codes: [Rows, RowBytes(Cols, Bits)] uint8, each row a bit stream,
	// LSB first (see PackRow).
	Codes []byte
	// Scales: [Rows, Cols/GroupSize] float16 bits, all > 0 and finite.
	Scales []uint16
	// Zeros: [Rows, Cols/GroupSize] float16 bits holding integers in
	// [0, 2^Bits−1] (at 1 bit any finite value: the fractional zero-point
	// of binaryGrid); nil when Symmetric.
	Zeros []uint16
	// Perm is nil for the natural column order. Otherwise (GPTQ act-order
	// with several groups per row) storage column j holds original column
	// Perm[j]: codes and groups are in permuted order, and Dequantize
	// writes storage column j to dst[r·Cols + Perm[j]]. [Cols] int32.
	Perm []int32
}

// Dequantize writes the dequantized matrix into dst, [Rows, Cols] float32
// row-major in the original column order. It panics if len(dst) < Rows·Cols
// (a programmer error).
func (q *Quantized) Dequantize(dst []float32) {
	_ = dst[q.Rows*q.Cols-1]
	rb := RowBytes(q.Cols, q.Bits)
	ng := q.Cols / q.GroupSize
	zsym := float64(int(1) << uint(q.Bits-1))
	for r := 0; r < q.Rows; r++ {
		row := q.Codes[r*rb : (r+1)*rb]
		out := dst[r*q.Cols : (r+1)*q.Cols]
		for g := 0; g < ng; g++ {
			s := f16ToFloat(q.Scales[r*ng+g])
			z := zsym
			if !q.Symmetric {
				z = f16ToFloat(q.Zeros[r*ng+g])
			}
			for j := g * q.GroupSize; j < (g+1)*q.GroupSize; j++ {
				v := float32(s * (float64(getCode(row, j, q.Bits)) - z))
				if q.Perm != nil {
					out[q.Perm[j]] = v
				} else {
					out[j] = v
				}
			}
		}
	}
}

// Bytes returns the storage size in bytes: packed codes, 2 bytes per scale
// and per stored zero-point, and 4 bytes per Perm entry.
func (q *Quantized) Bytes() int64 {
	return int64(len(q.Codes)) + 2*int64(len(q.Scales)) + 2*int64(len(q.Zeros)) + 4*int64(len(q.Perm))
}

// BitsPerWeight returns 8·Bytes()/(Rows·Cols): code bits plus scale and
// zero-point (and Perm) overhead. For asymmetric 4-bit with group 128 and
// Cols a multiple of 8 it is 4 + 32/128 = 4.25; symmetric, 4 + 16/128.
func (q *Quantized) BitsPerWeight() float64 {
	return 8 * float64(q.Bytes()) / float64(q.Rows*q.Cols)
}

// validate checks opt against the shape and returns the effective group
// size (cols for per-channel).
func validate(w []float32, rows, cols int, opt Options) (int, error) {
	switch opt.Bits {
	case 1:
		if opt.Symmetric {
			return 0, fmt.Errorf("%w: 1 bit needs the asymmetric grid (two levels per group), not symmetric", ErrOptions)
		}
	case 2, 3, 4, 8:
	default:
		return 0, fmt.Errorf("%w: bits %d, want 1, 2, 3, 4 or 8", ErrOptions, opt.Bits)
	}
	if rows <= 0 || cols <= 0 {
		return 0, fmt.Errorf("%w: shape [%d, %d], want positive rows and cols", ErrShape, rows, cols)
	}
	if len(w) != rows*cols {
		return 0, fmt.Errorf("%w: weight has %d elements, want rows×cols = %d×%d = %d", ErrShape, len(w), rows, cols, rows*cols)
	}
	g := opt.GroupSize
	switch g {
	case 0:
		g = cols
	case 32, 64, 128:
		if cols%g != 0 {
			return 0, fmt.Errorf("%w: cols %d not divisible by group size %d", ErrOptions, cols, g)
		}
	default:
		return 0, fmt.Errorf("%w: group size %d, want 32, 64, 128 or 0 (per-channel)", ErrOptions, g)
	}
	for i, v := range w {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return 0, fmt.Errorf("%w: weight [%d, %d] is %v", ErrNonFinite, i/cols, i%cols, v)
		}
	}
	return g, nil
}

// grid holds one group's parameters as stored (fp16-rounded) values.
type grid struct {
	s, z   float64 // scale and zero-point as dequantization sees them
	sh, zh uint16  // their fp16 bits
	maxq   float64
}

// findGrid computes the parameters of one group from its values. The range
// always includes 0 (as in the GPTQ reference) so the zero-point lies in
// [0, maxq]. The scale is rounded up to float16 so that every value lies
// within half a step of the grid: |w − ŵ| ≤ s/2.
func findGrid(vals func(func(float64)), bits int, sym, mse bool) (grid, error) {
	if bits == 1 {
		return binaryGrid(vals)
	}
	lo, hi := 0.0, 0.0
	vals(func(v float64) {
		lo = math.Min(lo, v)
		hi = math.Max(hi, v)
	})
	if mse {
		return mseGrid(vals, lo, hi, bits, sym)
	}
	return gridFromRange(lo, hi, bits, sym)
}

// mseGrid is Options.MSEClip: the grid of the range p·[lo, hi] with the
// least squared rounding error over vals, p = 1, 0.99, …, 0.20 (ties keep
// the larger p).
func mseGrid(vals func(func(float64)), lo, hi float64, bits int, sym bool) (grid, error) {
	best, err := gridFromRange(lo, hi, bits, sym)
	if err != nil {
		return grid{}, err
	}
	sqErr := func(g grid) float64 {
		var s float64
		vals(func(v float64) {
			d := v - g.value(g.code(v))
			s += d * d
		})
		return s
	}
	bestErr := sqErr(best)
	for i := 1; i <= 80; i++ {
		p := 1 - float64(i)/100
		g, err := gridFromRange(p*lo, p*hi, bits, sym)
		if err != nil {
			return grid{}, err
		}
		if e := sqErr(g); e < bestErr {
			best, bestErr = g, e
		}
	}
	return best, nil
}

// gridFromRange is findGrid for a group whose minimum and maximum are lo
// and hi (lo ≤ 0 ≤ hi).
func gridFromRange(lo, hi float64, bits int, sym bool) (grid, error) {
	maxq := float64(int(1)<<uint(bits) - 1)
	var raw float64
	if sym {
		a := math.Max(-lo, hi)
		raw = 2 * a / maxq
	} else {
		raw = (hi - lo) / maxq
	}
	if raw == 0 {
		raw = 1 // all-zero group: any scale reproduces it exactly
	}
	sh := f16RoundUp(raw)
	if sh >= 0x7c00 {
		return grid{}, fmt.Errorf("%w: range [%g, %g] needs scale %g > 65504", ErrRange, lo, hi, raw)
	}
	s := f16ToFloat(sh)
	gr := grid{s: s, sh: sh, maxq: maxq}
	if sym {
		gr.z = float64(int(1) << uint(bits-1))
	} else {
		gr.z = math.Min(maxq, math.Max(0, math.RoundToEven(-lo/s)))
		gr.zh = f16FromFloat(gr.z)
	}
	return gr, nil
}

// code returns the code of v on the grid (round half to even, clamped).
// The 1-bit grid's zero-point is fractional, so there v/s + z is rounded
// as a whole: the nearer of the two levels.
func (g grid) code(v float64) uint8 {
	if g.maxq == 1 {
		return uint8(math.Min(1, math.Max(0, math.RoundToEven(v/g.s+g.z))))
	}
	return uint8(math.Min(g.maxq, math.Max(0, math.RoundToEven(v/g.s)+g.z)))
}

// binaryGrid is the 1-bit grid of one group (asymmetric only): the two
// levels μ ± α, μ the group mean and α the mean of |w − μ|, the
// least-squares scale for fixed signs (XNOR-Net, Rastegari et al. 2016,
// §3.1, with a per-group offset). In the s·(q − z) form of Quantized the
// scale is s = 2α (float16, rounded to nearest) and the zero-point
// z = (α − μ)/s, a fractional float16 (the only width whose zero-point is
// not an integer), so the levels are s·(−z) ≈ μ − α and s·(1 − z) ≈ μ + α.
// A constant group (α = 0) gets s = 1 and its value as the level −z.
// vals is called twice. Errors: ErrRange when s or z is beyond float16
// (|μ|/α above about 6.5e4, or |w| above 65504).
func binaryGrid(vals func(func(float64))) (grid, error) {
	var sum float64
	n := 0
	vals(func(v float64) { sum += v; n++ })
	mu := sum / float64(n)
	var dev float64
	vals(func(v float64) { dev += math.Abs(v - mu) })
	a := dev / float64(n)
	raw := 2 * a
	sh := f16FromFloat(raw)
	if sh >= 0x7c00 {
		return grid{}, fmt.Errorf("%w: 1-bit group with mean %g and mean deviation %g needs scale %g > 65504", ErrRange, mu, a, raw)
	}
	var zr float64
	if sh == 0 { // a constant group, or one whose spread underflows float16
		sh = f16FromFloat(1)
		zr = -mu
	} else {
		zr = (a - mu) / f16ToFloat(sh)
	}
	s := f16ToFloat(sh)
	zh := f16FromFloat(zr)
	if zh&0x7c00 == 0x7c00 {
		return grid{}, fmt.Errorf("%w: 1-bit group with mean %g and mean deviation %g needs zero-point %g beyond float16", ErrRange, mu, a, zr)
	}
	return grid{s: s, sh: sh, z: f16ToFloat(zh), zh: zh, maxq: 1}, nil
}

// value returns the dequantized value of code c.
func (g grid) value(c uint8) float64 { return g.s * (float64(c) - g.z) }

func newQuantized(rows, cols, group int, opt Options) *Quantized {
	q := &Quantized{Rows: rows, Cols: cols, Bits: opt.Bits, GroupSize: group, Symmetric: opt.Symmetric,
		Codes:  make([]byte, rows*RowBytes(cols, opt.Bits)),
		Scales: make([]uint16, rows*(cols/group)),
	}
	if !opt.Symmetric {
		q.Zeros = make([]uint16, rows*(cols/group))
	}
	return q
}

func (q *Quantized) setGrid(r, g int, gr grid) {
	ng := q.Cols / q.GroupSize
	q.Scales[r*ng+g] = gr.sh
	if !q.Symmetric {
		q.Zeros[r*ng+g] = gr.zh
	}
}

// QuantizeRTN quantizes w, [rows, cols] float32 row-major (a Linear weight
// [out, in]), by round-to-nearest on a per-group min-max grid (docs/METHODS.md
// §7): for each row and each group of opt.GroupSize consecutive columns,
// asymmetric scale = (max−min)/(2^bits−1) and zero = round(−min/scale)
// with the range extended to include 0, or symmetric scale =
// 2·max|w|/(2^bits−1) with zero 2^(bits−1). The scale is stored as float16
// rounded up, and codes are computed with the stored scale, so every
// element satisfies |w − ŵ| ≤ scale/2.
//
// Errors: ErrOptions (bits, group size, cols not divisible), ErrShape,
// ErrNonFinite naming the element [row, col], ErrRange.
func QuantizeRTN(w []float32, rows, cols int, opt Options) (*Quantized, error) {
	group, err := validate(w, rows, cols, opt)
	if err != nil {
		return nil, err
	}
	q := newQuantized(rows, cols, group, opt)
	// Rows are independent: split them over GOMAXPROCS goroutines.
	workers := min(goruntime.GOMAXPROCS(0), max(1, rows*cols/(1<<16)), rows)
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for k := 0; k < workers; k++ {
		wg.Add(1)
		go func(k int) {
			defer wg.Done()
			errs[k] = q.rtnRows(w, k*rows/workers, (k+1)*rows/workers, opt)
		}(k)
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return q, nil
}

// rtnRows quantizes rows [r0, r1) of w into q.
func (q *Quantized) rtnRows(w []float32, r0, r1 int, opt Options) error {
	cols, group := q.Cols, q.GroupSize
	rb := RowBytes(cols, opt.Bits)
	for r := r0; r < r1; r++ {
		wr := w[r*cols : (r+1)*cols]
		row := q.Codes[r*rb : (r+1)*rb]
		for g := 0; g < cols/group; g++ {
			seg := wr[g*group : (g+1)*group]
			if opt.Bits == 1 {
				gr, err := binaryGrid(func(f func(float64)) {
					for _, v := range seg {
						f(float64(v))
					}
				})
				if err != nil {
					return fmt.Errorf("weights: row %d group %d: %w", r, g, err)
				}
				q.setGrid(r, g, gr)
				for j, v := range seg {
					putCode(row, g*group+j, 1, gr.code(float64(v)))
				}
				continue
			}
			var lo, hi float32
			for _, v := range seg {
				lo = min(lo, v)
				hi = max(hi, v)
			}
			var gr grid
			var err error
			if opt.MSEClip {
				gr, err = mseGrid(func(f func(float64)) {
					for _, v := range seg {
						f(float64(v))
					}
				}, float64(lo), float64(hi), opt.Bits, opt.Symmetric)
			} else {
				gr, err = gridFromRange(float64(lo), float64(hi), opt.Bits, opt.Symmetric)
			}
			if err != nil {
				return fmt.Errorf("weights: row %d group %d: %w", r, g, err)
			}
			q.setGrid(r, g, gr)
			for j, v := range seg {
				c := math.RoundToEven(float64(v)/gr.s) + gr.z // as grid.code
				if c < 0 {
					c = 0
				} else if c > gr.maxq {
					c = gr.maxq
				}
				putCode(row, g*group+j, opt.Bits, uint8(c))
			}
		}
	}
	return nil
}
