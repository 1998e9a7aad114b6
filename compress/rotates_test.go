package compress

import "testing"

// TestRotates: the quantize-kv stage computes OSCAR rotations for the
// kinds that take calibrated rotations and whose widths a recipe fixes
// (oscar2-g32 included), and for no other.
func TestRotates(t *testing.T) {
	for cache, want := range map[string]bool{
		"oscar2": true, "oscar2-g32": true, "oscar4": true,
		"oscar-mixed": false, "kivi2": false, "quarot2": false, "fp16": false,
	} {
		if got := rotates(cache); got != want {
			t.Errorf("rotates(%q) = %v, want %v", cache, got, want)
		}
	}
}
