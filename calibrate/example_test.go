package calibrate_test

import (
	"fmt"

	"github.com/lmpack/lmpack/calibrate"
)

// Windows splits the first 7 of 10 token ids into windows of 3; the last
// window holds the remainder.
func ExampleWindows() {
	ids := []int{1, 10, 11, 12, 13, 14, 15, 16, 17, 18}
	w, err := calibrate.Windows(ids, 7, 3)
	if err != nil {
		panic(err)
	}
	fmt.Println(w)
	// Output: [[1 10 11] [12 13 14] [15]]
}

// Tensor names of the OSCAR statistics in a calibration file.
func ExampleOSCARTensorName() {
	fmt.Println(calibrate.OSCARTensorName(0, "c_q"), calibrate.OSCARTensorName(11, "c_s"))
	// Output: oscar.layers.0.c_q oscar.layers.11.c_s
}
