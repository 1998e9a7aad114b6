package oscar_test

import (
	"fmt"

	"github.com/lmpack/lmpack/quantize/oscar"
)

// The rotation of a diagonal covariance: the eigenvectors are the unit
// vectors sorted by variance (coordinates 2, 3, 1, 0), so row k_i of R is
// row i of the Hadamard matrix H_4 with its columns placed by bit reversal
// (R[k_i][br(j)] = H[i][j], br = [0 2 1 3]); every rotated coordinate has
// the same variance, trace/d = 4.
func ExampleRotation() {
	cov := []float64{
		1, 0, 0, 0,
		0, 2, 0, 0,
		0, 0, 9, 0,
		0, 0, 0, 4,
	}
	r, eig, err := oscar.Rotation(cov, 4)
	if err != nil {
		panic(err)
	}
	fmt.Println("eigenvalues:", eig)
	for i := 0; i < 4; i++ {
		fmt.Printf("%5.2f\n", r[i*4:(i+1)*4])
	}
	fmt.Printf("max|RRᵀ−I| < 1e-12: %v\n", oscar.Orthogonality(r, 4) < 1e-12)
	// Output:
	// eigenvalues: [9 4 2 1]
	// [ 0.50 -0.50 -0.50  0.50]
	// [ 0.50 -0.50  0.50 -0.50]
	// [ 0.50  0.50  0.50  0.50]
	// [ 0.50  0.50 -0.50 -0.50]
	// max|RRᵀ−I| < 1e-12: true
}
