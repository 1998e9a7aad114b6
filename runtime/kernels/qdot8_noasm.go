//go:build !amd64 || purego

package kernels

var hasVNNI = false

func dotQ8x8AVX2(xq *int8, xs, xsum *float32, src *byte, scales, zeros *uint16, ng, bpg int, zsym, zoff float32, y *float32, rows int) {
	panic(unreachable)
}

func dotQ8x8VNNI(xq *int8, xs, xsum *float32, src *byte, scales, zeros *uint16, ng, bpg int, zsym, zoff float32, y *float32, rows int) {
	panic(unreachable)
}

func dotQ8x4AVX2(xq *int8, xs, xsum *float32, src *byte, scales, zeros *uint16, ng, bpg int, zsym, zoff float32, y *float32, rows int) {
	panic(unreachable)
}

func dotQ8x4VNNI(xq *int8, xs, xsum *float32, src *byte, scales, zeros *uint16, ng, bpg int, zsym, zoff float32, y *float32, rows int) {
	panic(unreachable)
}

func dotQ8x2AVX2(xq *int8, xs, xsum *float32, src *byte, scales, zeros *uint16, ng, bpg int, zsym, zoff float32, y *float32, rows int) {
	panic(unreachable)
}

func dotQ8x2VNNI(xq *int8, xs, xsum *float32, src *byte, scales, zeros *uint16, ng, bpg int, zsym, zoff float32, y *float32, rows int) {
	panic(unreachable)
}

func dotQ8x1AVX2(xq *int8, xs, xsum *float32, src *byte, scales, zeros *uint16, ng, bpg int, zsym, zoff float32, y *float32, rows int) {
	panic(unreachable)
}

func dotQ8x1VNNI(xq *int8, xs, xsum *float32, src *byte, scales, zeros *uint16, ng, bpg int, zsym, zoff float32, y *float32, rows int) {
	panic(unreachable)
}

func dotQ8x8m4AVX2(xq *int8, xs, xsum *float32, src *byte, scales, zeros *uint16, ng, bpg int, zsym, zoff float32, y *float32, rows int, xstride, sstride, ystride int) {
	panic(unreachable)
}

func dotQ8x8m4VNNI(xq *int8, xs, xsum *float32, src *byte, scales, zeros *uint16, ng, bpg int, zsym, zoff float32, y *float32, rows int, xstride, sstride, ystride int) {
	panic(unreachable)
}

func dotQ8x4m4AVX2(xq *int8, xs, xsum *float32, src *byte, scales, zeros *uint16, ng, bpg int, zsym, zoff float32, y *float32, rows int, xstride, sstride, ystride int) {
	panic(unreachable)
}

func dotQ8x4m4VNNI(xq *int8, xs, xsum *float32, src *byte, scales, zeros *uint16, ng, bpg int, zsym, zoff float32, y *float32, rows int, xstride, sstride, ystride int) {
	panic(unreachable)
}

func dotQ8x2m4AVX2(xq *int8, xs, xsum *float32, src *byte, scales, zeros *uint16, ng, bpg int, zsym, zoff float32, y *float32, rows int, xstride, sstride, ystride int) {
	panic(unreachable)
}

func dotQ8x2m4VNNI(xq *int8, xs, xsum *float32, src *byte, scales, zeros *uint16, ng, bpg int, zsym, zoff float32, y *float32, rows int, xstride, sstride, ystride int) {
	panic(unreachable)
}

func dotQ8x1m4AVX2(xq *int8, xs, xsum *float32, src *byte, scales, zeros *uint16, ng, bpg int, zsym, zoff float32, y *float32, rows int, xstride, sstride, ystride int) {
	panic(unreachable)
}

func dotQ8x1m4VNNI(xq *int8, xs, xsum *float32, src *byte, scales, zeros *uint16, ng, bpg int, zsym, zoff float32, y *float32, rows int, xstride, sstride, ystride int) {
	panic(unreachable)
}

func dotQ8x3AVX2(xq *int8, xs, xsum *float32, src *byte, scales, zeros *uint16, ng, bpg int, zsym, zoff float32, y *float32, rows int) {
	panic(unreachable)
}

func dotQ8x3VNNI(xq *int8, xs, xsum *float32, src *byte, scales, zeros *uint16, ng, bpg int, zsym, zoff float32, y *float32, rows int) {
	panic(unreachable)
}

func dotQ8x3m4AVX2(xq *int8, xs, xsum *float32, src *byte, scales, zeros *uint16, ng, bpg int, zsym, zoff float32, y *float32, rows int, xstride, sstride, ystride int) {
	panic(unreachable)
}

func dotQ8x3m4VNNI(xq *int8, xs, xsum *float32, src *byte, scales, zeros *uint16, ng, bpg int, zsym, zoff float32, y *float32, rows int, xstride, sstride, ystride int) {
	panic(unreachable)
}

func quantActQ8x32(x *float32, q *int8, s, sum *float32, nb int) (bad int) {
	panic(unreachable)
}

func dotQ8Pairs(a *Q8Act, i int, src *byte, bits int, scales, zeros *uint16, ng, bpg int, zsym float32, y *float32, pairs int) {
	panic(unreachable)
}
