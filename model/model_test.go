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

// TestFingerprint: the fingerprint is FingerprintTag and the sha256 of
// the documented byte string (prefix, config.json length and bytes, each
// tensor's quoted name, dtype, shape and the sha256 of its bytes in name
// order), written out here independently; another model
// (stories260K-moe) gets another one, and so does a config.json whose
// bytes differ.
func TestFingerprint(t *testing.T) {
	dir := shared.Path(t, "stories260K-hf")
	got, ck := fingerprint(t, dir)
	cfg, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	b.WriteString("lmpack-model-fingerprint-v2\n")
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
		ti, _ := ck.Tensor(name)
		dims := make([]string, len(ti.Shape))
		for i, x := range ti.Shape {
			dims[i] = fmt.Sprint(x)
		}
		sum := sha256.Sum256(ti.Data)
		fmt.Fprintf(&b, "%q %s [%s] %s\n", name, ti.DType, strings.Join(dims, " "), hex.EncodeToString(sum[:]))
	}
	want := sha256.Sum256([]byte(b.String()))
	if got != "v2:"+hex.EncodeToString(want[:]) {
		t.Errorf("fingerprint %s, want v2:%s", got, hex.EncodeToString(want[:]))
	}
	if OlderFingerprint(got) {
		t.Errorf("OlderFingerprint(%s) = true for this lmpack's fingerprint", got)
	}
	if old := hex.EncodeToString(want[:]); !OlderFingerprint(old) || OlderFingerprint("00") || OlderFingerprint(strings.ToUpper(old)) {
		t.Errorf("OlderFingerprint: want true only for 64 lowercase hex digits without a tag (%s)", old)
	}
	other, _ := fingerprint(t, shared.Path(t, "stories260K-moe-hf"))
	if other == got || len(got) != 67 {
		t.Errorf("fingerprints %s and %s: want two different tagged 64-digit hex strings", got, other)
	}
	if same, _ := fingerprint(t, linkModel(t, nil)); same != got {
		t.Errorf("the same files linked elsewhere: fingerprint %s, want %s", same, got)
	}
	if edited, _ := fingerprint(t, linkModel(t, func(c map[string]any) { c["rms_norm_eps"] = 1e-6 })); edited == got {
		t.Errorf("config.json changed, fingerprint unchanged %s", got)
	}
}

// TestFingerprintWeights: the fingerprint follows the weights' values, not
// only their layout, and not their sharding. stories260K's tensors
// rewritten into two shards with an index give the source's fingerprint;
// the same with one value of one tensor changed (a checkpoint of the same
// training run: same config.json, names, dtypes and shapes) gives another,
// and so does a change of the last byte of another tensor.
func TestFingerprintWeights(t *testing.T) {
	src := shared.Path(t, "stories260K-hf")
	want, ck := fingerprint(t, src)
	names := ck.Names()
	reshard := func(edit func(name string, data []byte)) string {
		dir := t.TempDir()
		cfg, err := os.ReadFile(filepath.Join(src, "config.json"))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "config.json"), cfg, 0o644); err != nil {
			t.Fatal(err)
		}
		shards := [2][]safetensors.WriteTensor{}
		wm := map[string]string{}
		var total int64
		for i, name := range names {
			ti, err := ck.Tensor(name)
			if err != nil {
				t.Fatal(err)
			}
			data := slices.Clone(ti.Data)
			if edit != nil {
				edit(name, data)
			}
			shards[i%2] = append(shards[i%2], safetensors.WriteTensor{Name: name, DType: ti.DType, Shape: ti.Shape, Data: data})
			wm[name] = fmt.Sprintf("model-%05d-of-00002.safetensors", i%2+1)
			total += int64(len(data))
		}
		for k, ts := range shards {
			if err := safetensors.WriteFile(filepath.Join(dir, fmt.Sprintf("model-%05d-of-00002.safetensors", k+1)), ts, nil); err != nil {
				t.Fatal(err)
			}
		}
		if err := safetensors.WriteIndex(filepath.Join(dir, safetensors.IndexFileName), total, wm); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	if got, rck := fingerprint(t, reshard(nil)); got != want || len(rck.Files()) != 2 {
		t.Errorf("resharded into %d files: fingerprint %s, want the source's %s", len(rck.Files()), got, want)
	}
	// Scale the first value of one weight matrix by 1.01 (its dtype as
	// stored: F32 in stories260K).
	target := names[len(names)/2]
	info, _, _ := ck.Info(target)
	if info.DType != safetensors.F32 {
		t.Fatalf("%s is %s; the test edits F32 values", target, info.DType)
	}
	scaled := reshard(func(name string, data []byte) {
		if name == target {
			v := math.Float32frombits(uint32(data[0]) | uint32(data[1])<<8 | uint32(data[2])<<16 | uint32(data[3])<<24)
			u := math.Float32bits(v*1.01 + 1e-3)
			data[0], data[1], data[2], data[3] = byte(u), byte(u>>8), byte(u>>16), byte(u>>24)
		}
	})
	if got, _ := fingerprint(t, scaled); got == want {
		t.Errorf("one value of %s changed, fingerprint unchanged %s", target, got)
	}
	last := names[len(names)-1]
	flipped := reshard(func(name string, data []byte) {
		if name == last {
			data[len(data)-1] ^= 1
		}
	})
	if got, _ := fingerprint(t, flipped); got == want {
		t.Errorf("the last byte of %s changed, fingerprint unchanged %s", last, got)
	}
}

// fingerprint opens the model directory dir and returns its Fingerprint
// and checkpoint (closed at the end of the test).
func fingerprint(t testing.TB, dir string) (string, *safetensors.Checkpoint) {
	t.Helper()
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

// BenchmarkFingerprint: the rate (MB/s of tensor bytes) at which
// Fingerprint hashes a synthetic 64 MiB checkpoint (16 F32 tensors of
// 4 MiB, in the page cache after the first iteration) on GOMAXPROCS
// goroutines.
func BenchmarkFingerprint(b *testing.B) {
	dir := b.TempDir()
	src := shared.Path(b, "stories260K-hf")
	cfg, err := os.ReadFile(filepath.Join(src, "config.json"))
	if err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), cfg, 0o644); err != nil {
		b.Fatal(err)
	}
	var ts []safetensors.WriteTensor
	var total int64
	for i := range 16 {
		v := make([]float32, 1<<20)
		for j := range v {
			v[j] = float32((i*7919+j*104729)%65521) / 65521
		}
		ts = append(ts, safetensors.FromFloat32(fmt.Sprintf("w.%02d", i), []int{1024, 1024}, v))
		total += 4 << 20
	}
	if err := safetensors.WriteFile(filepath.Join(dir, "model.safetensors"), ts, nil); err != nil {
		b.Fatal(err)
	}
	ck, err := safetensors.OpenDir(dir)
	if err != nil {
		b.Fatal(err)
	}
	defer ck.Close()
	n := 0
	for b.Loop() {
		if _, err := Fingerprint(dir, ck); err != nil {
			b.Fatal(err)
		}
		n++
	}
	b.ReportMetric(float64(total)*float64(n)/b.Elapsed().Seconds()/1e6, "MB/s")
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
