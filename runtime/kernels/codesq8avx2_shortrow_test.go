package kernels

import (
	"fmt"
	"testing"
)

// TestBreakQ8ShortLastRow: checkCodes accepts len(codes) = (n−1)·rb + R
// (the last row need not carry its padding), but CodeDotsQ8, CodeDotsQ8F16
// and CodeDotsQ8F16x4 slice codes[j*rb:] after the assembly with j = n
// when n%4 == 0, which panics for a padded stride (rb > R).
func TestBreakQ8ShortLastRow(t *testing.T) {
	if !CodeQ8Fast(64, 2) {
		t.Skip("no Q8 assembly")
	}
	const bits, hd, pad, n = 2, 64, 1, 4
	R := hd * bits / 8
	rb := R + pad
	codes := make([]byte, (n-1)*rb+R) // what checkCodes asks for
	q := make([]float32, 4*hd)
	for i := range q {
		q[i] = float32(i%7) - 3
	}
	qb, qb4, coef := make([]byte, CodeQ8Len(hd)), make([]byte, 4*CodeQ8Len(hd)), make([]float32, 8)
	scale, sum := CodeQ8Query(qb, q[:hd], bits)
	CodeQ8Query4(qb4, q, bits, coef)
	sz, params := make([]float32, 2*n), make([]uint16, 2*n)
	out := make([]float32, 4*n)
	for _, c := range []struct {
		name string
		f    func()
	}{
		{"CodeDots (float, reference)", func() { CodeDots(out[:n], q[:hd], codes, bits, rb, n) }},
		{"CodeDotsQ8", func() { CodeDotsQ8(out[:n], qb, scale, sum, codes, bits, rb, n, sz) }},
		{"CodeDotsQ8F16", func() { CodeDotsQ8F16(out[:n], qb, scale, sum, codes, bits, rb, n, params) }},
		{"CodeDotsQ8F16x4", func() { CodeDotsQ8F16x4(out, n, qb4, coef, codes, bits, rb, n, params) }},
	} {
		func() {
			defer func() {
				if e := recover(); e != nil {
					t.Errorf("%s(hd %d, bits %d, rb %d, n %d, len(codes) %d): panic %v", c.name, hd, bits, rb, n, len(codes), fmt.Sprint(e))
				}
			}()
			c.f()
		}()
	}
}
