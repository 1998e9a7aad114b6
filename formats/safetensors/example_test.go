package safetensors_test

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/lmpack/lmpack/formats/safetensors"
)

func ExampleWriteFile() {
	dir, _ := os.MkdirTemp("", "st")
	defer os.RemoveAll(dir)
	p := filepath.Join(dir, "model.safetensors")
	w, _ := safetensors.FromFloat32As("w", safetensors.BF16, []int{2, 2}, []float32{1, 2.5, -3, 0.125})
	if err := safetensors.WriteFile(p, []safetensors.WriteTensor{w}, map[string]string{"format": "pt"}); err != nil {
		panic(err)
	}
	f, err := safetensors.Open(p)
	if err != nil {
		panic(err)
	}
	defer f.Close()
	t, _ := f.Tensor("w")
	v, _ := t.Float32()
	fmt.Println(t.DType, t.Shape, v, len(t.Data), "bytes")
	// Output: BF16 [2 2] [1 2.5 -3 0.125] 8 bytes
}
