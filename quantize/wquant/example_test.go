package wquant_test

import (
	"fmt"

	"github.com/lmpack/lmpack/quantize/wquant"
)

// StorageBits gives the bits a quantized weight takes in the checkpoint
// format (codes, fp16 scales and zero-points), which is what bits per
// weight and the allocator's budget count.
func ExampleStorageBits() {
	rows, cols := 4096, 4096
	for _, c := range []struct {
		bits, group int
		sym         bool
	}{{4, 128, false}, {4, 128, true}, {4, 32, false}, {3, 0, false}, {2, 64, false}} {
		b := wquant.StorageBits(rows, cols, c.bits, c.group, c.sym, false)
		fmt.Printf("%d-bit group %d symmetric %v: %.4f bits per weight\n", c.bits, c.group, c.sym, float64(b)/float64(rows*cols))
	}
	// Output:
	// 4-bit group 128 symmetric false: 4.2500 bits per weight
	// 4-bit group 128 symmetric true: 4.1250 bits per weight
	// 4-bit group 32 symmetric false: 5.0000 bits per weight
	// 3-bit group 0 symmetric false: 3.0078 bits per weight
	// 2-bit group 64 symmetric false: 2.5000 bits per weight
}
