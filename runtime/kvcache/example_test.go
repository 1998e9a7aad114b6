package kvcache_test

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/internal/shared"
	"github.com/lmpack/lmpack/runtime"
	"github.com/lmpack/lmpack/runtime/kvcache"
)

// Decode stories260K with a 4-bit KV cache whose first 4 tokens stay fp16,
// and report what the cache holds: per layer 4 fp16 tokens (4 heads ×
// head_dim 8 × 2 bytes, K and V) and 8 INT4 tokens (per row of 8: 4 bytes
// of codes + fp16 scale and zero), 5 layers.
func ExampleNew() {
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
	cache, err := kvcache.New("int4", kvcache.LayersOf(d), 64, kvcache.Options{Sink: 4})
	if err != nil {
		panic(err)
	}
	logits := make([]float32, d.VocabSize)
	tok := []int{d.BOSTokenID}
	for i := 0; i < 12; i++ {
		if err := m.Forward(context.Background(), tok, cache, logits, false); err != nil {
			panic(err)
		}
		tok[0] = runtime.Argmax(logits)
	}
	bits := cache.(kvcache.Sizer).BitsPerElement()
	fmt.Printf("%d tokens, %d bytes, %.2f bits/element\n", cache.Len(), cache.Bytes(), bits)
	// Output: 12 tokens, 5120 bytes, 10.67 bits/element
}
