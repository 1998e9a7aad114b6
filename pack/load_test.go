package pack

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
)

// TestReaderAsTensorSource: Description equals arch.Load of the source
// checkpoint; every Tensor equals the checkpoint's tensor (dtype, shape,
// bytes) for both raw and lz4 artifacts; consumption is tracked; a
// missing name wraps safetensors.ErrMissingTensor.
func TestReaderAsTensorSource(t *testing.T) {
	dir := storiesDir(t)
	want, err := arch.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	ck, err := safetensors.OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	for _, noCompress := range []bool{true, false} {
		out, _ := packStories(t, WriteOptions{NoCompress: noCompress})
		r, err := Open(out)
		if err != nil {
			t.Fatal(err)
		}
		got, err := r.Description()
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("Description:\n got %+v\nwant %+v", got, want)
		}
		// The tied lm_head copy is not packed.
		names := slices.DeleteFunc(ck.Names(), func(n string) bool { return n == want.LMHead })
		if u := r.Unconsumed(); len(u) != len(names) {
			t.Errorf("before any read: %d unconsumed, want %d", len(u), len(names))
		}
		for _, n := range names[1:] {
			ct, _ := ck.Tensor(n)
			at, err := r.Tensor(n)
			if err != nil {
				t.Fatal(err)
			}
			if at.DType != ct.DType || !reflect.DeepEqual(at.Shape, ct.Shape) || !bytes.Equal(at.Data, ct.Data) || at.File != out {
				t.Errorf("tensor %q: artifact %s %v (%d bytes, %s), checkpoint %s %v (%d bytes)", n, at.DType, at.Shape, len(at.Data), at.File, ct.DType, ct.Shape, len(ct.Data))
			}
		}
		if u := r.Unconsumed(); !reflect.DeepEqual(u, names[:1]) {
			t.Errorf("unconsumed %v, want %v", u, names[:1])
		}
		_, err = r.Tensor("model.layers.99.mlp.up_proj.weight")
		if !errors.Is(err, safetensors.ErrMissingTensor) || !strings.Contains(err.Error(), out) || !strings.Contains(err.Error(), "layers.99") {
			t.Errorf("missing tensor: %v", err)
		}
		tok, err := r.File("tokenizer.json")
		src, _ := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
		if err != nil || !bytes.Equal(tok, src) {
			t.Errorf("File(tokenizer.json): %d bytes, %v; want %d bytes", len(tok), err, len(src))
		}
		if _, err := r.File("vocab.txt"); !errors.Is(err, ErrNoSection) {
			t.Errorf("File(vocab.txt): %v", err)
		}
		r.Close()
	}
}

// TestTensorCorruptSection: a byte flipped in each tensor section makes
// Tensor fail with ErrChecksum naming the tensor, for raw and lz4
// sections alike, instead of returning the corrupt bytes.
func TestTensorCorruptSection(t *testing.T) {
	for _, noCompress := range []bool{true, false} {
		out, _ := packStories(t, WriteOptions{NoCompress: noCompress})
		orig, _ := os.ReadFile(out)
		r, err := Open(out)
		if err != nil {
			t.Fatal(err)
		}
		entries := r.l.entries
		tensors := r.manifest.Tensors
		r.Close()
		bySection := map[string]string{}
		for _, te := range tensors {
			bySection[te.Section] = te.Name
		}
		p := filepath.Join(t.TempDir(), "c.lmpk")
		for _, e := range entries {
			name, ok := bySection[e.Name]
			if !ok || e.Stored == 0 {
				continue
			}
			b := bytes.Clone(orig)
			b[e.Offset+e.Stored/2] ^= 0x10
			if err := os.WriteFile(p, b, 0o644); err != nil {
				t.Fatal(err)
			}
			r, err := Open(p)
			if err != nil {
				t.Fatalf("Open after flipping section %q: %v (Open does not read sections)", e.Name, err)
			}
			_, err = r.Tensor(name)
			r.Close()
			if !errors.Is(err, ErrChecksum) || !strings.Contains(err.Error(), name) {
				t.Fatalf("section %q (codec %d) flipped: Tensor error %v", e.Name, e.Codec, err)
			}
		}
	}
}
