package pack_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/internal/engine"
	. "github.com/lmpack/lmpack/pack"
)

// TestEngineRefusesCorruptTokenizerConfig: an artifact whose
// tokenizer_config.json section fails its checksum does not load (run and
// eval open artifacts through engine.Open); it is not taken as absent.
func TestEngineRefusesCorruptTokenizerConfig(t *testing.T) {
	out, _ := PackStories(t, WriteOptions{NoCompress: true})
	r, err := Open(out)
	if err != nil {
		t.Fatal(err)
	}
	off, stored, ok := SectionRange(r, "file/tokenizer_config.json")
	r.Close()
	if !ok {
		t.Fatal("artifact has no file/tokenizer_config.json section")
	}
	b, _ := os.ReadFile(out)
	b[off+stored/2] ^= 0x20
	if err := os.WriteFile(out, b, 0o644); err != nil {
		t.Fatal(err)
	}
	en, err := engine.Open(context.Background(), out, engine.Options{Threads: 1, Artifacts: true})
	if err == nil {
		en.Close()
		t.Fatal("engine.Open loaded an artifact whose tokenizer_config.json fails its checksum")
	}
	if !errors.Is(err, ErrChecksum) || !strings.Contains(err.Error(), "tokenizer_config.json") {
		t.Errorf("engine.Open: %v, want ErrChecksum naming tokenizer_config.json", err)
	}
	// A file the artifact does not embed is absent (fs.ErrNotExist).
	r, err = Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := r.File("vocab.txt"); !errors.Is(err, ErrNoSection) || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("File(vocab.txt): %v, want ErrNoSection and fs.ErrNotExist", err)
	}
}
