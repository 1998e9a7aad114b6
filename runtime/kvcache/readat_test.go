package kvcache

import (
	"errors"
	"math"
	"testing"

	"github.com/lmpack/lmpack/quantize/kvq"
	"github.com/lmpack/lmpack/runtime"
)

// TestReadAtMatchesCache checks ReadAt against what a real cache holds:
// tokens are written as the decode protocol writes them (a prompt of P
// tokens in one call, then calls of C tokens), and for the query at each
// position p of a call that begins at c0 a cache that has been written up
// to p+1 (the earlier calls, then [c0, p+1) in one call: the state the
// runtime's queries read, runtime/cpu.go splitKV) is read back; a cached
// token j < c0 counts as quantized when its K or V row differs from both
// the written float32 and its binary16 rounding. The middle of five
// layers is observed, so the TurboQuant presets' first/last-two-layer
// rule leaves it quantized. Bits: when the call quantizes none of the
// cached tokens beyond what a cache of c0 tokens holds, ReadAt's bits
// equal that cache's BitsPerElement; when it quantizes more, they are
// lower. With a sliding window of w tokens on every layer (23 here) the
// query reads only the cached tokens j ≥ p − w + 1, and ReadAt counts
// those.
func TestReadAtMatchesCache(t *testing.T) {
	layers := make([]Layer, 5)
	for i := range layers {
		layers[i] = Layer{NumKVHeads: 1, HeadDim: 64}
	}
	const capacity, li = 70, 2
	rot := randRotations(newRand(5), layers, 0.96, 0.92)
	opts := []Options{{}, {ExactWindows: true}, {Sink: 4, Recent: 9, ExactWindows: true}}
	sched := []struct{ P, C int }{{0, 1}, {10, 7}, {33, 16}}
	k, v := tokens(newRand(11), layers, capacity, nil), tokens(newRand(12), layers, capacity, nil)
	d := layers[li].HeadDim
	write := func(c runtime.KVCache, from, to int) {
		for i, l := range layers {
			dd := l.NumKVHeads * l.HeadDim
			c.Write(i, from, to-from, k[i][from*dd:to*dd], v[i][from*dd:to*dd])
		}
		c.Commit(to - from)
	}
	// calls writes the protocol's calls that end at or before c0.
	calls := func(c runtime.KVCache, P, C, c0 int) {
		pos := 0
		if P > 0 && c0 >= P {
			write(c, 0, P)
			pos = P
		}
		for pos < c0 {
			n := min(C, c0-pos)
			write(c, pos, pos+n)
			pos += n
		}
	}
	kr, vr := make([]float32, capacity*d), make([]float32, capacity*d)
	h16 := make([]uint16, d)
	r16 := make([]float32, d)
	exact := func(got, want []float32) bool {
		kvq.EncodeF16(h16, want)
		kvq.DecodeF16(r16, h16)
		same, same16 := true, true
		for i := range got {
			same = same && got[i] == want[i]
			same16 = same16 && got[i] == r16[i]
		}
		return same || same16
	}
	for _, slide := range []int{0, 23} {
		for i := range layers {
			layers[i].SlidingWindow = slide
		}
		for _, name := range Methods() {
			for _, o := range opts {
				o.Rotations = rot
				for _, s := range sched {
					// With calls of one token the query's cache is the running
					// one, one token further each time.
					var run runtime.KVCache
					if s.C == 1 {
						run = mustNew(t, name, layers, capacity, o)
						calls(run, s.P, s.C, s.P)
					}
					for c0 := s.P; c0 < capacity; c0 += s.C {
						if c0 == 0 && s.P > 0 {
							continue
						}
						var refBits float64
						if run != nil && c0 > 0 {
							refBits = run.(Sizer).BitsPerElement()
						} else if c0 > 0 {
							ref := mustNew(t, name, layers, capacity, o)
							calls(ref, s.P, s.C, c0)
							refBits = ref.(Sizer).BitsPerElement()
						}
						for p := c0; p < min(c0+s.C, capacity); p++ {
							c := run
							if c == nil {
								c = mustNew(t, name, layers, capacity, o)
								calls(c, s.P, s.C, c0)
							}
							write(c, c0, p+1)
							c.Read(li, 0, c0, kr[:c0*d], vr[:c0*d])
							// A sliding window hides the keys before p − w + 1.
							lo := 0
							if slide > 0 {
								lo = max(0, p-slide+1)
							}
							seen := 0
							for j := lo; j < c0; j++ {
								kk := k[li][j*d : (j+1)*d]
								vv := v[li][j*d : (j+1)*d]
								if !exact(kr[j*d:(j+1)*d], kk) || !exact(vr[j*d:(j+1)*d], vv) {
									seen++
								}
							}
							rd, qf, bits, err := ReadAt(name, layers, o, capacity, c0, p)
							if err != nil {
								t.Fatal(err)
							}
							q := int(qf)
							if name == "fp16" || name == "fp32" {
								seen = c0 - lo // their one format: every visible cached token, none altered beyond binary16
							}
							if rd != float64(max(0, c0-lo)) || qf != float64(q) {
								t.Fatalf("%s window %d: query %d (call from %d) reads %g cached tokens (%g quantized), want %d", name, slide, p, c0, rd, qf, max(0, c0-lo))
							}
							if q != seen {
								t.Fatalf("%s %+v P %d C %d: query %d (call from %d) reads %d cached tokens quantized, ReadAt says %d",
									name, Options{Sink: o.Sink, Recent: o.Recent, ExactWindows: o.ExactWindows}, s.P, s.C, p, c0, seen, q)
							}
							if c0-lo <= 0 {
								if bits != 0 {
									t.Fatalf("%s: bits %v with nothing cached", name, bits)
								}
								continue
							}
							if slide > 0 {
								continue // the bits of a full cache below count every token
							}
							q0, _ := QuantizedAt(name, o, c0)
							switch {
							case q == q0 && math.Abs(bits-refBits) > 1e-9:
								t.Fatalf("%s %+v: query %d (call from %d): ReadAt bits %.6f, a cache of %d tokens %.6f", name, o.ExactWindows, p, c0, bits, c0, refBits)
							case q > q0 && !(bits < refBits):
								t.Fatalf("%s: query %d (call from %d) reads %d > %d quantized at %.6f bits, not below %.6f", name, p, c0, q, q0, bits, refBits)
							}
						}
					}
				}
			}
		}
	}
	if _, _, _, err := ReadAt("int4", layers, Options{}, 10, 5, 4); !errors.Is(err, ErrBadShape) {
		t.Errorf("position before its call's start: err %v, want ErrBadShape", err)
	}
	if _, _, _, err := ReadAt("int4", layers, Options{}, 10, 3, 10); !errors.Is(err, ErrBadShape) {
		t.Errorf("position at capacity: err %v, want ErrBadShape", err)
	}
}
