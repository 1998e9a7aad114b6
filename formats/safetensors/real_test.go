package safetensors

import (
	"bytes"
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/lmpack/lmpack/internal/shared"
	nlp "github.com/nlpodyssey/safetensors"
)

// TestRealCheckpointCrossCheck reads the stories260K checkpoint with this
// package and with nlpodyssey/safetensors and compares every tensor.
func TestRealCheckpointCrossCheck(t *testing.T) {
	path := shared.Path(t, "stories260K-hf", "model.safetensors")
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	st, err := nlp.Deserialize(raw)
	if err != nil {
		t.Fatal(err)
	}
	theirNames := st.Names()
	slices.Sort(theirNames)
	var ourNames []string
	for _, ti := range f.Tensors() {
		ourNames = append(ourNames, ti.Name)
	}
	if !slices.Equal(ourNames, theirNames) {
		t.Fatalf("names differ:\nours   %v\ntheirs %v", ourNames, theirNames)
	}
	if len(ourNames) != 48 {
		t.Errorf("%d tensors, want 48 (SOURCE.md)", len(ourNames))
	}
	_, theirMeta, err := nlp.ReadMetadata(raw)
	if err != nil {
		t.Fatal(err)
	}
	if got := f.Metadata(); got["format"] != "pt" || len(got) != len(theirMeta.Metadata()) {
		t.Errorf("metadata %v, nlpodyssey %v", got, theirMeta.Metadata())
	}
	for _, name := range ourNames {
		ours, err := f.Tensor(name)
		if err != nil {
			t.Fatal(err)
		}
		theirs, _ := st.Tensor(name)
		shape := make([]int, len(theirs.Shape()))
		for i, d := range theirs.Shape() {
			shape[i] = int(d)
		}
		if string(ours.DType) != theirs.DType().String() || !slices.Equal(ours.Shape, shape) || !bytes.Equal(ours.Data, theirs.Data()) {
			t.Errorf("%s: ours %s %v, nlpodyssey %s %v (bytes equal %v)", name, ours.DType, ours.Shape, theirs.DType(), shape, bytes.Equal(ours.Data, theirs.Data()))
		}
		vals, err := ours.Float32()
		if err != nil {
			t.Fatal(err)
		}
		for i, v := range vals {
			if w := math.Float32frombits(binary.LittleEndian.Uint32(theirs.Data()[4*i:])); v != w {
				t.Fatalf("%s[%d] = %v, want %v", name, i, v, w)
			}
		}
	}
	emb, err := f.Tensor("model.embed_tokens.weight")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(emb.Shape, []int{512, 64}) || emb.DType != F32 {
		t.Errorf("embed_tokens %s %v, want F32 [512 64]", emb.DType, emb.Shape)
	}

	// The directory opens as a single-file checkpoint with the same tensors.
	c, err := OpenDir(filepath.Dir(path))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if !slices.Equal(c.Names(), ourNames) || len(c.Files()) != 1 {
		t.Errorf("OpenDir: %d names, %d files", len(c.Names()), len(c.Files()))
	}
	ti, file, err := c.Info("model.norm.weight")
	if err != nil || file != path || !slices.Equal(ti.Shape, []int{64}) {
		t.Errorf("Info(model.norm.weight) = %+v %s %v", ti, file, err)
	}
}
