package compress_test

import (
	"errors"
	"fmt"

	"github.com/lmpack/lmpack/compress"
)

// ExampleParseRecipe parses a KV-only INT2 recipe (defaults filled in)
// and shows the error for a misspelt key.
func ExampleParseRecipe() {
	r, err := compress.ParseRecipe("kv.yaml", []byte(`
calibrate: {data: calib.txt, tokens: 16384, ctx: 512}
quantize:
  kv: {cache: oscar2, sink: 64, recent: 256}
eval: {data: heldout.txt, ctx: 512, max_delta_ppl_pct: 5}
`))
	if err != nil {
		panic(err)
	}
	fmt.Println(r.Quantize.KV.Cache, r.Quantize.KV.ClipK, r.Quantize.KV.ClipV, *r.Pack.LZ4)
	_, err = compress.ParseRecipe("bad.yaml", []byte("eval:\n  ctx: 512\n  max_ppl: 2\n"))
	fmt.Println(errors.Is(err, compress.ErrRecipe), err)
	// Output:
	// oscar2 0.96 0.92 true
	// true compress: bad recipe: bad.yaml: line 3: unknown key "max_ppl" in eval
}
