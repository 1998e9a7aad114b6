package pack_test

import (
	"path/filepath"
	"testing"

	"github.com/lmpack/lmpack/calibrate"
	"github.com/lmpack/lmpack/internal/engine"
	"github.com/lmpack/lmpack/internal/shared"
	"github.com/lmpack/lmpack/model"
	. "github.com/lmpack/lmpack/pack"
	"github.com/lmpack/lmpack/quantize/oscar"
	"github.com/lmpack/lmpack/runtime"
	"github.com/lmpack/lmpack/runtime/kvcache"
)

// rotationFile calibrates stories260K on 1024 tokens of calib.txt and
// writes its OSCAR rotation file into dir.
func rotationFile(t *testing.T, model, dir string) string {
	t.Helper()
	calib := filepath.Join(dir, "calib.safetensors")
	if _, err := calibrate.Run(t.Context(), calibrate.Options{Model: model, Data: shared.Path(t, "tinystories-valid", "calib.txt"),
		Tokens: 1024, Ctx: 256, Out: calib, Threads: 1, Version: "test"}); err != nil {
		t.Fatal(err)
	}
	rot := filepath.Join(dir, "rot.safetensors")
	if _, err := oscar.QuantizeKV(t.Context(), oscar.KVOptions{Model: model, Calib: calib, Method: oscar.Method,
		ClipK: oscar.DefaultClipK, ClipV: oscar.DefaultClipV, Out: rot, Version: "test"}); err != nil {
		t.Fatal(err)
	}
	return rot
}

// TestArtifactKVCacheLogits: a stories260K artifact packed with oscar2
// rotations and windows loads with that KV cache, and its logits over 96
// tokens (fed in chunks of 16) equal bit for bit those of the checkpoint run with
// kvcache.New("oscar2") and the rotation file; they differ from the
// float32 cache's (so the scheme is really applied). Every rotation is
// consumed.
func TestArtifactKVCacheLogits(t *testing.T) {
	mdir := shared.Path(t, "stories260K-hf")
	dir := t.TempDir()
	rotPath := rotationFile(t, mdir, dir)
	a, err := FromCheckpoint(mdir, FromOptions{KVRotations: rotPath, KVSink: 4, KVRecent: 16, LmpackVersion: "test"})
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "m.lmpk")
	_, err = Write(out, a, WriteOptions{})
	a.Close()
	if err != nil {
		t.Fatal(err)
	}
	ea, err := engine.Open(t.Context(), out, engine.Options{Threads: 1, Artifacts: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ea.Close()
	if ea.KVCache != "oscar2" {
		t.Fatalf("engine KVCache %q, want oscar2", ea.KVCache)
	}
	for _, n := range ea.Artifact.Unconsumed() {
		if n != "lm_head.weight" || !ea.Desc.TieWordEmbeddings {
			t.Fatalf("tensor %q unconsumed after load", n)
		}
	}
	ec, err := engine.Open(t.Context(), mdir, engine.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer ec.Close()
	fp, err := model.Fingerprint(mdir, ec.Checkpoint)
	if err != nil {
		t.Fatal(err)
	}
	rot, _, err := oscar.ReadFile(rotPath, model.Expect{ModelFingerprint: fp, Desc: ec.Desc})
	if err != nil {
		t.Fatal(err)
	}
	kr := kvcache.Rotations(*rot)
	const n = 96
	ids, err := ec.EvalIDs(shared.Path(t, "tinystories-valid", "heldout.txt"), n)
	if err != nil {
		t.Fatal(err)
	}
	ids = ids[:n]
	V := ec.Desc.VocabSize
	want := make([]float32, n*V)
	c, err := kvcache.New("oscar2", kvcache.LayersOf(ec.Desc), n, kvcache.Options{Rotations: &kr, Sink: 4, Recent: 16})
	if err != nil {
		t.Fatal(err)
	}
	// In chunks of 16 tokens: within one Forward call the runtime attends
	// the call's tokens through their fresh float32 K/V, so only the
	// earlier chunks are read through the cache.
	chunked := func(m runtime.Model, c runtime.KVCache, out []float32) error {
		for a := 0; a < n; a += 16 {
			if err := m.Forward(t.Context(), ids[a:a+16], c, out[a*V:(a+16)*V], true); err != nil {
				return err
			}
		}
		return nil
	}
	if err := chunked(ec.Model, c, want); err != nil {
		t.Fatal(err)
	}
	got := make([]float32, n*V)
	if err := chunked(ea.Model, ea.Model.NewCache(n), got); err != nil {
		t.Fatal(err)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("logit %d (position %d): artifact %v, checkpoint+oscar2 %v", i, i/V, got[i], want[i])
		}
	}
	f32 := make([]float32, n*V)
	if err := chunked(ec.Model, ec.Model.NewCache(n), f32); err != nil {
		t.Fatal(err)
	}
	diff := 0
	for i := range f32 {
		if f32[i] != got[i] {
			diff++
		}
	}
	if diff < n*V/2 {
		t.Errorf("only %d of %d logits differ from the float32 cache's: the oscar2 scheme seems not applied", diff, n*V)
	}
}
