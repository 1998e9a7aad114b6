package hub

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

const tinyID = "lmpack-test/tiny-llama"

// tinyFiles is a small repository: git files, one LFS safetensors file, and
// files lmpack must skip.
func tinyFiles(label string) map[string][]byte {
	return map[string][]byte{
		"config.json":           []byte(`{"model_type":"llama","hidden_size":8,"label":"` + label + `"}`),
		"tokenizer.json":        []byte(`{"version":"1.0","model":{"type":"BPE"}}`),
		"tokenizer_config.json": []byte(`{"bos_token":"<s>"}`),
		"model.safetensors":     fakeSafetensors(1, 100_000), // ~400 KB
		"pytorch_model.bin":     bytes.Repeat([]byte{0xAB}, 5000),
		"README.md":             []byte("# tiny\n"),
		"onnx/model.onnx":       []byte("onnx"),
	}
}

func testOptions(f *fakeHub, cache string) Options {
	return Options{CacheDir: cache, Endpoint: f.srv.URL, Client: f.srv.Client()}
}

// checkLink asserts that snap/name is a symlink "../../blobs/<blob>" whose
// target holds want.
func checkLink(t *testing.T, snap, name, blob string, want []byte) {
	t.Helper()
	p := filepath.Join(snap, name)
	target, err := os.Readlink(p)
	if err != nil {
		t.Fatalf("%s: not a symlink: %v", name, err)
	}
	if wantT := "../../blobs/" + blob; target != wantT {
		t.Errorf("%s -> %q, want %q", name, target, wantT)
	}
	got, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s: content differs from the served file (%d vs %d bytes)", name, len(got), len(want))
	}
}

func TestDownloadBuildsCacheLayout(t *testing.T) {
	f := newFakeHub(t)
	commit := fakeCommit("main-1")
	files := tinyFiles("main")
	f.addCommit(tinyID, commit, files, "main")
	cache := t.TempDir()

	dir, err := Resolve(context.Background(), tinyID, testOptions(f, cache))
	if err != nil {
		t.Fatal(err)
	}
	repo := filepath.Join(cache, "models--lmpack-test--tiny-llama")
	if want := filepath.Join(repo, "snapshots", commit); dir != want {
		t.Fatalf("dir %q, want %q", dir, want)
	}
	ref, err := os.ReadFile(filepath.Join(repo, "refs", "main"))
	if err != nil || string(ref) != commit {
		t.Fatalf("refs/main = %q (%v), want %q", ref, err, commit)
	}
	// Git files are named by their git blob sha1, LFS files by sha256 of content.
	for _, n := range []string{"config.json", "tokenizer.json", "tokenizer_config.json"} {
		checkLink(t, dir, n, gitBlobSHA1(files[n]), files[n])
	}
	checkLink(t, dir, "model.safetensors", sha256Hex(files["model.safetensors"]), files["model.safetensors"])

	// Exactly the needed files are in the snapshot and blobs/.
	ents, _ := os.ReadDir(dir)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if want := []string{"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}; !slices.Equal(names, want) {
		t.Errorf("snapshot holds %v, want %v", names, want)
	}
	blobs, _ := os.ReadDir(filepath.Join(repo, "blobs"))
	if len(blobs) != 4 {
		t.Errorf("blobs/ holds %d entries, want 4", len(blobs))
	}
	// Absent optional files are recorded in .no_exist/<commit>/.
	for _, n := range []string{"generation_config.json", "special_tokens_map.json", "tokenizer.model", "model.safetensors.index.json"} {
		st, err := os.Lstat(filepath.Join(repo, ".no_exist", commit, n))
		if err != nil || !st.Mode().IsRegular() || st.Size() != 0 {
			t.Errorf(".no_exist/%s/%s: want an empty file, got %v %v", commit, n, st, err)
		}
	}
	// Skipped files were never requested.
	for _, req := range f.requests() {
		if strings.Contains(req, "pytorch_model.bin") || strings.Contains(req, "README.md") || strings.Contains(req, "onnx") {
			t.Errorf("requested a file lmpack does not need: %s", req)
		}
	}
	if _, err := os.Stat(filepath.Join(cache, ".locks", "models--lmpack-test--tiny-llama")); err != nil {
		t.Errorf("lock folder: %v", err)
	}

	// Second call: the server is gone, the cache answers.
	f.srv.Close()
	dir2, err := Resolve(context.Background(), tinyID, testOptions(f, cache))
	if err != nil || dir2 != dir {
		t.Fatalf("cached Resolve = %q, %v; want %q", dir2, err, dir)
	}
	opt := testOptions(f, cache)
	opt.Offline = true
	dir3, err := Resolve(context.Background(), tinyID+"@main", opt)
	if err != nil || dir3 != dir {
		t.Fatalf("offline Resolve = %q, %v; want %q", dir3, err, dir)
	}
	// Also by commit hash, offline.
	dir4, err := Resolve(context.Background(), tinyID+"@"+commit, opt)
	if err != nil || dir4 != dir {
		t.Fatalf("offline Resolve by commit = %q, %v; want %q", dir4, err, dir)
	}
}

func TestOfflineEmptyCache(t *testing.T) {
	cache := t.TempDir()
	opt := Options{CacheDir: cache, Endpoint: "http://127.0.0.1:1", Offline: true}
	_, err := Resolve(context.Background(), tinyID, opt)
	if !errors.Is(err, ErrNotCached) {
		t.Fatalf("err = %v, want ErrNotCached", err)
	}
	repo := filepath.Join(cache, "models--lmpack-test--tiny-llama")
	for _, want := range []string{repo, tinyID, "HF_HUB_OFFLINE"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

// TestUnreachableSuggestsOffline: when the Hub cannot be reached (here a
// port nothing listens on) and the cache is empty, the error is
// ErrUnreachable, keeps the transport error and tells the user what to do
// without network: HF_HUB_OFFLINE=1 or a local model directory.
func TestUnreachableSuggestsOffline(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	endpoint := "http://" + l.Addr().String()
	l.Close()
	cache := t.TempDir()
	_, err = Resolve(context.Background(), tinyID, Options{CacheDir: cache, Endpoint: endpoint})
	if !errors.Is(err, ErrUnreachable) {
		t.Fatalf("err = %v, want ErrUnreachable", err)
	}
	var ne net.Error
	if !errors.As(err, &ne) {
		t.Errorf("%v does not keep the transport error", err)
	}
	for _, want := range []string{tinyID, endpoint, "HF_HUB_OFFLINE=1", "local checkpoint directory"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

func TestResumeWithRange(t *testing.T) {
	f := newFakeHub(t)
	commit := fakeCommit("resume")
	files := tinyFiles("resume")
	f.addCommit(tinyID, commit, files, "main")
	cache := t.TempDir()
	st := files["model.safetensors"]
	sha := sha256Hex(st)
	blobs := filepath.Join(cache, "models--lmpack-test--tiny-llama", "blobs")
	if err := os.MkdirAll(blobs, 0o755); err != nil {
		t.Fatal(err)
	}
	const have = 123_457
	if err := os.WriteFile(filepath.Join(blobs, sha+".incomplete"), st[:have], 0o644); err != nil {
		t.Fatal(err)
	}
	dir, err := Resolve(context.Background(), tinyID, testOptions(f, cache))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{fmt.Sprintf("model.safetensors bytes=%d-", have)}; !slices.Equal(f.rangesSeen(), want) {
		t.Errorf("Range headers %v, want %v", f.rangesSeen(), want)
	}
	if got, want := f.servedBytes("model.safetensors"), int64(len(st)-have); got != want {
		t.Errorf("server sent %d bytes of model.safetensors, want %d", got, want)
	}
	checkLink(t, dir, "model.safetensors", sha, st)
	if _, err := os.Stat(filepath.Join(blobs, sha+".incomplete")); !os.IsNotExist(err) {
		t.Errorf(".incomplete still present: %v", err)
	}
}

func TestCorruptPartialIsRedownloaded(t *testing.T) {
	f := newFakeHub(t)
	files := tinyFiles("badpart")
	f.addCommit(tinyID, fakeCommit("badpart"), files, "main")
	cache := t.TempDir()
	st := files["model.safetensors"]
	sha := sha256Hex(st)
	blobs := filepath.Join(cache, "models--lmpack-test--tiny-llama", "blobs")
	os.MkdirAll(blobs, 0o755)
	part := bytes.Clone(st[:5000])
	part[100] ^= 1 // a partial file whose bytes are wrong
	os.WriteFile(filepath.Join(blobs, sha+".incomplete"), part, 0o644)
	dir, err := Resolve(context.Background(), tinyID, testOptions(f, cache))
	if err != nil {
		t.Fatal(err)
	}
	checkLink(t, dir, "model.safetensors", sha, st)
	if want := []string{"model.safetensors bytes=5000-"}; !slices.Equal(f.rangesSeen(), want) {
		t.Errorf("Range headers %v, want %v (one resume, then a full GET)", f.rangesSeen(), want)
	}
	if n := f.getCount("model.safetensors"); n != 2 {
		t.Errorf("%d GETs of the weights, want 2", n)
	}
}

func TestChecksumMismatch(t *testing.T) {
	f := newFakeHub(t)
	commit := fakeCommit("tamper")
	files := tinyFiles("tamper")
	f.addCommit(tinyID, commit, files, "main")
	f.setTamper("model.safetensors", true)
	cache := t.TempDir()
	_, err := Resolve(context.Background(), tinyID, testOptions(f, cache))
	if !errors.Is(err, ErrIntegrity) {
		t.Fatalf("err = %v, want ErrIntegrity", err)
	}
	if !strings.Contains(err.Error(), "model.safetensors") || !strings.Contains(err.Error(), "sha256") {
		t.Errorf("error %q should name the file and the sha256", err)
	}
	repo := filepath.Join(cache, "models--lmpack-test--tiny-llama")
	sha := sha256Hex(files["model.safetensors"])
	for _, p := range []string{
		filepath.Join(repo, "blobs", sha),
		filepath.Join(repo, "blobs", sha+".incomplete"),
		filepath.Join(repo, "snapshots", commit, "model.safetensors"),
		filepath.Join(repo, "refs", "main"),
	} {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("%s exists after a failed verification (%v)", p, err)
		}
	}
	// With honest bytes, a rerun completes.
	f.setTamper("model.safetensors", false)
	dir, err := Resolve(context.Background(), tinyID, testOptions(f, cache))
	if err != nil {
		t.Fatal(err)
	}
	checkLink(t, dir, "model.safetensors", sha, files["model.safetensors"])
}

func TestNotFoundAndGated(t *testing.T) {
	f := newFakeHub(t)
	f.addCommit(tinyID, fakeCommit("x"), tinyFiles("x"), "main")
	_, err := Resolve(context.Background(), "nobody/missing-model", testOptions(f, t.TempDir()))
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "nobody/missing-model") {
		t.Fatalf("err = %v, want ErrNotFound naming the id", err)
	}
	_, err = Resolve(context.Background(), tinyID+"@no-such-branch", testOptions(f, t.TempDir()))
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "no-such-branch") {
		t.Fatalf("err = %v, want ErrNotFound naming the revision", err)
	}

	const gated = "corp/gated-model"
	f.addCommit(gated, fakeCommit("g"), tinyFiles("g"), "main")
	f.setGated(gated, "hf_secret")
	_, err = Resolve(context.Background(), gated, testOptions(f, t.TempDir()))
	if !errors.Is(err, ErrAccess) || !strings.Contains(err.Error(), gated) || !strings.Contains(err.Error(), "gated") {
		t.Fatalf("err = %v, want ErrAccess naming the id and saying gated", err)
	}
	opt := testOptions(f, t.TempDir())
	opt.Token = "hf_secret"
	if _, err := Resolve(context.Background(), gated, opt); err != nil {
		t.Fatalf("with token: %v", err)
	}
	if last := f.lastAuth(); last != "Bearer hf_secret" {
		t.Errorf("Authorization header %q, want Bearer token", last)
	}
}

func TestNoSafetensors(t *testing.T) {
	f := newFakeHub(t)
	f.addCommit("old/bin-only", fakeCommit("bin"), map[string][]byte{
		"config.json":       []byte(`{}`),
		"pytorch_model.bin": []byte("pickle"),
		"model.gguf":        []byte("gguf"),
	}, "main")
	_, err := Resolve(context.Background(), "old/bin-only", testOptions(f, t.TempDir()))
	if !errors.Is(err, ErrNoWeights) {
		t.Fatalf("err = %v, want ErrNoWeights", err)
	}
	for _, want := range []string{"old/bin-only", "pytorch_model.bin", "model.gguf"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	if n := f.getCount("pytorch_model.bin"); n != 0 {
		t.Errorf("pytorch_model.bin downloaded %d times", n)
	}
}

func TestCancelMidDownloadThenResume(t *testing.T) {
	f := newFakeHub(t)
	commit := fakeCommit("cancel")
	files := tinyFiles("cancel")
	f.addCommit(tinyID, commit, files, "main")
	cache := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	repo := filepath.Join(cache, "models--lmpack-test--tiny-llama")
	st := files["model.safetensors"]
	sha := sha256Hex(st)
	inc := filepath.Join(repo, "blobs", sha+".incomplete")
	// Once half the body is sent, wait until the client has stored some of
	// it, then cancel.
	f.setStall("model.safetensors", func() {
		// No time limit (a hang is go test -timeout's to catch).
		for {
			if fi, err := os.Stat(inc); err == nil && fi.Size() > 0 {
				break
			}
			time.Sleep(time.Millisecond)
		}
		cancel()
	})
	_, err := Resolve(ctx, tinyID, testOptions(f, cache))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if _, err := os.Lstat(filepath.Join(repo, "blobs", sha)); !os.IsNotExist(err) {
		t.Fatalf("final blob exists after cancel (%v)", err)
	}
	if _, err := os.Lstat(filepath.Join(repo, "snapshots", commit, "model.safetensors")); !os.IsNotExist(err) {
		t.Fatalf("snapshot link exists after cancel (%v)", err)
	}
	info, err := os.Stat(inc)
	if err != nil {
		t.Fatalf("partial file: %v", err)
	}
	have := info.Size()
	if have == 0 || have > int64(len(st)/2) {
		t.Fatalf("partial file has %d bytes, want 1..%d (what the server sent)", have, len(st)/2)
	}

	f.setStall("model.safetensors", nil)
	dir, err := Resolve(context.Background(), tinyID, testOptions(f, cache))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{fmt.Sprintf("model.safetensors bytes=%d-", have)}; !slices.Equal(f.rangesSeen(), want) {
		t.Errorf("Range headers %v, want %v", f.rangesSeen(), want)
	}
	checkLink(t, dir, "model.safetensors", sha, st)
	t.Logf("cancelled after %d of %d bytes; resumed", have, len(st))
}

func TestLocalDirectoryAndBadModel(t *testing.T) {
	d := t.TempDir()
	got, err := Resolve(context.Background(), d, Options{Offline: true})
	if err != nil || got != d {
		t.Fatalf("Resolve(%q) = %q, %v", d, got, err)
	}
	_, err = Resolve(context.Background(), "./does-not-exist", Options{Offline: true})
	want := `hub: MODEL "./does-not-exist": no such directory and not a Hugging Face id (want org/name)`
	if err == nil || err.Error() != want || !errors.Is(err, ErrNotModelID) {
		t.Fatalf("err = %v, want %q", err, want)
	}
	file := filepath.Join(d, "x.safetensors")
	os.WriteFile(file, nil, 0o644)
	if _, err := Resolve(context.Background(), file, Options{}); err == nil || !strings.Contains(err.Error(), "is a file") {
		t.Fatalf("file MODEL: err = %v", err)
	}
}

func TestRevisionAndSharedBlobs(t *testing.T) {
	f := newFakeHub(t)
	mainC, v1C := fakeCommit("main"), fakeCommit("v1")
	mainFiles, v1Files := tinyFiles("main"), tinyFiles("v1")
	v1Files["model.safetensors"] = mainFiles["model.safetensors"] // unchanged weights
	f.addCommit(tinyID, mainC, mainFiles, "main")
	f.addCommit(tinyID, v1C, v1Files, "v1")
	cache := t.TempDir()
	repo := filepath.Join(cache, "models--lmpack-test--tiny-llama")

	dir, err := Resolve(context.Background(), tinyID+"@v1", testOptions(f, cache))
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(repo, "snapshots", v1C); dir != want {
		t.Fatalf("dir %q, want %q", dir, want)
	}
	if b, _ := os.ReadFile(filepath.Join(repo, "refs", "v1")); string(b) != v1C {
		t.Errorf("refs/v1 = %q, want %q", b, v1C)
	}
	if _, err := os.Stat(filepath.Join(repo, "refs", "main")); !os.IsNotExist(err) {
		t.Errorf("refs/main written for an @v1 request (%v)", err)
	}
	checkLink(t, dir, "config.json", gitBlobSHA1(v1Files["config.json"]), v1Files["config.json"])

	// Options.Revision is used when MODEL has no @revision.
	opt := testOptions(f, cache)
	opt.Revision = "main"
	dirMain, err := Resolve(context.Background(), tinyID, opt)
	if err != nil {
		t.Fatal(err)
	}
	checkLink(t, dirMain, "config.json", gitBlobSHA1(mainFiles["config.json"]), mainFiles["config.json"])
	checkLink(t, dirMain, "model.safetensors", sha256Hex(mainFiles["model.safetensors"]), mainFiles["model.safetensors"])
	if n := f.getCount("model.safetensors"); n != 1 {
		t.Errorf("shared weights downloaded %d times, want 1", n)
	}
}

func TestShardedIndex(t *testing.T) {
	f := newFakeHub(t)
	s1, s2 := fakeSafetensors(11, 3000), fakeSafetensors(12, 2000)
	index := []byte(`{"metadata":{"total_size":20000},"weight_map":{
		"model.embed_tokens.weight":"model-00001-of-00002.safetensors",
		"model.layers.0.mlp.up_proj.weight":"model-00001-of-00002.safetensors",
		"lm_head.weight":"model-00002-of-00002.safetensors"}}`)
	files := map[string][]byte{
		"config.json":                      []byte(`{"model_type":"mistral"}`),
		"generation_config.json":           []byte(`{"do_sample":false}`),
		"special_tokens_map.json":          []byte(`{}`),
		"tokenizer.model":                  []byte("sentencepiece"),
		"model.safetensors.index.json":     index,
		"model-00001-of-00002.safetensors": s1,
		"model-00002-of-00002.safetensors": s2,
		"consolidated.safetensors":         fakeSafetensors(13, 5000),
	}
	commit := fakeCommit("sharded")
	f.addCommit("mistral-test/sharded", commit, files, "main")
	cache := t.TempDir()
	dir, err := Resolve(context.Background(), "mistral-test/sharded", testOptions(f, cache))
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range files {
		if name == "consolidated.safetensors" {
			continue
		}
		blob := gitBlobSHA1(b)
		if isLFSName(name) {
			blob = sha256Hex(b)
		}
		checkLink(t, dir, name, blob, b)
	}
	if n := f.getCount("consolidated.safetensors"); n != 0 {
		t.Errorf("consolidated.safetensors (not in the index) downloaded %d times", n)
	}
	if _, err := os.Lstat(filepath.Join(dir, "consolidated.safetensors")); !os.IsNotExist(err) {
		t.Errorf("consolidated.safetensors linked (%v)", err)
	}
	// tokenizer.json is absent on the Hub: marked, and the cache is complete.
	if _, err := os.Stat(filepath.Join(cache, "models--mistral-test--sharded", ".no_exist", commit, "tokenizer.json")); err != nil {
		t.Errorf("tokenizer.json marker: %v", err)
	}
	f.srv.Close()
	opt := testOptions(f, cache)
	opt.Offline = true
	if d, err := Resolve(context.Background(), "mistral-test/sharded", opt); err != nil || d != dir {
		t.Fatalf("offline: %q, %v", d, err)
	}
	// Losing a shard makes the offline cache unusable, naming the shard.
	os.Remove(filepath.Join(dir, "model-00002-of-00002.safetensors"))
	_, err = Resolve(context.Background(), "mistral-test/sharded", opt)
	if !errors.Is(err, ErrNotCached) || !strings.Contains(err.Error(), "model-00002-of-00002.safetensors") {
		t.Fatalf("err = %v, want ErrNotCached naming the shard", err)
	}
}

// pythonStyleCache builds, by hand, the layout huggingface-cli leaves: refs,
// blobs and snapshot symlinks, no .no_exist markers, extra files.
func pythonStyleCache(t *testing.T, cache, id, commit string, files map[string][]byte) string {
	t.Helper()
	repo := filepath.Join(cache, "models--"+strings.ReplaceAll(id, "/", "--"))
	snap := filepath.Join(repo, "snapshots", commit)
	for _, d := range []string{filepath.Join(repo, "blobs"), filepath.Join(repo, "refs"), snap} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for name, b := range files {
		blob := gitBlobSHA1(b)
		if isLFSName(name) {
			blob = sha256Hex(b)
		}
		if err := os.WriteFile(filepath.Join(repo, "blobs", blob), b, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink("../../blobs/"+blob, filepath.Join(snap, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(repo, "refs", "main"), []byte(commit), 0o644); err != nil {
		t.Fatal(err)
	}
	return snap
}

func TestPythonCacheReused(t *testing.T) {
	cache := t.TempDir()
	commit := fakeCommit("py")
	files := map[string][]byte{
		"config.json":       []byte(`{"model_type":"gpt2"}`),
		"model.safetensors": fakeSafetensors(5, 100),
		"README.md":         []byte("readme"),
	}
	snap := pythonStyleCache(t, cache, "openai-community/gpt2", commit, files)
	var logs bytes.Buffer
	opt := Options{CacheDir: cache, Offline: true, Logger: slog.New(slog.NewTextHandler(&logs, nil))}
	dir, err := Resolve(context.Background(), "openai-community/gpt2", opt)
	if err != nil || dir != snap {
		t.Fatalf("offline = %q, %v; want %q", dir, err, snap)
	}
	if !strings.Contains(logs.String(), "tokenizer.json") {
		t.Errorf("no warning naming the missing optional files: %q", logs.String())
	}
	// Online but the Hub is unreachable: fall back to the usable snapshot.
	opt.Offline = false
	opt.Endpoint = "http://127.0.0.1:1"
	dir, err = Resolve(context.Background(), "openai-community/gpt2", opt)
	if err != nil || dir != snap {
		t.Fatalf("unreachable Hub = %q, %v; want %q", dir, err, snap)
	}
	// Online: the listing completes the snapshot without re-downloading
	// what is there, and records the absent files.
	f := newFakeHub(t)
	f.addCommit("openai-community/gpt2", commit, files, "main")
	opt = testOptions(f, cache)
	if dir, err = Resolve(context.Background(), "openai-community/gpt2", opt); err != nil || dir != snap {
		t.Fatalf("online = %q, %v", dir, err)
	}
	for _, req := range f.requests() {
		if strings.Contains(req, "/resolve/") || strings.Contains(req, "/cdn/") {
			t.Errorf("fetched a file that was cached: %s", req)
		}
	}
	if got := len(f.requests()); got != 1 {
		t.Errorf("%d requests, want 1 (the model info)", got)
	}
	// Now complete: no request at all.
	f.srv.Close()
	if dir, err = Resolve(context.Background(), "openai-community/gpt2", opt); err != nil || dir != snap {
		t.Fatalf("after completion = %q, %v", dir, err)
	}
}

func TestConcurrentResolveDownloadsOnce(t *testing.T) {
	f := newFakeHub(t)
	files := tinyFiles("conc")
	f.addCommit(tinyID, fakeCommit("conc"), files, "main")
	cache := t.TempDir()
	var wg sync.WaitGroup
	dirs := make([]string, 4)
	errs := make([]error, 4)
	for i := range dirs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dirs[i], errs[i] = Resolve(context.Background(), tinyID, testOptions(f, cache))
		}()
	}
	wg.Wait()
	for i := range dirs {
		if errs[i] != nil || dirs[i] != dirs[0] {
			t.Fatalf("call %d: %q, %v", i, dirs[i], errs[i])
		}
	}
	checkLink(t, dirs[0], "model.safetensors", sha256Hex(files["model.safetensors"]), files["model.safetensors"])
	if n := f.getCount("model.safetensors"); n != 1 {
		t.Errorf("weights downloaded %d times by 4 concurrent calls, want 1", n)
	}
}

func TestProgressOutput(t *testing.T) {
	f := newFakeHub(t)
	f.addCommit(tinyID, fakeCommit("prog"), tinyFiles("prog"), "main")

	var bar bytes.Buffer
	opt := testOptions(f, t.TempDir())
	opt.Progress, opt.Terminal = &bar, true
	if _, err := Resolve(context.Background(), tinyID, opt); err != nil {
		t.Fatal(err)
	}
	if s := bar.String(); !strings.Contains(s, "model.safetensors") || !strings.Contains(s, "100%") {
		t.Errorf("terminal output lacks a finished bar for model.safetensors: %q", s)
	}

	old := logInterval
	logInterval = 0
	defer func() { logInterval = old }()
	var logs bytes.Buffer
	opt = testOptions(f, t.TempDir())
	opt.Progress = &logs
	if _, err := Resolve(context.Background(), tinyID, opt); err != nil {
		t.Fatal(err)
	}
	s := logs.String()
	for _, want := range []string{"hub: downloading", "hub: download progress", "hub: downloaded", "file=model.safetensors", "percent=100.0"} {
		if !strings.Contains(s, want) {
			t.Errorf("log output lacks %q:\n%s", want, s)
		}
	}
	if strings.Contains(s, "\r") {
		t.Errorf("log output contains carriage returns (a bar) on a non-terminal")
	}
}

func TestParseID(t *testing.T) {
	good := []struct{ in, id, rev string }{
		{"meta-llama/Llama-3.2-1B", "meta-llama/Llama-3.2-1B", ""},
		{"org/name@v1", "org/name", "v1"},
		{"org/name@refs/pr/1", "org/name", "refs/pr/1"},
		{"a_b/c.d_e", "a_b/c.d_e", ""},
	}
	for _, g := range good {
		id, rev, err := ParseID(g.in)
		if err != nil || id != g.id || rev != g.rev {
			t.Errorf("ParseID(%q) = %q, %q, %v; want %q, %q", g.in, id, rev, err, g.id, g.rev)
		}
	}
	for _, in := range []string{"gpt2", "a/b/c", "/abs/path", "./rel", "org/", "/name", "org/na--me", "org/na..me",
		"-org/name", "org/name.", "org/na me", "org/name@", strings.Repeat("a", 50) + "/" + strings.Repeat("b", 50)} {
		if _, _, err := ParseID(in); !errors.Is(err, ErrNotModelID) {
			t.Errorf("ParseID(%q) err = %v, want ErrNotModelID", in, err)
		}
	}
	if _, err := Resolve(context.Background(), "org/name@../../etc", Options{Offline: true, CacheDir: t.TempDir()}); err == nil || !strings.Contains(err.Error(), "..") {
		t.Errorf("revision with .. accepted: %v", err)
	}
}

func TestOptionsFromEnv(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	for _, k := range []string{"HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME", "HF_ENDPOINT", "HF_TOKEN", "HF_TOKEN_PATH", "HF_HUB_OFFLINE"} {
		t.Setenv(k, "")
	}
	o := OptionsFromEnv()
	if want := filepath.Join(home, ".cache", "huggingface", "hub"); o.CacheDir != want {
		t.Errorf("default cache %q, want %q", o.CacheDir, want)
	}
	if o.Endpoint != DefaultEndpoint || o.Token != "" || o.Offline {
		t.Errorf("defaults: %+v", o)
	}
	t.Setenv("XDG_CACHE_HOME", "/xdg")
	if o := OptionsFromEnv(); o.CacheDir != "/xdg/huggingface/hub" {
		t.Errorf("XDG cache %q", o.CacheDir)
	}
	hfHome := t.TempDir()
	t.Setenv("HF_HOME", hfHome)
	os.WriteFile(filepath.Join(hfHome, "token"), []byte("hf_fromfile\n"), 0o600)
	o = OptionsFromEnv()
	if o.CacheDir != filepath.Join(hfHome, "hub") || o.Token != "hf_fromfile" {
		t.Errorf("HF_HOME: cache %q token %q", o.CacheDir, o.Token)
	}
	t.Setenv("HF_HUB_CACHE", "/direct")
	t.Setenv("HF_ENDPOINT", "https://mirror.example/")
	t.Setenv("HF_TOKEN", "hf_env")
	for v, want := range map[string]bool{"1": true, "true": true, "YES": true, "on": true, "0": false, "false": false, "": false} {
		t.Setenv("HF_HUB_OFFLINE", v)
		if o := OptionsFromEnv(); o.Offline != want {
			t.Errorf("HF_HUB_OFFLINE=%q: Offline %v", v, o.Offline)
		}
	}
	o = OptionsFromEnv()
	if o.CacheDir != "/direct" || o.Endpoint != "https://mirror.example" || o.Token != "hf_env" {
		t.Errorf("overrides: %+v", o)
	}
}
