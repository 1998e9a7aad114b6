package main

// Hub ids end to end: an httptest server imitates the Hugging Face Hub for
// the repository "tiny/stories260K" holding the real stories260K-hf files,
// and the binary resolves the id through HF_ENDPOINT into a private
// HF_HUB_CACHE, then runs again from the cache with the server gone.

import (
	"bytes"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lmpack/lmpack/formats/tokenizer"
	"github.com/lmpack/lmpack/internal/shared"
)

// fakeHub serves one repository the way huggingface.co does for the
// requests the hub client makes:
//
//	GET      /api/models/{org}/{name}/revision/{rev}  {"id","sha","siblings":[{"rfilename"}]}
//	HEAD/GET /{org}/{name}/resolve/{commit}/{file}    X-Repo-Commit; small files: 200 with
//	                                                  ETag = git blob sha1, Content-Length;
//	                                                  *.safetensors (LFS): 302 to /cdn/{sha256}
//	                                                  with X-Linked-Etag, X-Linked-Size
//	GET      /cdn/{sha256}                            the bytes, with Range support
type fakeHub struct {
	srv    *httptest.Server
	id     string
	commit string
	files  map[string][]byte // repository files, including ones lmpack must not fetch

	mu   sync.Mutex
	reqs []string // "METHOD path" of every request
}

func newFakeHub(t *testing.T, id string, files map[string][]byte) *fakeHub {
	sum := sha1.Sum([]byte("commit of " + id))
	h := &fakeHub{id: id, commit: hex.EncodeToString(sum[:]), files: files}
	h.srv = httptest.NewServer(http.HandlerFunc(h.serve))
	t.Cleanup(h.srv.Close)
	return h
}

func gitBlobSHA1(b []byte) string {
	h := sha1.New()
	fmt.Fprintf(h, "blob %d\x00", len(b))
	h.Write(b)
	return hex.EncodeToString(h.Sum(nil))
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func (h *fakeHub) requests() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.reqs)
}

func (h *fakeHub) serve(w http.ResponseWriter, r *http.Request) {
	h.mu.Lock()
	h.reqs = append(h.reqs, r.Method+" "+r.URL.Path)
	h.mu.Unlock()
	p := r.URL.Path
	switch {
	case p == "/api/models/"+h.id+"/revision/main" || p == "/api/models/"+h.id+"/revision/"+h.commit:
		type sib struct {
			RFilename string `json:"rfilename"`
		}
		out := struct {
			ID       string `json:"id"`
			SHA      string `json:"sha"`
			Siblings []sib  `json:"siblings"`
		}{ID: h.id, SHA: h.commit}
		for n := range h.files {
			out.Siblings = append(out.Siblings, sib{n})
		}
		slices.SortFunc(out.Siblings, func(a, b sib) int { return strings.Compare(a.RFilename, b.RFilename) })
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(out)
	case strings.HasPrefix(p, "/api/models/"):
		w.Header().Set("X-Error-Code", "RepoNotFound")
		http.Error(w, `{"error":"Repository not found"}`, http.StatusNotFound)
	case strings.HasPrefix(p, "/cdn/"):
		for _, b := range h.files {
			if sha256Hex(b) == strings.TrimPrefix(p, "/cdn/") {
				http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(b))
				return
			}
		}
		http.NotFound(w, r)
	case strings.HasPrefix(p, "/"+h.id+"/resolve/"+h.commit+"/"):
		name := strings.TrimPrefix(p, "/"+h.id+"/resolve/"+h.commit+"/")
		b, ok := h.files[name]
		if !ok {
			w.Header().Set("X-Error-Code", "EntryNotFound")
			w.WriteHeader(http.StatusNotFound)
			return
		}
		w.Header().Set("X-Repo-Commit", h.commit)
		if strings.HasSuffix(name, ".safetensors") {
			sha := sha256Hex(b)
			pointer := fmt.Sprintf("version https://git-lfs.github.com/spec/v1\noid sha256:%s\nsize %d\n", sha, len(b))
			w.Header().Set("ETag", `"`+gitBlobSHA1([]byte(pointer))+`"`)
			w.Header().Set("X-Linked-Etag", `"`+sha+`"`)
			w.Header().Set("X-Linked-Size", strconv.Itoa(len(b)))
			w.Header().Set("Location", h.srv.URL+"/cdn/"+sha)
			w.WriteHeader(http.StatusFound)
			return
		}
		w.Header().Set("ETag", `"`+gitBlobSHA1(b)+`"`)
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(b))
	default:
		http.NotFound(w, r)
	}
}

// hubFiles returns the files of the fake repository: stories260K-hf's
// model, config and tokenizer files plus a README.md lmpack has no use for.
func hubFiles(t *testing.T) map[string][]byte {
	t.Helper()
	files := map[string][]byte{"README.md": []byte("# stories260K\n")}
	for _, f := range append([]string{"model.safetensors"}, sideFiles...) {
		b, err := os.ReadFile(shared.Path(t, "stories260K-hf", f))
		if err != nil {
			t.Fatal(err)
		}
		files[f] = b
	}
	return files
}

// hubEnv is isolatedEnv pointed at the fake Hub and the given cache, online.
func hubEnv(t *testing.T, endpoint, cache string, offline bool) []string {
	off := "0"
	if offline {
		off = "1"
	}
	return isolatedEnv(t, "HF_ENDPOINT="+endpoint, "HF_HUB_CACHE="+cache, "HF_HUB_OFFLINE="+off)
}

// greedyPrefix is the text of the first n reference greedy tokens from
// BOS, decoded with the shared tokenizer.json.
func greedyPrefix(t *testing.T, n int) string {
	t.Helper()
	tok, err := tokenizer.Load(shared.Path(t, "stories260K-hf", "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	ref := loadGreedyRef(t)
	s := tok.Decode(ref.GeneratedIDs[:n], true)
	if !strings.HasPrefix(ref.Text, s) || len(s) < n {
		t.Fatalf("decoded prefix %q of the reference ids is not a prefix of its text", s)
	}
	return s
}

func TestHubID(t *testing.T) {
	t.Parallel()
	const id = "tiny/stories260K"
	files := hubFiles(t)
	hub := newFakeHub(t, id, files)
	cache := t.TempDir()
	repo := filepath.Join(cache, "models--tiny--stories260K")
	snap := filepath.Join(repo, "snapshots", hub.commit)
	want20 := greedyPrefix(t, 20) + "\n"

	// First use downloads into the cache.
	r := lmpack(t, hubEnv(t, hub.srv.URL, cache, false), "inspect", id)
	wantOK(t, r)
	for _, s := range []string{"model:         " + snap + "\n", "architecture:  LlamaForCausalLM\n", "parameters:    260032 (0.26M)\n"} {
		if !strings.Contains(r.stdout, s) {
			t.Errorf("inspect %s: output lacks %q:\n%v", id, s, r)
		}
	}
	if !strings.Contains(r.stderr, "hub: downloading") {
		t.Errorf("no download log line on stderr:\n%s", r.stderr)
	}
	reqs := hub.requests()
	for _, want := range []string{
		"GET /api/models/" + id + "/revision/main",
		"HEAD /" + id + "/resolve/" + hub.commit + "/model.safetensors",
		"GET /cdn/" + sha256Hex(files["model.safetensors"]),
		"GET /" + id + "/resolve/" + hub.commit + "/tokenizer.json",
	} {
		if !slices.Contains(reqs, want) {
			t.Errorf("no request %q; requests: %q", want, reqs)
		}
	}
	for _, q := range reqs {
		if strings.Contains(q, "README.md") {
			t.Errorf("fetched a file lmpack does not need: %q", q)
		}
	}

	// Cache layout of huggingface_hub: refs/main, blobs named by ETag,
	// snapshot entries that resolve to the blobs.
	if b, err := os.ReadFile(filepath.Join(repo, "refs", "main")); err != nil || strings.TrimSpace(string(b)) != hub.commit {
		t.Errorf("refs/main = %q, %v; want %s", b, err, hub.commit)
	}
	for name, b := range files {
		p := filepath.Join(snap, name)
		if name == "README.md" {
			if _, err := os.Lstat(p); err == nil {
				t.Errorf("%s was cached", p)
			}
			continue
		}
		blob := gitBlobSHA1(b)
		if strings.HasSuffix(name, ".safetensors") {
			blob = sha256Hex(b)
		}
		target, err := filepath.EvalSymlinks(p)
		if err != nil {
			t.Errorf("%s: %v", p, err)
			continue
		}
		if want := filepath.Join(repo, "blobs", blob); target != want {
			t.Errorf("%s resolves to %s, want %s", p, target, want)
		}
		got, err := os.ReadFile(p)
		if err != nil || !bytes.Equal(got, b) {
			t.Errorf("%s: cached bytes differ from the served file (%d vs %d bytes, %v)", p, len(got), len(b), err)
		}
	}
	if _, err := os.Stat(filepath.Join(repo, ".no_exist", hub.commit, "model.safetensors.index.json")); err != nil {
		t.Errorf("absent index not marked in .no_exist: %v", err)
	}

	// A later run is served from the cache without asking the Hub.
	n := len(hub.requests())
	r = lmpack(t, hubEnv(t, hub.srv.URL, cache, false), "run", id, "--temperature", "0", "--max-tokens", "20")
	wantOK(t, r)
	if r.stdout != want20 {
		t.Errorf("run %s: got %q, want %q", id, r.stdout, want20)
	}
	if extra := hub.requests()[n:]; len(extra) != 0 {
		t.Errorf("cached run made requests: %q", extra)
	}
	local := lmpack(t, nil, "run", modelDir(t), "--temperature", "0", "--max-tokens", "20")
	wantOK(t, local)
	if local.stdout != r.stdout {
		t.Errorf("hub id and local dir differ: %q vs %q", r.stdout, local.stdout)
	}

	// An id the Hub does not know.
	r = lmpack(t, hubEnv(t, hub.srv.URL, cache, false), "inspect", "tiny/nothing")
	wantError(t, r, "hub: tiny/nothing@main", "not found on the Hub", `no model repository "tiny/nothing"`)

	// With the server gone, online and offline runs use the cache.
	endpoint := hub.srv.URL
	hub.srv.Close()
	for _, offline := range []bool{false, true} {
		r = lmpack(t, hubEnv(t, endpoint, cache, offline), "run", id, "--temperature", "0", "--max-tokens", "20")
		wantOK(t, r)
		if r.stdout != want20 {
			t.Errorf("offline=%v: run %s from the cache: got %q, want %q", offline, id, r.stdout, want20)
		}
		r = lmpack(t, hubEnv(t, endpoint, cache, offline), "inspect", id, "--json")
		wantOK(t, r)
		var rep struct {
			Dir    string `json:"dir"`
			Params int64  `json:"params"`
		}
		decodeOneJSON(t, r.stdout, &rep)
		if rep.Dir != snap || rep.Params != 260032 {
			t.Errorf("offline=%v: inspect --json: %+v, want dir %s, 260032 params", offline, rep, snap)
		}
	}

	// Offline, an id that is not cached fails naming the cache; online with
	// the server gone it fails naming the id.
	r = lmpack(t, hubEnv(t, endpoint, cache, true), "run", "tiny/other")
	wantError(t, r, "tiny/other", "model is not in the cache", cache)
	r = lmpack(t, hubEnv(t, endpoint, cache, false), "eval", "tiny/other", "--data", valText(t))
	wantError(t, r, "tiny/other", endpoint)
}

// TestHubLogFormatJSON: with --log-format json, the download log lines of
// a hub id are JSON too, for run and for inspect.
func TestHubLogFormatJSON(t *testing.T) {
	t.Parallel()
	hub := newFakeHub(t, "tiny/stories260K", hubFiles(t))
	want := greedyPrefix(t, 20) + "\n"
	for _, args := range [][]string{
		{"run", "tiny/stories260K", "--temperature", "0", "--max-tokens", "20"},
		{"inspect", "tiny/stories260K"},
	} {
		r := lmpack(t, hubEnv(t, hub.srv.URL, t.TempDir(), false), append([]string{"--log-format", "json"}, args...)...)
		wantOK(t, r)
		if args[0] == "run" && r.stdout != want {
			t.Errorf("got %q, want %q", r.stdout, want)
		}
		lines := jsonLogLines(t, r.stderr)
		if findLog(lines, "hub: downloading") == nil || findLog(lines, "hub: downloaded") == nil {
			t.Errorf("%s: no JSON download log lines in %v", args[0], lines)
		}
		if args[0] == "run" && findLog(lines, "generation done") == nil {
			t.Errorf("no generation log line in %v", lines)
		}
	}
}

// offlineHubCache builds, in a fresh cache directory, the layout
// huggingface-cli leaves for the repository id holding stories260K-hf's
// files (refs/main, blobs, snapshot symlinks) and returns the cache and
// the snapshot directory.
func offlineHubCache(t *testing.T, id string) (cache, snap string) {
	t.Helper()
	cache = t.TempDir()
	sum := sha1.Sum([]byte("commit of " + id))
	commit := hex.EncodeToString(sum[:])
	repo := filepath.Join(cache, "models--"+strings.ReplaceAll(id, "/", "--"))
	snap = filepath.Join(repo, "snapshots", commit)
	for _, d := range []string{filepath.Join(repo, "blobs"), filepath.Join(repo, "refs"), snap} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for name, b := range hubFiles(t) {
		blob := gitBlobSHA1(b)
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
	return cache, snap
}

// TestHubOutputInsideSnapshot: calibrate and quantize kv given a hub id
// refuse an -o inside the cache snapshot the id resolves to (the input),
// as they do for the local directory, and write nothing there.
func TestHubOutputInsideSnapshot(t *testing.T) {
	t.Parallel()
	const id = "tiny/stories260K"
	cache, snap := offlineHubCache(t, id)
	env := hubEnv(t, "http://127.0.0.1:1", cache, true)
	// Outside the snapshot both work from the id.
	calib := filepath.Join(t.TempDir(), "s.calib")
	wantOK(t, lmpack(t, env, "calibrate", id, "--data", valText(t), "--tokens", "64", "--ctx", "32", "-o", calib))
	for _, c := range []struct {
		args []string
		out  string
	}{
		{[]string{"calibrate", id, "--data", valText(t), "--tokens", "64", "--ctx", "32"}, filepath.Join(snap, "x.calib")},
		{[]string{"quantize", "kv", id, "--calib", calib}, filepath.Join(snap, "x.rot")},
	} {
		r := lmpack(t, env, append(c.args, "-o", c.out)...)
		wantError(t, r, c.out, "is the model directory", snap, "inside it")
		if _, err := os.Lstat(c.out); !os.IsNotExist(err) {
			t.Errorf("%s: %s was written into the cache snapshot (%v)", c.args[0], c.out, err)
		}
	}
	// pack resolves a hub id like the other commands, and refuses -o in
	// the snapshot.
	inSnap := filepath.Join(snap, "x.lmpk")
	wantError(t, lmpack(t, env, "pack", id, "-o", inSnap), inSnap, "inside the model directory", snap)
	if _, err := os.Lstat(inSnap); !os.IsNotExist(err) {
		t.Errorf("pack: %s was written into the cache snapshot (%v)", inSnap, err)
	}
	art := filepath.Join(t.TempDir(), "s.lmpk")
	wantOK(t, lmpack(t, env, "pack", id, "-o", art))
	wantOK(t, lmpack(t, env, "verify", art))
}
