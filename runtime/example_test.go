package runtime_test

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/internal/shared"
	"github.com/lmpack/lmpack/runtime"
)

// Greedy decoding of stories260K from BOS.
func ExampleModel_Forward() {
	dir := filepath.Join(shared.Root(), "stories260K-hf")
	d, err := arch.Load(dir)
	if err != nil {
		panic(err)
	}
	ck, err := safetensors.OpenDir(dir)
	if err != nil {
		panic(err)
	}
	defer ck.Close()
	m, err := runtime.NewCPU().Load(context.Background(), d, ck, runtime.LoadOptions{Threads: 1})
	if err != nil {
		panic(err)
	}
	defer m.Close()
	cache := m.NewCache(16)
	logits := make([]float32, d.VocabSize) // [vocab] for the last token
	tok := []int{d.BOSTokenID}
	var out []int
	for i := 0; i < 6; i++ {
		if err := m.Forward(context.Background(), tok, cache, logits, false); err != nil {
			panic(err)
		}
		tok[0] = runtime.Argmax(logits)
		out = append(out, tok[0])
	}
	fmt.Println(out, cache.Len(), "tokens cached,", cache.Bytes(), "bytes")
	// Output: [403 407 261 378 432 383] 6 tokens cached, 7680 bytes
}
