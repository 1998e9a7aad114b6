package kvcache

import (
	"errors"
	"math"
	"testing"
)

// TestBitsAtMatchesBytes: BitsAt equals the BitsPerElement of a real cache
// that holds ctx tokens, for every method, window setting and a few small
// contexts (GQA layers of two shapes, decode after a prefill).
func TestBitsAtMatchesBytes(t *testing.T) {
	layers := []Layer{{NumKVHeads: 2, HeadDim: 32}, {NumKVHeads: 1, HeadDim: 64}}
	rot := randRotations(newRand(3), layers, 0.96, 0.92)
	opts := []Options{{}, {Sink: 4, Recent: 16}, {ExactWindows: true}, {Sink: 8, ExactWindows: true}, {Recent: 40, ExactWindows: true}}
	for _, name := range Methods() {
		for _, o := range opts {
			o.Rotations = rot
			for _, ctx := range []int{1, 31, 64, 97, 200} {
				c := mustNew(t, name, layers, ctx, o)
				k, v := tokens(newRand(uint64(ctx)), layers, ctx, nil), tokens(newRand(uint64(ctx)+7), layers, ctx, nil)
				writeSteps(c, layers, k, v, 0, ctx, ctx/2)
				want := c.(Sizer).BitsPerElement()
				got, err := BitsAt(name, layers, o, ctx)
				if err != nil {
					t.Fatal(err)
				}
				if math.Abs(got-want) > 1e-12 {
					t.Errorf("%s %+v ctx %d: BitsAt %.6f, cache %.6f", name, Options{Sink: o.Sink, Recent: o.Recent, ExactWindows: o.ExactWindows}, ctx, got, want)
				}
			}
		}
	}
}

// TestExactWindows: kivi2 and oscars2 keep their 128-token residual for
// Recent 0 unless ExactWindows, which quantizes every token then.
func TestExactWindows(t *testing.T) {
	for _, name := range []string{"kivi2", "oscars2"} {
		def, _ := QuantizedAt(name, Options{}, 128)
		exact, _ := QuantizedAt(name, Options{ExactWindows: true}, 128)
		if def != 0 || exact != 128 {
			t.Errorf("%s at ctx 128: quantized %d (default), %d (exact 0,0), want 0 and 128", name, def, exact)
		}
	}
	if q, _ := QuantizedAt("int4", Options{Sink: 16, Recent: 64}, 80); q != 0 {
		t.Errorf("int4 with windows 16+64 at ctx 80: %d quantized, want 0", q)
	}
	if q, _ := QuantizedAt("int4", Options{Sink: 16, Recent: 64}, 256); q != 176 {
		t.Errorf("int4 with windows 16+64 at ctx 256: %d quantized, want 176", q)
	}
	// At a 32K serving context the 16+64 windows of int2-naive cost
	// (80·16 + 32688·(2 + 16/head_dim))/32768 bits against 2.25 at head_dim 64.
	layers := []Layer{{NumKVHeads: 2, HeadDim: 64}}
	got, _ := BitsAt("int2-naive", layers, Options{Sink: 16, Recent: 64}, 32768)
	want := (80*16 + 32688*2.25) / 32768
	if math.Abs(got-want) > 1e-12 {
		t.Errorf("int2-naive 16+64 at 32768: %.6f bits, want %.6f", got, want)
	}
}

// TestBitsAtWithoutRotations: the oscar kinds' storage does not depend on
// the rotations, so BitsAt needs none (it used to dereference nil), except
// oscar-mixed, whose widths they carry.
func TestBitsAtWithoutRotations(t *testing.T) {
	layers := []Layer{{NumKVHeads: 2, HeadDim: 64}}
	for _, c := range []struct {
		name string
		want float64
	}{{"oscar2", 2 + 32.0/64}, {"oscar4", 4 + 32.0/64}, {"oscar2-g32", 2 + 32.0/32}} {
		got, err := BitsAt(c.name, layers, Options{}, 256)
		if err != nil || got != c.want {
			t.Errorf("%s without rotations: BitsAt %v, %v; want %v", c.name, got, err, c.want)
		}
	}
	if _, err := BitsAt("oscar-mixed", layers, Options{}, 256); !errors.Is(err, ErrNoRotations) {
		t.Errorf("oscar-mixed without rotations: %v, want ErrNoRotations", err)
	}
}
