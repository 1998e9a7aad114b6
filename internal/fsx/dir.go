package fsx

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// RealAbs returns the absolute path of p with symlinks resolved in its
// longest existing prefix (the rest is joined on unchanged), so that two
// spellings of one place compare equal even when p does not exist yet.
// Errors: filepath.Abs errors.
func RealAbs(p string) (string, error) {
	a, err := filepath.Abs(p)
	if err != nil {
		return "", err
	}
	rest := ""
	for cur := a; ; cur = filepath.Dir(cur) {
		if r, err := filepath.EvalSymlinks(cur); err == nil {
			return filepath.Join(r, rest), nil
		}
		if filepath.Dir(cur) == cur {
			return a, nil
		}
		rest = filepath.Join(filepath.Base(cur), rest)
	}
}

// CheckNewDir checks that out can become a new output directory written
// from the model directory modelDir: out must not be modelDir or lie
// inside it (inputs are never modified), must not exist, and its parent
// must be a directory. what names the output in messages ("the pruned
// checkpoint"). Errors: plain errors naming out (callers wrap their
// ErrOutput).
func CheckNewDir(modelDir, out, what string) error {
	if out == "" {
		return fmt.Errorf("no output directory")
	}
	if err := CheckOutside(modelDir, out, what); err != nil {
		return err
	}
	od, err := RealAbs(out)
	if err != nil {
		return fmt.Errorf("output %s: %w", out, err)
	}
	if _, err := os.Lstat(out); err == nil {
		return fmt.Errorf("%s already exists; remove it or choose another path", out)
	}
	if st, err := os.Stat(filepath.Dir(od)); err != nil || !st.IsDir() {
		return fmt.Errorf("%s: parent directory %s does not exist", out, filepath.Dir(od))
	}
	return nil
}

// CheckOutside checks that the output path out (a file or a directory) is
// not the model directory modelDir and does not lie inside it, comparing
// the paths with symlinks resolved (RealAbs), so that an output is never
// written into a model's directory — a local checkpoint or the Hugging
// Face cache snapshot a hub id resolved to (inputs are never modified).
// what names the output in the message ("the calibration file"). Errors:
// plain errors naming out and modelDir (callers wrap them).
func CheckOutside(modelDir, out, what string) error {
	md, err := RealAbs(modelDir)
	if err != nil {
		return fmt.Errorf("model %s: %w", modelDir, err)
	}
	od, err := RealAbs(out)
	if err != nil {
		return fmt.Errorf("output %s: %w", out, err)
	}
	if rel, err := filepath.Rel(md, od); err == nil && (rel == "." || rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))) {
		return fmt.Errorf("%s is the model directory %s or inside it; write %s elsewhere (the input is never modified)", out, modelDir, what)
	}
	return nil
}

// WeightExts are the weight-file extensions CopySideFiles leaves behind.
var WeightExts = []string{".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf"}

// CopySideFiles copies the files of a checkpoint directory src that a
// rewritten checkpoint keeps — the tokenizer, generation config and the
// like — into dst: regular files (symlinks followed, as in the Hugging
// Face hub cache) other than weights (WeightExts), shard indexes
// (*.index.json), config.json (the caller writes its own), dotfiles and
// .md prose (the model card describes the source model). Files are
// created exclusively. Errors: I/O errors naming the file.
func CopySideFiles(src, dst string) error {
	ents, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	for _, e := range ents {
		name := e.Name()
		if name == "config.json" || strings.HasSuffix(name, ".index.json") || strings.HasPrefix(name, ".") || strings.HasSuffix(name, ".md") ||
			slices.Contains(WeightExts, filepath.Ext(name)) {
			continue
		}
		p := filepath.Join(src, name)
		if st, err := os.Stat(p); err != nil || !st.Mode().IsRegular() {
			continue
		}
		if err := copyFile(p, filepath.Join(dst, name)); err != nil {
			return err
		}
	}
	return nil
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("copying %s: %w", src, err)
	}
	if err := out.Close(); err != nil {
		return fmt.Errorf("%s: %w", dst, err)
	}
	return nil
}
