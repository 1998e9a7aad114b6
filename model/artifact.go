package model

import (
	"fmt"
	"github.com/lmpack/lmpack/internal/fsx"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// ArtifactMagic is the first four bytes of an lmpack artifact (.lmpk,
// docs/FORMAT.md); package pack writes and reads the format.
const ArtifactMagic = "LMPK"

// IsArtifact reports whether path is a regular file starting with
// ArtifactMagic. Unreadable paths are not artifacts (the caller's own
// open reports why).
func IsArtifact(path string) bool {
	st, err := os.Stat(path)
	if err != nil || !st.Mode().IsRegular() {
		return false
	}
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	b := make([]byte, len(ArtifactMagic))
	if _, err := io.ReadFull(f, b); err != nil {
		return false
	}
	return string(b) == ArtifactMagic
}

// fileModelError explains why the regular file model cannot be a MODEL
// where a checkpoint directory (or an artifact, for commands that take
// one) is wanted: an artifact given to a command that needs a checkpoint;
// a .lmpk file, or any file, whose first bytes are not ArtifactMagic (an
// empty or corrupt artifact says so, as lmpack verify does).
func fileModelError(model string) error {
	if err := fsx.CheckRegular(model); err != nil {
		// A FIFO or device: reading it to look for the magic would block
		// or never end.
		return fmt.Errorf("model: MODEL %w; want a model directory, an lmpack artifact or a Hugging Face id", err)
	}
	if IsArtifact(model) {
		return fmt.Errorf("model: MODEL %q is an lmpack artifact; this command needs a checkpoint directory (run, eval without --kv, and inspect accept artifacts)", model)
	}
	if strings.EqualFold(filepath.Ext(model), ".lmpk") {
		b := make([]byte, len(ArtifactMagic))
		n := 0
		if f, err := os.Open(model); err == nil {
			n, _ = io.ReadFull(f, b)
			f.Close()
		}
		if n == 0 {
			return fmt.Errorf("model: MODEL %q is not an lmpack artifact: the file is empty (want magic %q; run lmpack verify)", model, ArtifactMagic)
		}
		return fmt.Errorf("model: MODEL %q is not an lmpack artifact: bad magic %q, want %q (run lmpack verify)", model, b[:n], ArtifactMagic)
	}
	return fmt.Errorf("model: MODEL %q is a file; want a model directory, an lmpack artifact or a Hugging Face id (the file does not start with the artifact magic %q)", model, ArtifactMagic)
}
