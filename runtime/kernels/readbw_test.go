package kernels

import (
	"encoding/binary"
	"testing"
)

// TestStreamReadAVX2 checks that streamReadAVX2 reads every byte of its
// n: the OR it returns (low 64 bits of the 32-byte words) changes with a
// single bit set anywhere in a lane-0 position of the buffer, including
// the last 32-byte word, and bytes past n are not read.
func TestStreamReadAVX2(t *testing.T) {
	if !hasAsm {
		t.Skip("no assembly kernels in this build")
	}
	for _, n := range []int{256, 512, 3 * 256} {
		buf := make([]byte, n+32)
		if got := streamReadAVX2(&buf[0], n); got != 0 {
			t.Fatalf("n=%d zeros: got %#x", n, got)
		}
		for w := 0; w < n/32; w++ {
			clear(buf)
			bit := uint64(1) << (w % 64)
			binary.LittleEndian.PutUint64(buf[32*w:], bit)
			if got := streamReadAVX2(&buf[0], n); got != bit {
				t.Fatalf("n=%d word %d: got %#x, want %#x", n, w, got, bit)
			}
		}
		clear(buf)
		buf[n] = 0xff // past n
		if got := streamReadAVX2(&buf[0], n); got != 0 {
			t.Fatalf("n=%d read past n: got %#x", n, got)
		}
	}
}
