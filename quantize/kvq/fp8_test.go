package kvq

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/lmpack/lmpack/formats/safetensors"
)

// Every E4M3 byte decodes to the value formats/safetensors (the OCP
// specification's widening, checked there) gives, and re-encodes to
// itself (NaN and −0 aside).
func TestE4M3DecodeMatchesSafetensors(t *testing.T) {
	for b := 0; b < 256; b++ {
		got, want := F8E4M3ToFloat32(uint8(b)), safetensors.F8E4M3ToFloat32(uint8(b))
		if math.IsNaN(float64(want)) {
			if !math.IsNaN(float64(got)) {
				t.Fatalf("byte %#x: %v, want NaN", b, got)
			}
			continue
		}
		if got != want {
			t.Fatalf("byte %#x: %v, want %v", b, got, want)
		}
		if b != 0x80 && F8E4M3FromFloat32(got) != uint8(b) {
			t.Fatalf("byte %#x (%v) re-encodes to %#x", b, got, F8E4M3FromFloat32(got))
		}
	}
	if E4M3Max != F8E4M3ToFloat32(0x7e) {
		t.Fatalf("max %v", F8E4M3ToFloat32(0x7e))
	}
}

// Encoding picks the nearest finite E4M3 value (brute force over all 254
// finite codes), ties to the even code, and saturates at ±448.
func TestE4M3EncodeIsNearestSaturating(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 9))
	xs := []float32{0, 1e-9, 1.0 / 1024, 3.0 / 1024, 0.0166, 447, 448, 449, 465, 1e6, float32(math.Inf(1)), -5.5, -464, 1.0625, 1.1875}
	for i := 0; i < 20000; i++ {
		xs = append(xs, float32(rng.NormFloat64()*math.Exp2(float64(rng.IntN(24)-14))))
	}
	for _, x := range xs {
		b := F8E4M3FromFloat32(x)
		got := F8E4M3ToFloat32(b)
		if math.Abs(float64(x)) >= 448 {
			if math.Abs(float64(got)) != 448 || math.Signbit(float64(got)) != math.Signbit(float64(x)) {
				t.Fatalf("%v: %v, want saturation at ±448", x, got)
			}
			continue
		}
		best := math.Inf(1)
		for c := 0; c < 256; c++ {
			v := F8E4M3ToFloat32(uint8(c))
			if math.IsNaN(float64(v)) {
				continue
			}
			best = min(best, math.Abs(float64(v)-float64(x)))
		}
		e := math.Abs(float64(got) - float64(x))
		if e != best {
			t.Fatalf("%v: encoded %v (error %g), nearest error %g", x, got, e, best)
		}
		if 2*e == float64(F8E4M3ToFloat32(b|1)-F8E4M3ToFloat32(b&^1)) && b&1 != 0 {
			t.Fatalf("%v: tie resolved to odd code %#x", x, b)
		}
	}
	// Ties: 1.0625 lies halfway between 1 (code 0x38, even) and 1.125.
	if F8E4M3FromFloat32(1.0625) != 0x38 || F8E4M3FromFloat32(1.1875) != 0x3a {
		t.Fatalf("ties: %#x %#x", F8E4M3FromFloat32(1.0625), F8E4M3FromFloat32(1.1875))
	}
}
