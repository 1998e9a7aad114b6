package kernels

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/lmpack/lmpack/formats/safetensors"
)

// guardedI8 is guardedBytes as an int8 slice (half_test.go has
// guardedU16).
func guardedI8(t *testing.T, n int) []int8 {
	b := guardedBytes(t, n)
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*int8)(unsafe.Pointer(&b[0])), n)
}

// The int8-activation kernels (DotQ8Matrix at 1, 2, 4 and 8 bits,
// DotQ8MatrixU3) read and write nothing past their operands: the codes,
// scales, zero-points, outputs, and the activations' Q, S, Sum and
// reordered Q each end just before an inaccessible page (guardedBytes; on
// Linux a stray access faults), on every assembly path (one row, row
// pairs, four activation rows), with group counts that leave the
// eight-group loop a tail, and the results equal those of ordinary
// slices bit for bit.
func TestDotQ8Guarded(t *testing.T) {
	if !haveGuard {
		t.Skip("guard pages are set up on Linux only")
	}
	rng := rand.New(rand.NewPCG(95, 96))
	type path struct {
		name        string
		asm, vnni   bool
		pairs, tile bool
	}
	paths := []path{{name: "go"}}
	if hasAsm && hasF16C {
		paths = append(paths, path{"avx2", true, false, false, true}, path{"avx2-pairs", true, false, true, false})
		if hasVNNI {
			paths = append(paths, path{"vnni", true, true, false, false}, path{"vnni-pairs-tile1", true, true, true, true})
		}
	}
	defer func(a, v, p bool, tb int) { useAsm, hasVNNI, usePairs, q8TileBytes = a, v, p, tb }(useAsm, hasVNNI, usePairs, q8TileBytes)
	const rows = 5
	for _, bits := range []int{1, 2, 3, 4, 8} {
		for _, c := range []struct{ k, group int }{{96, 32}, {352, 32}, {384, 128}, {160, 160}} {
			rb, ng := c.k*bits/8, c.k/c.group
			codes := make([]byte, rows*rb)
			for i := range codes {
				codes[i] = byte(rng.IntN(256))
			}
			if bits == 3 {
				s := make([]byte, len(codes))
				SplitU3(s, codes, rb, rows, c.k)
				codes = s
			}
			scales, zeros := make([]uint16, rows*ng), make([]uint16, rows*ng)
			for g := range scales {
				scales[g] = safetensors.F16FromFloat32(float32(rng.NormFloat64() * 0.05))
				zeros[g] = safetensors.F16FromFloat32(float32(rng.IntN(1 << uint(bits))))
			}
			gc, gs, gz := guardedBytes(t, len(codes)), guardedU16(t, len(scales)), guardedU16(t, len(zeros))
			copy(gc, codes)
			copy(gs, scales)
			copy(gz, zeros)
			for _, m := range []int{1, 5} {
				x := make([]float32, m*c.k)
				for i := range x {
					x[i] = float32(rng.NormFloat64())
				}
				nb := c.k / 32
				for _, p := range paths {
					useAsm, hasVNNI, usePairs = p.asm, p.vnni, p.pairs
					q8TileBytes = 64 << 10
					if p.tile {
						q8TileBytes = 1
					}
					label := fmt.Sprintf("%s bits %d k %d group %d m %d", p.name, bits, c.k, c.group, m)
					run := func(a *Q8Act, y []float32, codes []byte, scales, zeros []uint16) {
						QuantizeActQ8(a, x, c.k, m, c.k, 32)
						a.Prepare(bits)
						if bits == 3 {
							DotQ8MatrixU3(y, rows, a, codes, rows, scales, zeros, c.group, 4)
						} else {
							DotQ8Matrix(y, rows, a, codes, rb, rows, bits, scales, zeros, c.group, 2)
						}
					}
					var plain Q8Act
					want := make([]float32, m*rows)
					run(&plain, want, codes, scales, zeros)
					// The activations' slices at guard pages too: QuantizeActQ8 and
					// Prepare reuse slices of enough capacity.
					g := Q8Act{Q: guardedI8(t, m*c.k), S: guarded(t, m*nb), Sum: guarded(t, m*nb)}
					if pb := permOf(bits); pb != 8 {
						g.perm[pb] = guardedI8(t, m*c.k)
					}
					y := guarded(t, m*rows)
					run(&g, y, gc, gs, gz)
					if &g.Q[0] == &plain.Q[0] || cap(g.Q) != m*c.k {
						t.Fatalf("%s: the activations left the guarded slices", label)
					}
					for i := range want {
						if y[i] != want[i] {
							t.Errorf("%s output %d: %g at guard pages, %g in ordinary slices", label, i, y[i], want[i])
							break
						}
					}
				}
			}
		}
	}
}
