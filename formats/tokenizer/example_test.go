package tokenizer_test

import (
	"fmt"
	"path/filepath"

	"github.com/lmpack/lmpack/formats/tokenizer"
	"github.com/lmpack/lmpack/internal/shared"
)

func ExampleTokenizer_Encode() {
	tok, err := tokenizer.Load(filepath.Join(shared.Root(), "stories260K-hf", "tokenizer.json"))
	if err != nil {
		panic(err)
	}
	ids := tok.Encode("Once upon a time", true)
	fmt.Println(ids)
	fmt.Printf("%q\n", tok.Decode(ids, true))
	// Output:
	// [1 403 407 261 378]
	// "Once upon a time"
}
