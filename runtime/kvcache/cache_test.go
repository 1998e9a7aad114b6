package kvcache

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/quantize/kvq"
	"github.com/lmpack/lmpack/runtime"
)

var testLayers = []Layer{{NumKVHeads: 2, HeadDim: 64}, {NumKVHeads: 1, HeadDim: 16}, {NumKVHeads: 4, HeadDim: 8}}

// testBits are the oscar-mixed widths the test rotations carry: layer i
// has K at MixedWidths[i%3] and V at MixedWidths[(i+1)%3] bits.
func testBits(i int) (k, v int) { return MixedWidths[i%3], MixedWidths[(i+1)%3] }

// randRotations returns random orthogonal rotations for layers, with the
// given INT2 clipping ratios (0: none) and the widths of testBits.
func randRotations(rng *rand.Rand, layers []Layer, clipK, clipV float64) *Rotations {
	r := &Rotations{}
	for i, l := range layers {
		r.K = append(r.K, to32(randOrthogonal(rng, l.HeadDim)))
		r.V = append(r.V, to32(randOrthogonal(rng, l.HeadDim)))
		bk, bv := testBits(i)
		r.BitsK, r.BitsV = append(r.BitsK, bk), append(r.BitsV, bv)
		if clipK > 0 {
			r.ClipK = append(r.ClipK, clipK)
			r.ClipV = append(r.ClipV, clipV)
		}
	}
	return r
}

// roundTripErr writes n Gaussian tokens (prefill then decode) into a new
// cache of the method and returns the relative RMS error of K and V over
// all layers.
func roundTripErr(t *testing.T, name string, opt Options, n, prefill int, seed uint64) (ek, ev float64) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 1))
	k, v := tokens(rng, testLayers, n, nil), tokens(rng, testLayers, n, nil)
	c := mustNew(t, name, testLayers, n+3, opt)
	writeSteps(c, testLayers, k, v, 0, n, prefill)
	if c.Len() != n {
		t.Fatalf("%s: Len %d after %d tokens", name, c.Len(), n)
	}
	var allK, allV, gotK, gotV []float32
	for i, l := range testLayers {
		gk, gv := readAll(c, l, i, n)
		gotK, gotV = append(gotK, gk...), append(gotV, gv...)
		allK, allV = append(allK, k[i]...), append(allV, v[i]...)
	}
	return relErr(gotK, allK), relErr(gotV, allV)
}

func TestRoundTripErrorBounds(t *testing.T) {
	rng := rand.New(rand.NewPCG(42, 0))
	rot := randRotations(rng, testLayers, 0.96, 0.92)
	cases := []struct {
		name  string
		opt   Options
		bound float64 // relative RMS error, K and V
		floor float64 // the method must actually quantize: error ≥ floor
	}{
		{"fp32", Options{}, 0, 0},
		{"fp16", Options{}, 4e-4, 1e-5},
		{"int8", Options{}, 0.01, 1e-3},
		{"int4", Options{}, 0.12, 0.02},
		{"int2-naive", Options{}, 0.7, 0.2},
		{"kivi2", Options{Recent: 16}, 0.6, 0.2},
		{"quarot2", Options{}, 0.6, 0.2},
		{"oscar2", Options{Rotations: rot}, 0.6, 0.2},
		{"oscar2-g32", Options{Rotations: rot}, 0.6, 0.2},
		{"oscar4", Options{Rotations: rot}, 0.15, 0.02},
		{"oscars2", Options{Recent: 16}, 0.6, 0.2},
	}
	for _, c := range cases {
		ek, ev := roundTripErr(t, c.name, c.opt, 150, 37, 7)
		t.Logf("%-10s relative RMS error K %.4f V %.4f", c.name, ek, ev)
		for _, e := range []float64{ek, ev} {
			if !(e <= c.bound) || e < c.floor {
				t.Errorf("%s: relative error %.4g outside [%g, %g]", c.name, e, c.floor, c.bound)
			}
		}
	}
}

// Per-element bounds for the per-row methods: |x − x̂| ≤ scale/2 with
// scale = (max−min)/(2^b−1) of the (token, head) row, plus binary16
// rounding of scale (up) and zero; for int2-naive scale = max|x|/1.5.
func TestIntRowElementBounds(t *testing.T) {
	for _, m := range []struct {
		name string
		bits int
	}{{"int8", 8}, {"int4", 4}, {"int2-naive", 2}} {
		rng := rand.New(rand.NewPCG(3, uint64(m.bits)))
		n := 70
		k, v := tokens(rng, testLayers, n, func(c int) float64 { return 1 + float64(c%5) }), tokens(rng, testLayers, n, nil)
		c := mustNew(t, m.name, testLayers, n, Options{})
		writeSteps(c, testLayers, k, v, 0, n, 20)
		for i, l := range testLayers {
			gk, gv := readAll(c, l, i, n)
			for side, pair := range [][2][]float32{{k[i], gk}, {v[i], gv}} {
				x, got := pair[0], pair[1]
				for r := 0; r < n*l.NumKVHeads; r++ {
					row := x[r*l.HeadDim : (r+1)*l.HeadDim]
					lo, hi := kvq.MinMax(row)
					s := float64(hi-lo) / float64(int(1)<<m.bits-1)
					bound := s/2*(1+1.0/256) + math.Abs(float64(lo))/2048 + 1e-6
					if m.bits == 2 {
						bound = float64(kvq.AbsMax(row))/1.5/2*(1+1.0/256) + 1e-6
					}
					for j, want := range row {
						if e := math.Abs(float64(got[r*l.HeadDim+j] - want)); e > bound {
							t.Fatalf("%s layer %d side %d row %d: |x−x̂| = %g > %g", m.name, i, side, r, e, bound)
						}
					}
				}
			}
		}
	}
}

func TestFP16IsBinary16Rounding(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	n := 40
	k, v := tokens(rng, testLayers, n, nil), tokens(rng, testLayers, n, nil)
	c := mustNew(t, "fp16", testLayers, n, Options{Sink: 3, Recent: 5}) // windows do not apply to fp16
	writeSteps(c, testLayers, k, v, 0, n, 9)
	for i, l := range testLayers {
		gk, gv := readAll(c, l, i, n)
		for j := range gk {
			if gk[j] != kvq.RoundF16(k[i][j]) || gv[j] != kvq.RoundF16(v[i][j]) {
				t.Fatalf("layer %d element %d: got %v %v, want binary16 of %v %v", i, j, gk[j], gv[j], k[i][j], v[i][j])
			}
		}
	}
	var d int
	for _, l := range testLayers {
		d += l.NumKVHeads * l.HeadDim
	}
	if got, want := c.Bytes(), int64(n*d*2*2); got != want {
		t.Fatalf("fp16 Bytes %d, want %d", got, want)
	}
}

// outlierStd gives two channels 20× the standard deviation of the others
// (the key outlier channels OSCAR and OScaR target).
func outlierStd(c int) float64 {
	if c == 3 || c == 17 {
		return 20
	}
	return 1
}

// OSCAR's calibrated rotation must beat per-token INT2 without rotation on
// data with outlier channels. The data is x = z·diag(σ)·Qᵀ with a random
// orthogonal Q, so its covariance has eigenvectors Q's columns; R is the
// shipped composition U·H·P_br of those eigenvectors.
func TestOSCARBeatsNaiveOnOutliers(t *testing.T) {
	const d, nkv, n = 64, 4, 256
	layers := []Layer{{NumKVHeads: nkv, HeadDim: d}}
	rng := rand.New(rand.NewPCG(11, 12))
	q := randOrthogonal(rng, d) // row-major; x = z·diag(σ)·Qᵀ ⇒ covariance Q·diag(σ²)·Qᵀ
	// Eigenvectors sorted by descending variance: the outlier columns first.
	order := []int{3, 17}
	for c := 0; c < d; c++ {
		if c != 3 && c != 17 {
			order = append(order, c)
		}
	}
	eig := make([]float64, d*d) // row i = i-th eigenvector = column order[i] of Q
	for i, c := range order {
		for j := 0; j < d; j++ {
			eig[i*d+j] = q[j*d+c]
		}
	}
	r := oscarRotation(eig, d)
	gen := func() []float32 {
		x := make([]float32, n*nkv*d)
		z := make([]float64, d)
		for row := 0; row < n*nkv; row++ {
			for c := range z {
				z[c] = outlierStd(c) * rng.NormFloat64()
			}
			for j := 0; j < d; j++ {
				var s float64
				for c := 0; c < d; c++ {
					s += z[c] * q[j*d+c]
				}
				x[row*d+j] = float32(s)
			}
		}
		return x
	}
	k, v := [][]float32{gen()}, [][]float32{gen()}
	rot := &Rotations{K: [][]float32{r}, V: [][]float32{r}}
	errOf := func(name string, opt Options) (float64, float64) {
		c := mustNew(t, name, layers, n, opt)
		writeSteps(c, layers, k, v, 0, n, 64)
		gk, gv := readAll(c, layers[0], 0, n)
		return relErr(gk, k[0]), relErr(gv, v[0])
	}
	nk, nv := errOf("int2-naive", Options{})
	ok, ov := errOf("oscar2", Options{Rotations: rot})
	qk, qv := errOf("quarot2", Options{})
	t.Logf("relative RMS error K/V: int2-naive %.3f/%.3f, quarot2 %.3f/%.3f, oscar2 %.3f/%.3f", nk, nv, qk, qv, ok, ov)
	if !(ok < 0.8*nk && ov < 0.8*nv) {
		t.Errorf("oscar2 error %.3f/%.3f not clearly below int2-naive %.3f/%.3f", ok, ov, nk, nv)
	}
	if !(ok <= qk && ov <= qv) {
		t.Errorf("oscar2 error %.3f/%.3f above quarot2 %.3f/%.3f", ok, ov, qk, qv)
	}
}

// With float32 storage (a test-only store), the transforms alone must be
// invisible: rotation, token norm and their inverses. Tokens quantized
// straight from a Write come back within 1e-5; tokens that waited in an
// fp16 window come back as their binary16 values (through the
// transforms).
func TestTransformsWithoutQuantization(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	rot := randRotations(rng, testLayers, 0, 0)
	specs := []spec{
		{name: "oscar-f32", k: sideSpec{store: storeF32, rot: rotMatrix}, v: sideSpec{store: storeF32, rot: rotMatrix}, block: 1, needRot: true},
		{name: "oscars-f32", k: sideSpec{store: storeF32, rot: rotHadamard, tokenNorm: true}, v: sideSpec{store: storeF32, rot: rotHadamard}, block: kiviBlock},
	}
	for _, sp := range specs {
		for _, opt := range []Options{{Rotations: rot}, {Sink: 5, Recent: 7, Rotations: rot}} {
			const n = 96
			k, v := tokens(rng, testLayers, n, outlierStd), tokens(rng, testLayers, n, nil)
			c, err := newCache(sp, testLayers, n, opt)
			if err != nil {
				t.Fatal(err)
			}
			prefill := 1 // decode only: no block waits in the window
			if sp.block > 1 {
				prefill = n // one Write: every block goes straight to the store
			}
			windowed := opt.Sink > 0 || opt.Recent > 0
			writeSteps(c, testLayers, k, v, 0, n, prefill)
			var worst float64
			for i, l := range testLayers {
				gk, gv := readAll(c, l, i, n)
				for j := range gk {
					for _, pr := range [][2]float32{{gk[j], k[i][j]}, {gv[j], v[i][j]}} {
						e := math.Abs(float64(pr[0]-pr[1])) / (1 + math.Abs(float64(pr[1])))
						worst = max(worst, e)
						if tol := 1e-5; e > tol && !(windowed && e < 1e-3) {
							t.Fatalf("%s sink %d layer %d element %d: got %v, want %v", sp.name, opt.Sink, i, j, pr[0], pr[1])
						}
					}
				}
			}
			t.Logf("%s sink %d recent %d: max relative error %.2g", sp.name, opt.Sink, opt.Recent, worst)
			if !windowed && worst == 0 {
				t.Errorf("%s: zero error: the transforms did not run", sp.name)
			}
		}
	}
}

func TestBytesAndBitsPerElement(t *testing.T) {
	const n = 512
	for _, layers := range [][]Layer{{{NumKVHeads: 8, HeadDim: 128}}, {{NumKVHeads: 2, HeadDim: 64}, {NumKVHeads: 4, HeadDim: 64}}} {
		rng := rand.New(rand.NewPCG(1, 2))
		k, v := tokens(rng, layers, n, nil), tokens(rng, layers, n, nil)
		var sum int // Σ kvDim
		for _, l := range layers {
			sum += l.NumKVHeads * l.HeadDim
		}
		bytesOf := func(name string, opt Options) (int64, float64) {
			c := mustNew(t, name, layers, n, opt)
			writeSteps(c, layers, k, v, 0, n, 100)
			return c.Bytes(), c.(Sizer).BitsPerElement()
		}
		f16, f16bits := bytesOf("fp16", Options{})
		f32, f32bits := bytesOf("fp32", Options{})
		if f16 != int64(n*sum*4) || f32 != 2*f16 || f16bits != 16 || f32bits != 32 {
			t.Fatalf("fp16 %d B (%v bits), fp32 %d B (%v bits); want %d, %d", f16, f16bits, f32, f32bits, n*sum*4, n*sum*8)
		}
		// Independent formulas per method (head_dim 64 or 128, all
		// multiples of 32).
		want := map[string]int64{}
		var oscar2, oscarG, oscar4, naive, kivi, oscars, mixed int64
		for i, l := range layers {
			h, d := int64(l.NumKVHeads), int64(l.HeadDim)
			// oscar-mixed: codes of each side's own width, fp16 scale and
			// zero per (token, head).
			bk, bv := testBits(i)
			mixed += n*h*(d*int64(bk)/8+4) + n*h*(d*int64(bv)/8+4)
			oscar2 += 2 * n * h * (d/4 + 4)
			// oscar2-g32: 2-bit codes, fp16 scale and zero per 32 channels.
			oscarG += 2 * n * h * (d/4 + 4*d/32)
			oscar4 += 2 * n * h * (d/2 + 4)
			naive += 2 * n * h * (d/4 + 2)
			// 512 tokens, residual 128, blocks of 32: 384 quantized.
			q, res := int64(384), int64(128)
			kiviK := q*h*d/4 + q/32*h*d*4
			kiviV := q * h * (d/4 + 4*d/32)
			kivi += kiviK + kiviV + res*h*d*4
			oscarsV := q * h * (d/4 + 4)
			oscars += kiviK + oscarsV + res*h*d*4 + 4*q
		}
		want["oscar2"], want["oscar4"], want["int2-naive"], want["kivi2"], want["oscars2"], want["quarot2"] = oscar2, oscar4, naive, kivi, oscars, oscar2
		want["oscar-mixed"], want["oscar2-g32"] = mixed, oscarG
		for _, name := range []string{"oscar2", "oscar2-g32", "oscar4", "int2-naive", "kivi2", "oscars2", "quarot2", "oscar-mixed"} {
			opt := Options{}
			if NeedsRotations(name) {
				opt.Rotations = hadamardRotations(layers, 0.96, 0.92)
			}
			got, bits := bytesOf(name, opt)
			if got != want[name] {
				t.Errorf("%v %s: Bytes %d, want %d", layers, name, got, want[name])
			}
			if wb := float64(want[name]) * 8 / float64(2*n*sum); math.Abs(bits-wb) > 1e-12 {
				t.Errorf("%s: BitsPerElement %v, want %v", name, bits, wb)
			}
			t.Logf("%v %-10s %8d B  %.3f bits/element  fp16/%s = %.2f", layers, name, got, bits, name, float64(f16)/float64(got))
		}
		o2, _ := bytesOf("oscar2", Options{Rotations: hadamardRotations(layers, 0, 0)})
		if 6*o2 > f16 {
			t.Errorf("oscar2 at %d tokens holds %d B, more than fp16's %d B / 6", n, o2, f16)
		}
		if layers[0].HeadDim == 128 {
			_, b := bytesOf("oscar2", Options{Rotations: hadamardRotations(layers, 0, 0)})
			if b != 2.25 {
				t.Errorf("oscar2 head_dim 128: %v bits/element, want 2.25", b)
			}
		}
	}
}

// Sink and recent tokens come back as their binary16 values; the tokens
// between them are quantized (and differ).
func TestWindows(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	const n = 90
	k, v := tokens(rng, testLayers, n, nil), tokens(rng, testLayers, n, nil)
	cases := []struct {
		name       string
		opt        Options
		sink, tail int // exact tokens at the start and the end
	}{
		{"oscar2", Options{Sink: 4, Recent: 8, Rotations: randRotations(rng, testLayers, 0.96, 0.92)}, 4, 8},
		{"int4", Options{Sink: 2, Recent: 30}, 2, 30},
		// 90 written, 6 sink, residual 40 in blocks of 32: 84 → 52 → 20
		// pending, so the last 20 are fp16.
		{"kivi2", Options{Sink: 6, Recent: 40}, 6, 20},
		{"oscars2", Options{Recent: 40}, 0, 26}, // 90 → 58 → 26
	}
	for _, c := range cases {
		cc := mustNew(t, c.name, testLayers, n, c.opt)
		writeSteps(cc, testLayers, k, v, 0, n, 50)
		for i, l := range testLayers {
			d := l.NumKVHeads * l.HeadDim
			gk, gv := readAll(cc, l, i, n)
			for p := 0; p < n; p++ {
				exact := p < c.sink || p >= n-c.tail
				same := true
				for j := p * d; j < (p+1)*d; j++ {
					if gk[j] != kvq.RoundF16(k[i][j]) || gv[j] != kvq.RoundF16(v[i][j]) {
						same = false
					}
				}
				if exact != same {
					t.Fatalf("%s layer %d token %d: binary16-exact %v, want %v", c.name, i, p, same, exact)
				}
			}
		}
	}
}

// Reusing a cache after Truncate(0) gives bit-identical reads to a fresh
// cache; truncating in the middle keeps the earlier tokens as they read
// before and later writes continue correctly.
func TestTruncate(t *testing.T) {
	rng := rand.New(rand.NewPCG(31, 32))
	rot := randRotations(rng, testLayers, 0.96, 0.92)
	const n1, n2 = 200, 150
	k1, v1 := tokens(rng, testLayers, n1, nil), tokens(rng, testLayers, n1, nil)
	k2, v2 := tokens(rng, testLayers, n2, nil), tokens(rng, testLayers, n2, nil)
	for _, name := range Methods() {
		layers, k1, v1, k2, v2 := testLayers, k1, v1, k2, v2
		if lt := layersFor(name); &lt[0] != &testLayers[0] {
			layers = lt
			k1, v1 = tokens(rng, layers, n1, nil), tokens(rng, layers, n1, nil)
			k2, v2 = tokens(rng, layers, n2, nil), tokens(rng, layers, n2, nil)
		}
		opt := Options{Sink: 3, Recent: 20, Rotations: rot}
		fresh := mustNew(t, name, layers, n1, opt)
		writeSteps(fresh, layers, k2, v2, 0, n2, 60)
		c := mustNew(t, name, layers, n1, opt)
		writeSteps(c, layers, k1, v1, 0, n1, 33)
		c.Truncate(0)
		if c.Len() != 0 || c.Bytes() != 0 {
			t.Fatalf("%s: after Truncate(0) Len %d Bytes %d", name, c.Len(), c.Bytes())
		}
		writeSteps(c, layers, k2, v2, 0, n2, 60)
		if c.Bytes() != fresh.Bytes() {
			t.Errorf("%s: reused Bytes %d, fresh %d", name, c.Bytes(), fresh.Bytes())
		}
		for i, l := range layers {
			ak, av := readAll(c, l, i, n2)
			bk, bv := readAll(fresh, l, i, n2)
			if !slices.Equal(ak, bk) || !slices.Equal(av, bv) {
				t.Fatalf("%s layer %d: reuse after Truncate(0) differs from a fresh cache", name, i)
			}
		}

		// Truncate in the middle (for kivi2/oscars2 inside a quantized
		// block: 200 tokens, residual 20 → 3 sink + 192 quantized).
		const mid = 90
		c.Truncate(0)
		writeSteps(c, layers, k1, v1, 0, n1, 33)
		before := make([][2][]float32, len(layers))
		for i, l := range layers {
			bk, bv := readAll(c, l, i, mid)
			before[i] = [2][]float32{bk, bv}
		}
		bytesBefore := c.Bytes()
		c.Truncate(mid)
		if c.Len() != mid || c.Bytes() >= bytesBefore {
			t.Fatalf("%s: Truncate(%d): Len %d, Bytes %d (before %d)", name, mid, c.Len(), c.Bytes(), bytesBefore)
		}
		for i, l := range layers {
			ak, av := readAll(c, l, i, mid)
			for j := range ak {
				// Bit-identical, except a partial key block that went
				// back to binary16.
				for _, pr := range [][2]float32{{ak[j], before[i][0][j]}, {av[j], before[i][1][j]}} {
					if pr[0] != pr[1] && math.Abs(float64(pr[0]-pr[1])) > 1e-3*(1+math.Abs(float64(pr[1]))) {
						t.Fatalf("%s layer %d: after Truncate element %d = %v, was %v", name, i, j, pr[0], pr[1])
					}
				}
			}
		}
		// Continue with new tokens at [mid, mid+100) from k2 (positions
		// shifted): they must read back within a loose bound.
		kk, vv := make([][]float32, len(layers)), make([][]float32, len(layers))
		for i, l := range layers {
			d := l.NumKVHeads * l.HeadDim
			kk[i] = append(slices.Clone(k1[i][:mid*d]), k2[i][:100*d]...)
			vv[i] = append(slices.Clone(v1[i][:mid*d]), v2[i][:100*d]...)
		}
		writeSteps(c, layers, kk, vv, mid, 100, 10)
		for i, l := range layers {
			d := l.NumKVHeads * l.HeadDim
			gk, gv := readAll(c, l, i, mid+100)
			if e := relErr(gk[mid*d:], kk[i][mid*d:]); !(e < 0.7) {
				t.Errorf("%s layer %d: new tokens after Truncate: K error %.3f", name, i, e)
			}
			if e := relErr(gv[mid*d:], vv[i][mid*d:]); !(e < 0.7) {
				t.Errorf("%s layer %d: new tokens after Truncate: V error %.3f", name, i, e)
			}
		}
	}
}

// A cancelled Forward writes some layers and then truncates to the
// committed length: the cache must come back to its earlier state.
func TestPartialWriteThenTruncate(t *testing.T) {
	rng := rand.New(rand.NewPCG(41, 42))
	const n = 120
	k, v := tokens(rng, testLayers, n, nil), tokens(rng, testLayers, n, nil)
	for _, name := range []string{"oscar2", "kivi2", "oscars2", "int4"} {
		opt := Options{Sink: 2, Recent: 16, Rotations: randRotations(rng, testLayers, 0.96, 0.92)}
		ref := mustNew(t, name, testLayers, n, opt)
		writeSteps(ref, testLayers, k, v, 0, n, 70)
		c := mustNew(t, name, testLayers, n, opt)
		writeSteps(c, testLayers, k, v, 0, 70, 70)
		// Layer 0 gets 40 garbage tokens, then the Forward is cancelled.
		d0 := testLayers[0].NumKVHeads * testLayers[0].HeadDim
		junk := make([]float32, 40*d0)
		for i := range junk {
			junk[i] = 100
		}
		c.Write(0, 70, 40, junk, junk)
		c.Truncate(70)
		writeSteps(c, testLayers, k, v, 70, n-70, 0)
		for i, l := range testLayers {
			ak, av := readAll(c, l, i, n)
			bk, bv := readAll(ref, l, i, n)
			if relErr(ak, bk) > 1e-3 || relErr(av, bv) > 1e-3 {
				t.Errorf("%s layer %d: after a cancelled write the cache differs (K %.3g, V %.3g)", name, i, relErr(ak, bk), relErr(av, bv))
			}
		}
	}
}

func TestNewErrors(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	good := randRotations(rng, testLayers, 0.96, 0.92)
	bad := func(mod func(r *Rotations)) *Rotations {
		r := &Rotations{K: slices.Clone(good.K), V: slices.Clone(good.V), ClipK: slices.Clone(good.ClipK), ClipV: slices.Clone(good.ClipV),
			BitsK: slices.Clone(good.BitsK), BitsV: slices.Clone(good.BitsV)}
		mod(r)
		return r
	}
	notOrth := slices.Clone(good.K[1])
	notOrth[0] += 0.1
	cases := []struct {
		name   string
		method string
		layers []Layer
		cap    int
		opt    Options
		want   error
	}{
		{"unknown", "int3", testLayers, 8, Options{}, ErrUnknownMethod},
		{"no rotations", "oscar2", testLayers, 8, Options{}, ErrNoRotations},
		{"capacity", "int8", testLayers, 0, Options{}, ErrBadShape},
		{"no layers", "int8", nil, 8, Options{}, ErrBadShape},
		{"zero heads", "int8", []Layer{{NumKVHeads: 0, HeadDim: 8}}, 8, Options{}, ErrBadShape},
		{"negative sink", "int8", testLayers, 8, Options{Sink: -1}, ErrBadShape},
		{"hadamard head_dim", "quarot2", []Layer{{NumKVHeads: 2, HeadDim: 12}}, 8, Options{}, ErrBadShape},
		{"oscars head_dim", "oscars2", []Layer{{NumKVHeads: 2, HeadDim: 24}}, 8, Options{}, ErrBadShape},
		{"rotation count", "oscar2", testLayers, 8, Options{Rotations: bad(func(r *Rotations) { r.K = r.K[:2] })}, ErrBadShape},
		{"rotation size", "oscar4", testLayers, 8, Options{Rotations: bad(func(r *Rotations) { r.V[2] = r.V[2][:10] })}, ErrBadShape},
		{"not orthogonal", "oscar2", testLayers, 8, Options{Rotations: bad(func(r *Rotations) { r.K[1] = notOrth })}, ErrBadShape},
		{"clip ratio", "oscar2", testLayers, 8, Options{Rotations: bad(func(r *Rotations) { r.ClipV[0] = 0 })}, ErrBadShape},
		{"clip count", "oscar2", testLayers, 8, Options{Rotations: bad(func(r *Rotations) { r.ClipK = r.ClipK[:1] })}, ErrBadShape},
		{"4-bit clip ratio", "oscar4", testLayers, 8, Options{Rotations: bad(func(r *Rotations) { r.ClipK4 = []float64{1, 1.5, 1} })}, ErrBadShape},
		{"8-bit clip count", "oscar-mixed", testLayers, 8, Options{Rotations: bad(func(r *Rotations) { r.ClipV8 = []float64{1} })}, ErrBadShape},
		{"mixed width", "oscar-mixed", testLayers, 8, Options{Rotations: bad(func(r *Rotations) { r.BitsV[1] = 3 })}, ErrBadShape},
		{"mixed width count", "oscar-mixed", testLayers, 8, Options{Rotations: bad(func(r *Rotations) { r.BitsK = r.BitsK[:2] })}, ErrBadShape},
		{"mixed without widths", "oscar-mixed", testLayers, 8, Options{Rotations: bad(func(r *Rotations) { r.BitsK, r.BitsV = nil, nil })}, ErrBadShape},
	}
	for _, c := range cases {
		_, err := New(c.method, c.layers, c.cap, c.opt)
		if !errors.Is(err, c.want) {
			t.Errorf("%s: err = %v, want %v", c.name, err, c.want)
		} else {
			t.Logf("%s: %v", c.name, err)
		}
	}
	// A plain rotation file (no widths) for oscar-mixed says how to make one.
	if _, err := New("oscar-mixed", testLayers, 8, Options{Rotations: bad(func(r *Rotations) { r.BitsK, r.BitsV = nil, nil })}); err == nil ||
		!strings.Contains(err.Error(), "lmpack quantize kv --kv-bits B") {
		t.Errorf("oscar-mixed without widths: %v, want the way to make a file with widths", err)
	}
	if _, err := New("oscar2", testLayers, 8, Options{Rotations: good}); err != nil {
		t.Fatal(err)
	}
	// Rotations without clipping ratios are fine.
	if _, err := New("oscar2", testLayers, 8, Options{Rotations: &Rotations{K: good.K, V: good.V}}); err != nil {
		t.Fatal(err)
	}
}

func TestWritePanicsOnCallerBugs(t *testing.T) {
	c := mustNew(t, "int4", testLayers, 4, Options{})
	d := testLayers[0].NumKVHeads * testLayers[0].HeadDim
	x := make([]float32, 5*d)
	for name, f := range map[string]func(){
		"past capacity": func() { c.Write(0, 0, 5, x, x) },
		"gap":           func() { c.Write(0, 2, 1, x, x) },
		"short k":       func() { c.Write(0, 0, 2, x[:d], x) },
		"read past len": func() { c.Read(0, 0, 1, x, x) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", name)
				}
			}()
			f()
		}()
	}
}

func TestMethodsAndInterfaces(t *testing.T) {
	want := []string{"fp16", "fp32", "fp8", "int2-naive", "int4", "int4_per_token_head", "int8", "kivi2", "oscar-mixed", "oscar2", "oscar2-g32", "oscar4", "oscars2",
		"q4_0", "q8_0", "quarot2", "turboquant_3bit_nc", "turboquant_3bit_nc-all", "turboquant_4bit_nc", "turboquant_4bit_nc-all",
		"turboquant_k3v4_nc", "turboquant_k3v4_nc-all", "turboquant_k8v4", "turboquant_k8v4-all"}
	if got := Methods(); !slices.Equal(got, want) {
		t.Fatalf("Methods() = %v, want %v", got, want)
	}
	for _, name := range want {
		layers := layersFor(name)
		c := mustNew(t, name, layers, 8, Options{Rotations: hadamardRotations(layers, 0, 0)})
		_, f32 := c.(runtime.F32KV)
		if f32 != (name == "fp32") {
			t.Errorf("%s: F32KV = %v", name, f32)
		}
		if _, ok := c.(Sizer); !ok {
			t.Errorf("%s: no Sizer", name)
		}
		if c.Cap() != 8 || c.Len() != 0 || c.Bytes() != 0 || c.(Sizer).BitsPerElement() != 0 {
			t.Errorf("%s: empty cache Cap %d Len %d Bytes %d", name, c.Cap(), c.Len(), c.Bytes())
		}
	}
}

// A cancelled Forward of up to 32 tokens leaves no trace: after
// Truncate(committed) every layer reads bit-identically to a cache that
// never saw it, fp16 windows included.
func TestCancelledForwardIsExact(t *testing.T) {
	rng := rand.New(rand.NewPCG(51, 52))
	const n = 70
	k, v := tokens(rng, testLayers, n, nil), tokens(rng, testLayers, n, nil)
	rot := randRotations(rng, testLayers, 0.96, 0.92)
	for _, name := range Methods() {
		layers, k, v := testLayers, k, v
		if lt := layersFor(name); &lt[0] != &testLayers[0] {
			layers = lt
			k, v = tokens(rng, layers, n, nil), tokens(rng, layers, n, nil)
		}
		for _, junkN := range []int{1, 7, 32} {
			opt := Options{Sink: 2, Recent: 16, Rotations: rot}
			ref := mustNew(t, name, layers, n+junkN, opt)
			writeSteps(ref, layers, k, v, 0, n, 50)
			c := mustNew(t, name, layers, n+junkN, opt)
			writeSteps(c, layers, k, v, 0, n, 50)
			for i := 0; i < 2; i++ { // two of three layers written
				d := layers[i].NumKVHeads * layers[i].HeadDim
				junk := make([]float32, junkN*d)
				for j := range junk {
					junk[j] = float32(50 + j%7)
				}
				c.Write(i, n, junkN, junk, junk)
			}
			c.Truncate(n)
			if c.Len() != n || c.Bytes() != ref.Bytes() {
				t.Fatalf("%s junk %d: Len %d Bytes %d, want %d %d", name, junkN, c.Len(), c.Bytes(), n, ref.Bytes())
			}
			for i, l := range layers {
				ak, av := readAll(c, l, i, n)
				bk, bv := readAll(ref, l, i, n)
				if !slices.Equal(ak, bk) || !slices.Equal(av, bv) {
					t.Fatalf("%s junk %d layer %d: cache differs after the cancelled write", name, junkN, i)
				}
			}
		}
	}
}

// QuantizedEnd (runtime.QuantizedKV) predicts the quantized watermark
// that later writes give, without changing the cache: asked before any
// write for every n, it equals the watermark after writing n tokens one
// at a time and after writing them in chunks of 7; for per-token methods
// it is max(Sink, n−Recent), for block methods a multiple of 32 tokens
// past the sink.
func TestQuantizedEnd(t *testing.T) {
	rng := rand.New(rand.NewPCG(41, 42))
	const n = 100
	k, v := tokens(rng, testLayers, n, nil), tokens(rng, testLayers, n, nil)
	cases := []struct {
		name         string
		opt          Options
		perToken     bool
		sink, recent int
	}{
		{"int4", Options{Sink: 3, Recent: 10}, true, 3, 10},
		{"oscar2", Options{Sink: 2, Recent: 5, Rotations: randRotations(rng, testLayers, 0.96, 0.92)}, true, 2, 5},
		{"int2-naive", Options{}, true, 0, 0},
		{"kivi2", Options{Sink: 4, Recent: 20}, false, 4, 20},
		{"oscars2", Options{}, false, 0, 128},
	}
	for _, c := range cases {
		for _, chunk := range []int{1, 7} {
			cc := mustNew(t, c.name, testLayers, n, c.opt)
			qk := cc.(runtime.QuantizedKV)
			pred := make([]int, n+1)
			for m := 0; m <= n; m++ {
				pred[m] = qk.QuantizedEnd(1, m)
			}
			if cc.Len() != 0 || qk.QuantizedEnd(1, 0) != pred[0] {
				t.Fatalf("%s: QuantizedEnd changed the cache", c.name)
			}
			for a := 0; a < n; a += chunk {
				b := min(n, a+chunk)
				for i := range testLayers {
					d := testLayers[i].NumKVHeads * testLayers[i].HeadDim
					cc.Write(i, a, b-a, k[i][a*d:b*d], v[i][a*d:b*d])
				}
				cc.Commit(b - a)
				got := cc.(*cache).layers[1].q
				if got != pred[b] {
					t.Fatalf("%s chunk %d: watermark %d after %d tokens, QuantizedEnd predicted %d", c.name, chunk, got, b, pred[b])
				}
				if got != qk.QuantizedEnd(1, b) {
					t.Fatalf("%s: QuantizedEnd(len) %d, watermark %d", c.name, qk.QuantizedEnd(1, b), got)
				}
				want := max(c.sink, b-c.recent)
				if c.perToken && got != want {
					t.Fatalf("%s: watermark %d after %d tokens, want max(sink %d, n−recent %d) = %d", c.name, got, b, c.sink, c.recent, want)
				}
				if !c.perToken && (got-c.sink)%32 != 0 {
					t.Fatalf("%s: watermark %d is not a 32-token block past sink %d", c.name, got, c.sink)
				}
			}
		}
	}
}

// oscar2-g32's format: in the rotated space y = x·R each (token, head)
// row is clipped as one row at τ = sorted(|y|)[⌊ratio·head_dim⌋], then
// each group of 32 channels (head_dim below 32: the row) has its own
// asymmetric INT2 scale s_g = (max_g − min_g)/3 and zero, so every
// element of ŷ = x̂·R is within s_g/2 of clip(y), plus the binary16
// rounding of the scale (up, ≤ 2^-8 relative) and of the zero (≤ |lo|/2048
// in value), plus float32 rounding of the two rotations. With one scale
// per row (oscar2's) the row's range would replace the group's and the
// bound would fail on Gaussian rows.
func TestOscarG32ElementBounds(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 32))
	rot := randRotations(rng, testLayers, 0.96, 0.92)
	n := 60
	k, v := tokens(rng, testLayers, n, func(c int) float64 { return 1 + float64(c%7) }), tokens(rng, testLayers, n, nil)
	c := mustNew(t, "oscar2-g32", testLayers, n, Options{Rotations: rot})
	writeSteps(c, testLayers, k, v, 0, n, 13)
	var checked, grouped int
	for i, l := range testLayers {
		hd := l.HeadDim
		g := hd
		if hd%32 == 0 {
			g = 32
		}
		gk, gv := readAll(c, l, i, n)
		for side, s := range []struct {
			x, got, r []float32
			ratio     float64
		}{{k[i], gk, rot.K[i], rot.ClipK[i]}, {v[i], gv, rot.V[i], rot.ClipV[i]}} {
			rotate := func(x []float32) []float64 {
				y := make([]float64, hd)
				for j := 0; j < hd; j++ {
					for a := 0; a < hd; a++ {
						y[j] += float64(x[a]) * float64(s.r[a*hd+j])
					}
				}
				return y
			}
			for row := 0; row < n*l.NumKVHeads; row++ {
				y, yh := rotate(s.x[row*hd:(row+1)*hd]), rotate(s.got[row*hd:(row+1)*hd])
				y32 := make([]float32, hd)
				for j := range y {
					y32[j] = float32(y[j])
				}
				kvq.Clip(y32, s.ratio)
				big := float64(kvq.AbsMax(y32))
				for g0 := 0; g0 < hd; g0 += g {
					lo, hi := kvq.MinMax(y32[g0 : g0+g])
					sc := float64(hi-lo) / 3
					bound := sc/2*(1+1.0/256) + math.Abs(float64(lo))/2048 + 1e-5*big + 1e-6
					for j := g0; j < g0+g; j++ {
						if e := math.Abs(yh[j] - float64(y32[j])); e > bound {
							t.Fatalf("layer %d side %d row %d channel %d: |clip(y) − ŷ| = %g > %g (group of %d)", i, side, row, j, e, bound, g)
						}
						checked++
					}
				}
				if g < hd {
					grouped++
				}
			}
		}
	}
	if grouped == 0 || checked == 0 {
		t.Fatalf("checked %d elements, %d rows with several groups", checked, grouped)
	}
}
