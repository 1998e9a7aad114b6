package pack_test

import (
	"path/filepath"
	"testing"

	"github.com/lmpack/lmpack/internal/engine"
	"github.com/lmpack/lmpack/internal/shared"
	. "github.com/lmpack/lmpack/pack"
)

// TestTiedLMHeadNotPacked: stories260K ties lm_head to the embedding and
// stores a copy; the artifact neither lists nor stores it, and the
// engine loads it with logits equal to the checkpoint's.
func TestTiedLMHeadNotPacked(t *testing.T) {
	a, err := FromCheckpoint(shared.Path(t, "stories260K-hf"), FromOptions{LmpackVersion: "test"})
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "m.lmpk")
	st, err := Write(out, a, WriteOptions{})
	a.Close()
	if err != nil {
		t.Fatal(err)
	}
	r, err := Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	m := r.Manifest()
	if !m.Model.TieWordEmbeddings {
		t.Fatal("stories260K: want tie_word_embeddings")
	}
	for _, tn := range m.Tensors {
		if tn.Name == "lm_head.weight" {
			t.Errorf("manifest lists the tied lm_head.weight")
		}
	}
	for _, s := range st.Sections {
		if s.Name == "lm_head.weight" {
			t.Errorf("section lm_head.weight stored (%d bytes)", s.Raw)
		}
	}
	ea, err := engine.Open(t.Context(), out, engine.Options{Threads: 1, Artifacts: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ea.Close()
	ec, err := engine.Open(t.Context(), shared.Path(t, "stories260K-hf"), engine.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer ec.Close()
	ids := []int{1, 400, 29, 7, 90}
	V := ec.Desc.VocabSize
	want := forwardLogits(t, ec.Model, ids, ec.Model.NewCache(8), V)
	got := forwardLogits(t, ea.Model, ids, ea.Model.NewCache(8), V)
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("logit %d: artifact %v, checkpoint %v", i, got[i], want[i])
		}
	}
}
