package compress

import "testing"

// TestRotates: the quantize-kv stage computes OSCAR rotations for the
// kinds that take calibrated rotations (oscar2-g32 included; oscar-mixed
// with its widths from kv_bits), and for no other.
func TestRotates(t *testing.T) {
	for cache, want := range map[string]bool{
		"oscar2": true, "oscar2-g32": true, "oscar4": true,
		"oscar-mixed": true, "kivi2": false, "quarot2": false, "fp16": false,
	} {
		if got := rotates(cache); got != want {
			t.Errorf("rotates(%q) = %v, want %v", cache, got, want)
		}
	}
}
