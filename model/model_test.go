package model

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/internal/shared"
)

func wantErr(t *testing.T, err error, parts ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got nil error, want one containing %q", parts)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Errorf("error %q does not contain %q", err, p)
		}
	}
}

// linkModel makes a temporary model directory whose files link to
// stories260K's, with config.json rewritten by edit when edit is not nil.
func linkModel(t *testing.T, edit func(cfg map[string]any)) string {
	t.Helper()
	src := shared.Path(t, "stories260K-hf")
	dir := t.TempDir()
	for _, f := range []string{"model.safetensors", "tokenizer.json", "tokenizer_config.json"} {
		if err := os.Symlink(filepath.Join(src, f), filepath.Join(dir, f)); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(filepath.Join(src, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		var cfg map[string]any
		if err := json.Unmarshal(b, &cfg); err != nil {
			t.Fatal(err)
		}
		edit(cfg)
		if b, err = json.Marshal(cfg); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestOpenWithoutConfig: a MODEL directory holding weights but no
// config.json is refused in user words (it is not a model directory, it
// has no config.json, what one holds), not with the stat error.
func TestOpenWithoutConfig(t *testing.T) {
	dir := linkModel(t, nil)
	if err := os.Remove(filepath.Join(dir, "config.json")); err != nil {
		t.Fatal(err)
	}
	_, _, ck, err := Open(context.Background(), dir, nil)
	if ck != nil {
		ck.Close()
	}
	wantErr(t, err, dir, "is not a model directory", "no config.json", "*.safetensors")
	if !errors.Is(err, ErrNoConfig) {
		t.Errorf("%v does not wrap ErrNoConfig", err)
	}
	if strings.Contains(err.Error(), "stat ") || strings.Contains(err.Error(), "arch:") {
		t.Errorf("%v: want user words, not the file system error", err)
	}
}

// TestResolve: directories pass unchanged; files, missing paths and
// artifacts given where a checkpoint is needed are refused, naming MODEL
// and what it is.
func TestResolve(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	if got, err := Resolve(ctx, dir, nil); err != nil || got != dir {
		t.Fatalf("Resolve(%s) = %q, %v", dir, got, err)
	}
	art := filepath.Join(dir, "m.lmpk")
	os.WriteFile(art, []byte(ArtifactMagic+"rest"), 0o644)
	empty := filepath.Join(dir, "e.lmpk")
	os.WriteFile(empty, nil, 0o644)
	bad := filepath.Join(dir, "b.lmpk")
	os.WriteFile(bad, []byte("GGUF...."), 0o644)
	txt := filepath.Join(dir, "notes.txt")
	os.WriteFile(txt, []byte("hello"), 0o644)
	cases := []struct {
		model string
		want  []string
	}{
		{art, []string{art, "is an lmpack artifact", "needs a checkpoint directory"}},
		{empty, []string{empty, "not an lmpack artifact", "the file is empty"}},
		{bad, []string{bad, `bad magic "GGUF"`, `want "LMPK"`}},
		{txt, []string{txt, "is a file; want a model directory"}},
		{filepath.Join(dir, "nope"), []string{"nope", "no such directory"}},
		{"./nope", []string{`"./nope"`, "no such directory"}},
	}
	for _, c := range cases {
		_, err := Resolve(ctx, c.model, nil)
		wantErr(t, err, c.want...)
	}
	if !IsArtifact(art) || IsArtifact(empty) || IsArtifact(bad) || IsArtifact(dir) || IsArtifact(filepath.Join(dir, "nope")) {
		t.Errorf("IsArtifact: %v %v %v %v, want true only for the LMPK file", IsArtifact(art), IsArtifact(empty), IsArtifact(bad), IsArtifact(dir))
	}
}

// TestCheck: stories260K's config and weights agree; a config with fewer
// layers leaves tensors undescribed (CheckUnused, naming the first), one
// with a larger intermediate_size names the tensor and both shapes, and a
// missing tensor wraps safetensors.ErrMissingTensor.
func TestCheck(t *testing.T) {
	open := func(dir string) (string, error) {
		d, ck, err := OpenDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer ck.Close()
		return dir, Check(dir, d, ck)
	}
	if _, err := open(linkModel(t, nil)); err != nil {
		t.Fatalf("stories260K: %v", err)
	}
	var layers, inter float64
	dir := linkModel(t, func(c map[string]any) {
		layers = c["num_hidden_layers"].(float64)
		c["num_hidden_layers"] = layers - 1
	})
	_, err := open(dir)
	wantErr(t, err, dir, "config.json does not describe", fmt.Sprintf(`"model.layers.%d.`, int(layers)-1))
	dir = linkModel(t, func(c map[string]any) {
		inter = c["intermediate_size"].(float64)
		c["intermediate_size"] = inter + 1
	})
	_, err = open(dir)
	wantErr(t, err, dir, "config.json and the weights disagree", "mlp", "config.json implies")
	dir = linkModel(t, func(c map[string]any) { c["num_hidden_layers"] = layers + 1 })
	_, err = open(dir)
	if !errors.Is(err, safetensors.ErrMissingTensor) {
		t.Errorf("one layer more: %v does not wrap safetensors.ErrMissingTensor", err)
	}
}

// TestFingerprint: the fingerprint is the sha256 of the documented byte
// string (prefix, config.json length and bytes, each tensor's quoted name,
// dtype and shape in name order), written out here independently; another
// model (stories260K-moe) gets another one, and so does a config.json
// whose bytes differ.
func TestFingerprint(t *testing.T) {
	fp := func(dir string) (string, *safetensors.Checkpoint) {
		_, ck, err := OpenDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ck.Close() })
		s, err := Fingerprint(dir, ck)
		if err != nil {
			t.Fatal(err)
		}
		return s, ck
	}
	dir := shared.Path(t, "stories260K-hf")
	got, ck := fp(dir)
	cfg, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	b.WriteString("lmpack-model-fingerprint-v1\n")
	n := len(cfg)
	for i := 0; i < 8; i++ {
		b.WriteByte(byte(n >> (8 * i)))
	}
	b.Write(cfg)
	names := ck.Names()
	if !slices.IsSorted(names) || len(names) == 0 {
		t.Fatalf("checkpoint names not sorted or empty")
	}
	for _, name := range names {
		ti, _, _ := ck.Info(name)
		dims := make([]string, len(ti.Shape))
		for i, x := range ti.Shape {
			dims[i] = fmt.Sprint(x)
		}
		fmt.Fprintf(&b, "%q %s [%s]\n", name, ti.DType, strings.Join(dims, " "))
	}
	want := sha256.Sum256([]byte(b.String()))
	if got != hex.EncodeToString(want[:]) {
		t.Errorf("fingerprint %s, want %s", got, hex.EncodeToString(want[:]))
	}
	other, _ := fp(shared.Path(t, "stories260K-moe-hf"))
	if other == got || len(got) != 64 {
		t.Errorf("fingerprints %s and %s: want two different 64-digit hex strings", got, other)
	}
	if same, _ := fp(linkModel(t, nil)); same != got {
		t.Errorf("the same files linked elsewhere: fingerprint %s, want %s", same, got)
	}
	if edited, _ := fp(linkModel(t, func(c map[string]any) { c["rms_norm_eps"] = 1e-6 })); edited == got {
		t.Errorf("config.json changed, fingerprint unchanged %s", got)
	}
}

// TestLoad: stories260K loads with its tokenizer on the CPU and gives
// finite logits over the vocabulary for a BOS prompt; a config with fewer
// layers than the weights is refused before loading.
func TestLoad(t *testing.T) {
	l, err := Load(context.Background(), linkModel(t, nil), LoadOptions{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if l.Tokenizer.VocabSize() > l.Desc.VocabSize || len(l.Desc.Layers) == 0 {
		t.Fatalf("tokenizer %d tokens, vocab_size %d, %d layers", l.Tokenizer.VocabSize(), l.Desc.VocabSize, len(l.Desc.Layers))
	}
	bos, ok := l.Tokenizer.BOS()
	if !ok {
		t.Fatal("stories260K: no BOS token")
	}
	logits := make([]float32, l.Desc.VocabSize)
	if err := l.Model.Forward(context.Background(), []int{bos}, l.Model.NewCache(4), logits, false); err != nil {
		t.Fatal(err)
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	for i, x := range logits {
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			t.Fatalf("logit %d is %v", i, x)
		}
		lo, hi = math.Min(lo, float64(x)), math.Max(hi, float64(x))
	}
	if hi-lo <= 0 {
		t.Errorf("logits all equal (%v): the weights were not loaded", lo)
	}
	dir := linkModel(t, func(c map[string]any) { c["num_hidden_layers"] = c["num_hidden_layers"].(float64) - 1 })
	if l2, err := Load(context.Background(), dir, LoadOptions{Threads: 1}); err == nil {
		l2.Close()
		t.Error("a config with fewer layers than the weights loaded")
	} else {
		wantErr(t, err, "config.json does not describe")
	}
}
