package gguf

import (
	"errors"
	"math"
	"testing"

	"github.com/lmpack/lmpack/formats/safetensors"
)

func TestParseTypeAndString(t *testing.T) {
	cases := map[string]Type{
		"f32": TypeF32, "F16": TypeF16, "bf16": TypeBF16, "BF16": TypeBF16,
		"q8_0": TypeQ8_0, "Q8_0": TypeQ8_0, "q4_0": TypeQ4_0, "Q4_1": TypeQ4_1,
		"q4_k": TypeQ4_K, "Q4_K": TypeQ4_K, "q6_K": TypeQ6_K,
	}
	for s, want := range cases {
		got, err := ParseType(s)
		if err != nil || got != want {
			t.Errorf("ParseType(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
	for _, bad := range []string{"", "q4", "q4_k_m", "f64", "auto"} {
		if _, err := ParseType(bad); !errors.Is(err, ErrType) {
			t.Errorf("ParseType(%q) error %v, want ErrType", bad, err)
		}
	}
	names := map[Type]string{TypeF32: "F32", TypeF16: "F16", TypeQ4_0: "Q4_0", TypeQ4_1: "Q4_1",
		TypeQ8_0: "Q8_0", TypeQ4_K: "Q4_K", TypeQ6_K: "Q6_K", TypeBF16: "BF16", Type(7): "Type(7)"}
	for ty, want := range names {
		if ty.String() != want {
			t.Errorf("%d.String() = %q, want %q", uint32(ty), ty.String(), want)
		}
	}
	// ggml.h enum ggml_type values.
	enum := map[Type]uint32{TypeF32: 0, TypeF16: 1, TypeQ4_0: 2, TypeQ4_1: 3, TypeQ8_0: 8, TypeQ4_K: 12, TypeQ6_K: 14, TypeBF16: 30}
	for ty, v := range enum {
		if uint32(ty) != v {
			t.Errorf("%v = %d, want %d", ty, uint32(ty), v)
		}
	}
}

func TestRowBytes(t *testing.T) {
	// sizeof(block_*) from ggml-common.h: 2+32, 2+16, 2+2+16,
	// 2+2+12+128, 128+64+16+2.
	cases := []struct {
		t         Type
		n, want   int
		blk, size int
	}{
		{TypeF32, 7, 28, 1, 4}, {TypeF16, 7, 14, 1, 2}, {TypeBF16, 3, 6, 1, 2},
		{TypeQ8_0, 64, 68, 32, 34}, {TypeQ4_0, 96, 54, 32, 18}, {TypeQ4_1, 32, 20, 32, 20},
		{TypeQ4_K, 512, 288, 256, 144}, {TypeQ6_K, 256, 210, 256, 210},
	}
	for _, c := range cases {
		got, err := c.t.RowBytes(c.n)
		if err != nil || got != c.want {
			t.Errorf("%v.RowBytes(%d) = %d, %v; want %d", c.t, c.n, got, err, c.want)
		}
		if c.t.BlockSize() != c.blk || c.t.BlockBytes() != c.size {
			t.Errorf("%v block %d×%d bytes, want %d×%d", c.t, c.t.BlockSize(), c.t.BlockBytes(), c.blk, c.size)
		}
	}
	bad := []struct {
		t Type
		n int
	}{{TypeQ8_0, 31}, {TypeQ8_0, 48}, {TypeQ4_0, 0}, {TypeQ4_1, -32}, {TypeQ4_K, 255}, {TypeQ4_K, 384}, {TypeQ6_K, 128}, {TypeF32, 0}}
	for _, c := range bad {
		if _, err := c.t.RowBytes(c.n); !errors.Is(err, ErrShape) {
			t.Errorf("%v.RowBytes(%d) error %v, want ErrShape", c.t, c.n, err)
		}
	}
	if _, err := Type(7).RowBytes(32); !errors.Is(err, ErrType) {
		t.Errorf("Type(7).RowBytes error %v, want ErrType", err)
	}
}

// TestHalfRounding checks safetensors.F16FromFloat32 (the fp16 rounding GGUF blocks use) against the definition over all
// finite fp16 values: each value maps to itself, the midpoint between two
// neighbours rounds to the one with the even mantissa, and a float32 just
// beside the midpoint rounds to the nearer neighbour.
func TestHalfRounding(t *testing.T) {
	for h := uint16(0); h < 0x7c00; h++ {
		for _, sign := range []uint16{0, 0x8000} {
			v := safetensors.F16ToFloat32(h | sign)
			if got := safetensors.F16FromFloat32(v); got != h|sign {
				t.Fatalf("fp16 %#04x = %g round-trips to %#04x", h|sign, v, got)
			}
		}
		if h == 0x7bff {
			break
		}
		lo, hi := float64(safetensors.F16ToFloat32(h)), float64(safetensors.F16ToFloat32(h+1))
		mid := float32((lo + hi) / 2) // exact: 12 significant bits
		even := h
		if h&1 == 1 {
			even = h + 1
		}
		if got := safetensors.F16FromFloat32(mid); got != even {
			t.Fatalf("midpoint %g of %#04x,%#04x rounds to %#04x, want %#04x", mid, h, h+1, got, even)
		}
		if got := safetensors.F16FromFloat32(math.Nextafter32(mid, 1e9)); got != h+1 {
			t.Fatalf("above midpoint %g rounds to %#04x, want %#04x", mid, got, h+1)
		}
		if got := safetensors.F16FromFloat32(math.Nextafter32(mid, -1)); got != h {
			t.Fatalf("below midpoint %g rounds to %#04x, want %#04x", mid, got, h)
		}
	}
	// Known values (IEEE 754 binary16).
	known := map[float32]uint16{1: 0x3c00, -2: 0xc000, 0.5: 0x3800, 65504: 0x7bff, 65520: 0x7c00,
		0x1p-24: 0x0001, 0x1p-25: 0x0000, 0x1.8p-25: 0x0001, 0x1p-14: 0x0400, 1e9: 0x7c00}
	for v, want := range known {
		if got := safetensors.F16FromFloat32(v); got != want {
			t.Errorf("safetensors.F16FromFloat32(%g) = %#04x, want %#04x", v, got, want)
		}
	}
	if h := safetensors.F16FromFloat32(float32(math.NaN())); h&0x7c00 != 0x7c00 || h&0x3ff == 0 {
		t.Errorf("NaN → %#04x, want a NaN", h)
	}
}

func TestBF16Rounding(t *testing.T) {
	cases := map[uint32]uint16{
		0x3f800000: 0x3f80, // 1
		0x3f808000: 0x3f80, // tie, even stays
		0x3f818000: 0x3f82, // tie, odd rounds up
		0x3f808001: 0x3f81, // above tie
		0x7f7fffff: 0x7f80, // max float32 rounds to +Inf
		0xc0490fdb: 0xc049, // −π
	}
	for in, want := range cases {
		if got := safetensors.BF16FromFloat32(math.Float32frombits(in)); got != want {
			t.Errorf("safetensors.BF16FromFloat32(%#08x) = %#04x, want %#04x", in, got, want)
		}
	}
	if h := safetensors.BF16FromFloat32(math.Float32frombits(0x7f800001)); h&0x7f80 != 0x7f80 || h&0x7f == 0 {
		t.Errorf("signalling NaN → %#04x, want a NaN", h)
	}
}
