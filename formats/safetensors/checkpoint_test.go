package safetensors

import (
	"bytes"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// writeSharded writes a two-shard checkpoint into dir and returns the
// tensors by name.
func writeSharded(t *testing.T, dir string) map[string]WriteTensor {
	t.Helper()
	a := FromFloat32("model.a", []int{2, 3}, []float32{1, 2, 3, 4, 5, 6})
	b, _ := FromFloat32As("model.b", BF16, []int{2}, []float32{0.5, -8})
	c, _ := FromFloat32As("model.c", F16, []int{}, []float32{3.5})
	if err := WriteFile(filepath.Join(dir, "model-00001-of-00002.safetensors"), []WriteTensor{a, b}, map[string]string{"format": "pt"}); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(filepath.Join(dir, "model-00002-of-00002.safetensors"), []WriteTensor{c}, nil); err != nil {
		t.Fatal(err)
	}
	wm := map[string]string{
		"model.a": "model-00001-of-00002.safetensors",
		"model.b": "model-00001-of-00002.safetensors",
		"model.c": "model-00002-of-00002.safetensors",
	}
	if err := WriteIndex(filepath.Join(dir, IndexFileName), int64(len(a.Data)+len(b.Data)+len(c.Data)), wm); err != nil {
		t.Fatal(err)
	}
	return map[string]WriteTensor{"model.a": a, "model.b": b, "model.c": c}
}

func TestShardedCheckpoint(t *testing.T) {
	dir := t.TempDir()
	want := writeSharded(t, dir)
	c, err := OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got := c.Names(); !slices.Equal(got, []string{"model.a", "model.b", "model.c"}) {
		t.Errorf("Names = %v", got)
	}
	if len(c.Files()) != 2 {
		t.Errorf("%d files, want 2", len(c.Files()))
	}
	for name, w := range want {
		tn, err := c.Tensor(name)
		if err != nil {
			t.Fatal(err)
		}
		if tn.DType != w.DType || !slices.Equal(tn.Shape, w.Shape) || !bytes.Equal(tn.Data, w.Data) {
			t.Errorf("%s: got %s %v, want %s %v", name, tn.DType, tn.Shape, w.DType, w.Shape)
		}
	}
	v, _ := c.Tensor("model.c")
	if f, _ := v.Float32(); len(f) != 1 || f[0] != 3.5 {
		t.Errorf("model.c = %v, want [3.5]", f)
	}
	_, file, _ := c.Info("model.c")
	if filepath.Base(file) != "model-00002-of-00002.safetensors" {
		t.Errorf("model.c in %s", file)
	}
	_, err = c.Tensor("model.zzz")
	wantErr(t, err, dir, `tensor "model.zzz"`)
	if !errors.Is(err, ErrMissingTensor) {
		t.Errorf("%v does not wrap ErrMissingTensor", err)
	}
	_, _, err = c.Info("model.zzz")
	if !errors.Is(err, ErrMissingTensor) {
		t.Errorf("Info: %v does not wrap ErrMissingTensor", err)
	}
	// The index written by WriteIndex is what transformers writes.
	raw, _ := os.ReadFile(filepath.Join(dir, IndexFileName))
	var ix struct {
		Metadata  map[string]int64  `json:"metadata"`
		WeightMap map[string]string `json:"weight_map"`
	}
	if err := json.Unmarshal(raw, &ix); err != nil || ix.Metadata["total_size"] != 24+4+2 || len(ix.WeightMap) != 3 {
		t.Errorf("index %s: %+v %v", raw, ix, err)
	}
}

func TestShardedIndexErrors(t *testing.T) {
	edit := func(t *testing.T, dir string, wm map[string]string) string {
		t.Helper()
		p := filepath.Join(dir, IndexFileName)
		b, _ := json.Marshal(map[string]any{"metadata": map[string]any{}, "weight_map": wm})
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	s1, s2 := "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
	cases := []struct {
		name   string
		wm     map[string]string
		tensor string
		want   string
	}{
		{"tensor not in shard", map[string]string{"model.a": s1, "model.b": s1, "model.c": s2, "model.d": s2}, "model.d", "does not hold it"},
		{"wrong shard", map[string]string{"model.a": s2, "model.b": s1, "model.c": s2}, "model.a", "does not hold it"},
		{"unlisted tensor", map[string]string{"model.a": s1, "model.c": s2}, "model.b", "weight map does not assign it"},
		{"path escape", map[string]string{"model.a": "../" + s1}, "model.a", "not a file name inside the directory"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			writeSharded(t, dir)
			idx := edit(t, dir, c.wm)
			ck, err := OpenDir(dir)
			if ck != nil {
				ck.Close()
			}
			wantErr(t, err, idx, `tensor "`+c.tensor+`"`, c.want)
			if !errors.Is(err, ErrFormat) {
				t.Errorf("%v does not wrap ErrFormat", err)
			}
		})
	}
	t.Run("invalid json", func(t *testing.T) {
		dir := t.TempDir()
		writeSharded(t, dir)
		p := filepath.Join(dir, IndexFileName)
		os.WriteFile(p, []byte(`{"weight_map": {"a": "x", "a": "y"}}`), 0o644)
		_, err := OpenDir(dir)
		wantErr(t, err, p, `duplicate key "a"`)
	})
}

// TestMissingShard: a shard that model.safetensors.index.json names but
// the directory lacks is reported as missing (fs.ErrNotExist), naming the
// shard and a tensor it should hold, not as malformed data.
func TestMissingShard(t *testing.T) {
	dir := t.TempDir()
	writeSharded(t, dir)
	s2 := "model-00002-of-00002.safetensors"
	if err := os.Remove(filepath.Join(dir, s2)); err != nil {
		t.Fatal(err)
	}
	ck, err := OpenDir(dir)
	if ck != nil {
		ck.Close()
	}
	wantErr(t, err, s2, "is missing", `"model.c"`)
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("%v does not wrap fs.ErrNotExist", err)
	}
	if errors.Is(err, ErrFormat) || strings.Contains(err.Error(), "malformed") {
		t.Errorf("%v: a missing shard is not malformed data", err)
	}
}

func TestDirectoryFallbacks(t *testing.T) {
	// No index, no model.safetensors: every *.safetensors file is read.
	dir := t.TempDir()
	writeSharded(t, dir)
	os.Remove(filepath.Join(dir, IndexFileName))
	c, err := OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Names()) != 3 {
		t.Errorf("glob fallback: %v", c.Names())
	}
	c.Close()

	// A tensor name in two files is an error naming both.
	dup := filepath.Join(dir, "extra.safetensors")
	if err := WriteFile(dup, []WriteTensor{FromFloat32("model.c", []int{1}, []float32{1})}, nil); err != nil {
		t.Fatal(err)
	}
	_, err = OpenDir(dir)
	wantErr(t, err, `tensor "model.c"`, dup, "model-00002-of-00002.safetensors")

	// model.safetensors wins over other files; OpenPath takes a file too.
	single := filepath.Join(dir, SingleFileName)
	if err := WriteFile(single, []WriteTensor{FromFloat32("only", []int{1}, []float32{1})}, nil); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{dir, single} {
		c, err := OpenPath(p)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(c.Names(), []string{"only"}) {
			t.Errorf("OpenPath(%s) names %v, want [only]", p, c.Names())
		}
		c.Close()
	}
	c, err = OpenPath(dup)
	if err != nil || !slices.Equal(c.Names(), []string{"model.c"}) {
		t.Errorf("OpenPath(file) = %v, %v", c, err)
	}
	c.Close()

	_, err = OpenDir(t.TempDir())
	wantErr(t, err, "no safetensors weights: want "+IndexFileName)
	if !errors.Is(err, ErrNoWeights) {
		t.Errorf("OpenDir(empty) = %v, want ErrNoWeights", err)
	}
	_, err = OpenPath(filepath.Join(dir, "absent"))
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("OpenPath(absent) = %v", err)
	}
}
