package pack_test

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/internal/engine"
	"github.com/lmpack/lmpack/internal/shared"
	. "github.com/lmpack/lmpack/pack"
)

// retypeTensor rewrites the single-file checkpoint dir with tensor name's
// dtype set to dtype (same element size, same bytes).
func retypeTensor(t *testing.T, dir, name string, dtype safetensors.DType) {
	t.Helper()
	ck, err := safetensors.OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var ws []safetensors.WriteTensor
	for _, n := range ck.Names() {
		x, err := ck.Tensor(n)
		if err != nil {
			t.Fatal(err)
		}
		w := safetensors.WriteTensor{Name: n, DType: x.DType, Shape: x.Shape, Data: slices.Clone(x.Data)}
		if n == name {
			w.DType = dtype
		}
		ws = append(ws, w)
	}
	ck.Close()
	if err := safetensors.WriteFile(filepath.Join(dir, "model.safetensors"), ws, nil); err != nil {
		t.Fatal(err)
	}
}

// TestPackRefusesUnloadable: FromCheckpoint (lmpack pack) refuses a
// checkpoint whose artifact run and eval would refuse: no tokenizer.json,
// a tokenizer_config.json that is not a JSON object, an integer dtype for
// a float weight; a NaN in a source weight is reported against the source
// file.
func TestPackRefusesUnloadable(t *testing.T) {
	const weight = "model.layers.1.mlp.down_proj.weight"
	for _, c := range []struct {
		name string
		edit func(dir string)
		want []string
	}{
		{"no tokenizer.json", func(d string) { os.Remove(filepath.Join(d, "tokenizer.json")) }, []string{"no tokenizer.json", "would not load"}},
		{"tokenizer_config.json {bad", func(d string) { os.WriteFile(filepath.Join(d, "tokenizer_config.json"), []byte("{bad"), 0o644) },
			[]string{"tokenizer_config.json", "not a JSON object", "run and eval would refuse"}},
		{"I32 weight", func(d string) { retypeTensor(t, d, weight, safetensors.I32) }, []string{weight, "dtype I32", "want a float dtype"}},
		{"U32 weight", func(d string) { retypeTensor(t, d, weight, safetensors.U32) }, []string{weight, "dtype U32", "want a float dtype"}},
		{"NaN weight", func(d string) {
			patchTensor(t, d, weight, func(b []byte) { binary.LittleEndian.PutUint32(b[4*5:], math.Float32bits(float32(math.NaN()))) })
		}, []string{"model.safetensors", weight, "element 5 (row-major) is NaN"}},
	} {
		dir := copyDir(t, shared.Path(t, "stories260K-hf"))
		c.edit(dir)
		a, err := FromCheckpoint(dir, FromOptions{LmpackVersion: "test"})
		if err == nil {
			a.Close()
			t.Errorf("%s: packed", c.name)
			continue
		}
		for _, w := range append(c.want, dir) {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %v, want %q in the error", c.name, err, w)
			}
		}
	}
}

// TestVerifyMeansLoadable: an artifact with every checksum right but no
// tokenizer.json, a tokenizer_config.json that is not a JSON object, or a
// float weight recorded as I32/U32 fails verify (which lists every one of
// these problems) and fails to load as run and eval load it (engine.Open).
func TestVerifyMeansLoadable(t *testing.T) {
	const weight = "model.layers.1.mlp.down_proj.weight"
	dropTok := func(a *Artifact) {
		a.Manifest.Files = slices.DeleteFunc(a.Manifest.Files, func(f FileEntry) bool { return f.Name == "tokenizer.json" })
		a.Manifest.Tokenizer = ""
		a.Sections = slices.DeleteFunc(a.Sections, func(s Section) bool { return s.Name == "file/tokenizer.json" })
	}
	badCfg := func(a *Artifact) {
		i := slices.IndexFunc(a.Sections, func(s Section) bool { return s.Name == "file/tokenizer_config.json" })
		a.Sections[i].Data = []byte("{bad")
	}
	retype := func(dtype string) func(a *Artifact) {
		return func(a *Artifact) {
			i := slices.IndexFunc(a.Manifest.Tensors, func(t TensorEntry) bool { return t.Name == weight })
			a.Manifest.Tensors[i].DType = dtype
		}
	}
	build := func(edits ...func(*Artifact)) string {
		t.Helper()
		a, err := FromCheckpoint(shared.Path(t, "stories260K-hf"), FromOptions{LmpackVersion: "test"})
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		for _, e := range edits {
			e(a)
		}
		p := filepath.Join(t.TempDir(), "x.lmpk")
		if _, err := Write(p, a, WriteOptions{}); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cases := []struct {
		name string
		edit func(*Artifact)
		want string
	}{
		{"no tokenizer.json", dropTok, "embeds no tokenizer.json"},
		{"tokenizer_config.json {bad", badCfg, "not a JSON object"},
		{"I32", retype("I32"), `tensor "` + weight + `": dtype I32, want a float dtype`},
		{"U32", retype("U32"), `tensor "` + weight + `": dtype U32, want a float dtype`},
	}
	for _, c := range cases {
		p := build(c.edit)
		rep, err := Verify(p)
		if err == nil || rep == nil || rep.OK || !strings.Contains(err.Error(), c.want) || !errors.Is(err, ErrFormat) {
			t.Errorf("%s: verify %v (report %+v), want ErrFormat with %q", c.name, err, rep, c.want)
		}
		if en, err := engine.Open(context.Background(), p, engine.Options{Threads: 1, Artifacts: true}); err == nil {
			en.Close()
			t.Errorf("%s: engine.Open loaded the artifact", c.name)
		}
	}
	// Two at once: verify lists both.
	rep, _ := Verify(build(dropTok, retype("I32")))
	if rep == nil || len(rep.Problems) != 2 {
		t.Fatalf("two problems: report %+v, want 2 problems", rep)
	}
	rep, _ = Verify(build(badCfg, retype("U32")))
	if rep == nil || len(rep.Problems) != 2 || !strings.Contains(rep.Problems[0].Error+rep.Problems[1].Error, "not a JSON object") {
		t.Fatalf("two problems: report %+v, want the dtype and tokenizer_config.json", rep)
	}
	// The unedited artifact verifies and loads.
	p := build()
	if _, err := Verify(p); err != nil {
		t.Fatal(err)
	}
	en, err := engine.Open(context.Background(), p, engine.Options{Threads: 1, Artifacts: true})
	if err != nil {
		t.Fatal(err)
	}
	en.Close()
}
