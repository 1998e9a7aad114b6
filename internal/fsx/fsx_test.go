package fsx

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReadFileRefusesFIFO(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	mkfifo(t, fifo)
	// Would block forever without the check.
	if _, err := ReadFile(fifo); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Fatalf("fifo: %v", err)
	}
	if _, err := ReadFile(dir); err == nil || !strings.Contains(err.Error(), "is a directory") {
		t.Fatalf("dir: %v", err)
	}
	p := filepath.Join(dir, "f")
	os.WriteFile(p, []byte("abc"), 0o644)
	if b, err := ReadFile(p); err != nil || string(b) != "abc" {
		t.Fatalf("regular: %q %v", b, err)
	}
}
