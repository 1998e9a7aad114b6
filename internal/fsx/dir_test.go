package fsx

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestCheckNewDir: the model directory itself, a path inside it (also via
// a symlink or ".."), an existing path and a missing parent are refused;
// a fresh sibling is accepted.
func TestCheckNewDir(t *testing.T) {
	root := t.TempDir()
	model := filepath.Join(root, "model")
	if err := os.Mkdir(model, 0o755); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(root, "link")
	if err := os.Symlink(model, link); err != nil {
		t.Fatal(err)
	}
	exists := filepath.Join(root, "exists")
	os.WriteFile(exists, nil, 0o644)
	for _, c := range []struct{ out, want string }{
		{model, "or inside it"},
		{model + "/", "or inside it"},
		{filepath.Join(model, "sub"), "or inside it"},
		{filepath.Join(link, "sub"), "or inside it"},
		{filepath.Join(root, "x", "..", "model", "q"), "or inside it"},
		{exists, "already exists"},
		{filepath.Join(root, "nope", "out"), "parent directory"},
		{"", "no output directory"},
	} {
		err := CheckNewDir(model, c.out, "the result")
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("CheckNewDir(%q): %v, want %q", c.out, err, c.want)
		}
	}
	if err := CheckNewDir(link, filepath.Join(root, "out"), "the result"); err != nil {
		t.Errorf("fresh sibling refused: %v", err)
	}
}

// TestCheckOutside: a file path in the model directory (also through a
// symlink to the directory, and a name starting with "..") is refused; a
// path beside the directory is accepted.
func TestCheckOutside(t *testing.T) {
	root := t.TempDir()
	model := filepath.Join(root, "model")
	if err := os.Mkdir(model, 0o755); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(root, "link")
	if err := os.Symlink(model, link); err != nil {
		t.Fatal(err)
	}
	for _, out := range []string{model, filepath.Join(model, "x.calib"), filepath.Join(link, "x.calib"), filepath.Join(model, "..x")} {
		if err := CheckOutside(model, out, "the file"); err == nil || !strings.Contains(err.Error(), "or inside it") {
			t.Errorf("CheckOutside(%q): %v, want a refusal", out, err)
		}
	}
	if err := CheckOutside(link, filepath.Join(model, "x.calib"), "the file"); err == nil {
		t.Errorf("CheckOutside through the symlinked model: accepted")
	}
	for _, out := range []string{filepath.Join(root, "x.calib"), filepath.Join(root, "..x"), filepath.Join(model, "..", "model2")} {
		if err := CheckOutside(model, out, "the file"); err != nil {
			t.Errorf("CheckOutside(%q) refused: %v", out, err)
		}
	}
}

// TestCopySideFiles: tokenizer-like files are copied (a symlinked one
// too, as in the hub cache); weights, indexes, config.json, dotfiles and
// .md files are not.
func TestCopySideFiles(t *testing.T) {
	src, dst := t.TempDir(), t.TempDir()
	for _, n := range []string{"tokenizer.json", "generation_config.json", "model.safetensors", "model.safetensors.index.json",
		"pytorch_model.bin", "config.json", ".hidden", "README.md", "blob"} {
		if err := os.WriteFile(filepath.Join(src, n), []byte(n), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(filepath.Join(src, "blob"), filepath.Join(src, "tokenizer_config.json")); err != nil {
		t.Fatal(err)
	}
	os.Mkdir(filepath.Join(src, "subdir"), 0o755)
	if err := CopySideFiles(src, dst); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(dst)
	var got []string
	for _, e := range ents {
		got = append(got, e.Name())
	}
	want := []string{"blob", "generation_config.json", "tokenizer.json", "tokenizer_config.json"}
	if !slices.Equal(got, want) {
		t.Errorf("copied %v, want %v", got, want)
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "tokenizer_config.json")); string(b) != "blob" {
		t.Errorf("symlinked file content %q", b)
	}
	if err := CopySideFiles(src, dst); err == nil {
		t.Errorf("copying onto existing files succeeded; want an error (files are created exclusively)")
	}
}
