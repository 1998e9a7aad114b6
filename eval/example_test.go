package eval_test

import (
	"fmt"
	"math"

	"github.com/lmpack/lmpack/eval"
)

func ExampleNLL() {
	// Uniform logits over 4 tokens: NLL = ln 4 nats, perplexity 4.
	nll := eval.NLL([]float32{0, 0, 0, 0}, 2)
	fmt.Printf("%.6f %.3f\n", nll, math.Exp(nll))
	// Output: 1.386294 4.000
}
