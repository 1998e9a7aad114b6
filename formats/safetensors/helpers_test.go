package safetensors

import (
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// rawFile returns the bytes of a safetensors file with the given header text
// (used verbatim, no padding) and data section.
func rawFile(header string, data []byte) []byte {
	b := make([]byte, 8, 8+len(header)+len(data))
	binary.LittleEndian.PutUint64(b, uint64(len(header)))
	b = append(b, header...)
	return append(b, data...)
}

// writeRaw writes rawFile(header, data) to dir/name and returns the path.
func writeRaw(t *testing.T, dir, name, header string, data []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, rawFile(header, data), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// wantErr fails unless err is non-nil and its message contains every part.
func wantErr(t *testing.T, err error, parts ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got nil error, want one containing %q", parts)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Errorf("error %q does not contain %q", err, p)
		}
	}
}

// Independent reference decoders: value = (implicit 1 + mantissa) × 2^exp
// evaluated with math.Ldexp from the bit fields, per IEEE 754 / OCP OFP8.

func refF16(h uint16) float64 {
	s, e, m := h>>15, int(h>>10)&0x1f, int(h&0x3ff)
	var v float64
	switch {
	case e == 0x1f && m == 0:
		v = math.Inf(1)
	case e == 0x1f:
		return math.NaN()
	case e == 0:
		v = math.Ldexp(float64(m), -24) // m/1024 × 2^-14
	default:
		v = math.Ldexp(float64(1024+m), e-15-10)
	}
	if s == 1 {
		v = -v
	}
	return v
}

func refBF16(h uint16) float64 {
	s, e, m := h>>15, int(h>>7)&0xff, int(h&0x7f)
	var v float64
	switch {
	case e == 0xff && m == 0:
		v = math.Inf(1)
	case e == 0xff:
		return math.NaN()
	case e == 0:
		v = math.Ldexp(float64(m), -126-7)
	default:
		v = math.Ldexp(float64(128+m), e-127-7)
	}
	if s == 1 {
		v = -v
	}
	return v
}

func refE4M3(b uint8) float64 {
	s, e, m := b>>7, int(b>>3)&0xf, int(b&7)
	var v float64
	switch {
	case e == 0xf && m == 7:
		return math.NaN()
	case e == 0:
		v = math.Ldexp(float64(m), -6-3)
	default:
		v = math.Ldexp(float64(8+m), e-7-3)
	}
	if s == 1 {
		v = -v
	}
	return v
}

func refE5M2(b uint8) float64 {
	s, e, m := b>>7, int(b>>2)&0x1f, int(b&3)
	var v float64
	switch {
	case e == 0x1f && m == 0:
		v = math.Inf(1)
	case e == 0x1f:
		return math.NaN()
	case e == 0:
		v = math.Ldexp(float64(m), -14-2)
	default:
		v = math.Ldexp(float64(4+m), e-15-2)
	}
	if s == 1 {
		v = -v
	}
	return v
}

// sameFloat reports whether got equals want exactly, treating all NaNs as
// equal and distinguishing +0 from -0.
func sameFloat(got float32, want float64) bool {
	if math.IsNaN(want) {
		return math.IsNaN(float64(got))
	}
	return float64(got) == want && math.Signbit(float64(got)) == math.Signbit(want)
}
