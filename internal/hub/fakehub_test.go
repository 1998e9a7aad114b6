package hub

import (
	"crypto/sha1"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// fakeRepo is one model repository on the fake Hub.
type fakeRepo struct {
	refs  map[string]string            // branch/tag -> commit
	files map[string]map[string][]byte // commit -> file name -> bytes
	gated bool                         // answers 401 GatedRepo without the right token
}

// fakeHub serves the subset of the Hub protocol that Resolve uses:
//
//	GET  /api/models/{org}/{name}/revision/{rev}   JSON {"sha","siblings"}
//	HEAD/GET /{org}/{name}/resolve/{commit}/{file} git files: 200 with ETag = git blob sha1;
//	                                               *.safetensors (LFS): 302 to /cdn/{sha256}
//	                                               with X-Linked-Etag / X-Linked-Size
//	GET  /cdn/{sha256}                             the LFS bytes, honouring "Range: bytes=N-"
//
// and records what it saw.
type fakeHub struct {
	t     *testing.T
	srv   *httptest.Server
	token string

	mu       sync.Mutex
	repos    map[string]*fakeRepo
	lfs      map[string][]byte // sha256 hex -> bytes
	log      []string          // "METHOD path" of every request
	ranges   []string          // Range headers seen on content GETs
	auth     []string          // Authorization headers seen on API calls
	served   map[string]int64  // body bytes served per file name
	gets     map[string]int    // content GETs per file name
	tamper   map[string]bool   // file names served with one byte flipped
	stall    map[string]func() // file name -> called after half the body was sent; then the handler waits for the client to go away
	lfsNames map[string]string // sha256 -> file name, for the counters
}

func newFakeHub(t *testing.T) *fakeHub {
	f := &fakeHub{
		t: t, repos: map[string]*fakeRepo{}, lfs: map[string][]byte{},
		served: map[string]int64{}, gets: map[string]int{}, tamper: map[string]bool{},
		stall: map[string]func(){}, lfsNames: map[string]string{},
	}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

// gitBlobSHA1 is git's object id of a blob: sha1("blob <len>\x00" + data),
// the ETag the Hub gives non-LFS files.
func gitBlobSHA1(data []byte) string {
	h := sha1.New()
	fmt.Fprintf(h, "blob %d\x00", len(data))
	h.Write(data)
	return hex.EncodeToString(h.Sum(nil))
}

func sha256Hex(data []byte) string {
	s := sha256.Sum256(data)
	return hex.EncodeToString(s[:])
}

// fakeCommit derives a 40-hex commit hash from a label.
func fakeCommit(label string) string {
	s := sha1.Sum([]byte("commit " + label))
	return hex.EncodeToString(s[:])
}

// addCommit registers files at a commit of repo id and points refs at it.
func (f *fakeHub) addCommit(id, commit string, files map[string][]byte, refs ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r := f.repos[id]
	if r == nil {
		r = &fakeRepo{refs: map[string]string{}, files: map[string]map[string][]byte{}}
		f.repos[id] = r
	}
	r.files[commit] = files
	for _, ref := range refs {
		r.refs[ref] = commit
	}
	for name, b := range files {
		if isLFSName(name) {
			f.lfs[sha256Hex(b)] = b
			f.lfsNames[sha256Hex(b)] = name
		}
	}
}

func isLFSName(name string) bool { return strings.HasSuffix(name, ".safetensors") }

func (f *fakeHub) serve(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.log = append(f.log, r.Method+" "+r.URL.Path)
	f.mu.Unlock()
	p := r.URL.Path
	switch {
	case strings.HasPrefix(p, "/api/models/"):
		f.serveAPI(w, r, strings.TrimPrefix(p, "/api/models/"))
	case strings.HasPrefix(p, "/cdn/"):
		sha := strings.TrimPrefix(p, "/cdn/")
		f.mu.Lock()
		b, ok := f.lfs[sha]
		name := f.lfsNames[sha]
		f.mu.Unlock()
		if !ok {
			http.Error(w, "no such object", http.StatusNotFound)
			return
		}
		f.serveBytes(w, r, name, b)
	default:
		f.serveResolve(w, r, strings.TrimPrefix(p, "/"))
	}
}

// authorized applies the gated-repo rule.
func (f *fakeHub) authorized(w http.ResponseWriter, r *http.Request, repo *fakeRepo) bool {
	f.mu.Lock()
	gated, token := repo.gated, f.token
	f.mu.Unlock()
	if gated && r.Header.Get("Authorization") != "Bearer "+token {
		w.Header().Set("X-Error-Code", "GatedRepo")
		w.Header().Set("X-Error-Message", "Access to model is restricted.")
		w.WriteHeader(http.StatusUnauthorized)
		return false
	}
	return true
}

func (f *fakeHub) serveAPI(w http.ResponseWriter, r *http.Request, rest string) {
	parts := strings.SplitN(rest, "/", 4) // org, name, "revision", rev
	if len(parts) != 4 || parts[2] != "revision" {
		http.Error(w, "bad api path", http.StatusBadRequest)
		return
	}
	id, rev := parts[0]+"/"+parts[1], parts[3]
	f.mu.Lock()
	f.auth = append(f.auth, r.Header.Get("Authorization"))
	repo := f.repos[id]
	f.mu.Unlock()
	if repo == nil {
		w.Header().Set("X-Error-Code", "RepoNotFound")
		http.Error(w, `{"error":"Repository not found"}`, http.StatusNotFound)
		return
	}
	if !f.authorized(w, r, repo) {
		return
	}
	commit, ok := repo.refs[rev]
	if _, isCommit := repo.files[rev]; isCommit {
		commit, ok = rev, true
	}
	if !ok {
		w.Header().Set("X-Error-Code", "RevisionNotFound")
		http.Error(w, `{"error":"Invalid rev id"}`, http.StatusNotFound)
		return
	}
	var names []string
	for n := range repo.files[commit] {
		names = append(names, n)
	}
	sort.Strings(names)
	type sib struct {
		RFilename string `json:"rfilename"`
	}
	out := struct {
		ID       string `json:"id"`
		SHA      string `json:"sha"`
		Siblings []sib  `json:"siblings"`
	}{ID: id, SHA: commit}
	for _, n := range names {
		out.Siblings = append(out.Siblings, sib{n})
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

func (f *fakeHub) serveResolve(w http.ResponseWriter, r *http.Request, rest string) {
	// {org}/{name}/resolve/{commit}/{file}
	parts := strings.SplitN(rest, "/", 5)
	if len(parts) != 5 || parts[2] != "resolve" {
		http.Error(w, "bad path", http.StatusBadRequest)
		return
	}
	id, commit, name := parts[0]+"/"+parts[1], parts[3], parts[4]
	f.mu.Lock()
	repo := f.repos[id]
	f.mu.Unlock()
	if repo == nil {
		w.Header().Set("X-Error-Code", "RepoNotFound")
		w.WriteHeader(http.StatusNotFound)
		return
	}
	if !f.authorized(w, r, repo) {
		return
	}
	b, ok := repo.files[commit][name]
	if !ok {
		w.Header().Set("X-Error-Code", "EntryNotFound")
		w.WriteHeader(http.StatusNotFound)
		return
	}
	w.Header().Set("X-Repo-Commit", commit)
	if isLFSName(name) {
		sha := sha256Hex(b)
		pointer := fmt.Sprintf("version https://git-lfs.github.com/spec/v1\noid sha256:%s\nsize %d\n", sha, len(b))
		w.Header().Set("ETag", `"`+gitBlobSHA1([]byte(pointer))+`"`)
		w.Header().Set("X-Linked-Etag", `"`+sha+`"`)
		w.Header().Set("X-Linked-Size", strconv.Itoa(len(b)))
		w.Header().Set("Location", f.srv.URL+"/cdn/"+sha)
		w.WriteHeader(http.StatusFound)
		return
	}
	w.Header().Set("ETag", `"`+gitBlobSHA1(b)+`"`)
	if r.Method == http.MethodHead {
		w.Header().Set("Content-Length", strconv.Itoa(len(b)))
		w.WriteHeader(http.StatusOK)
		return
	}
	f.serveBytes(w, r, name, b)
}

// serveBytes answers a content GET, honouring "Range: bytes=N-" and the
// tamper / stall settings for the file name.
func (f *fakeHub) serveBytes(w http.ResponseWriter, r *http.Request, name string, b []byte) {
	f.mu.Lock()
	f.gets[name]++
	rg := r.Header.Get("Range")
	if rg != "" {
		f.ranges = append(f.ranges, name+" "+rg)
	}
	tamper, stall := f.tamper[name], f.stall[name]
	f.mu.Unlock()
	if tamper {
		b = append([]byte(nil), b...)
		b[len(b)/2] ^= 0x40
	}
	start := 0
	if rg != "" {
		n, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(rg, "bytes="), "-"))
		if err != nil || n < 0 || n >= len(b) {
			w.Header().Set("Content-Range", fmt.Sprintf("bytes */%d", len(b)))
			w.WriteHeader(http.StatusRequestedRangeNotSatisfiable)
			return
		}
		start = n
		w.Header().Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", n, len(b)-1, len(b)))
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(b)-start))
	if rg != "" {
		w.WriteHeader(http.StatusPartialContent)
	} else {
		w.WriteHeader(http.StatusOK)
	}
	body := b[start:]
	if stall != nil {
		half := len(body) / 2
		f.addServed(name, half)
		w.Write(body[:half])
		w.(http.Flusher).Flush()
		stall()
		<-r.Context().Done()
		return
	}
	// Counted before writing: the client may finish before Write returns.
	f.addServed(name, len(body))
	w.Write(body)
}

func (f *fakeHub) addServed(name string, n int) {
	f.mu.Lock()
	f.served[name] += int64(n)
	f.mu.Unlock()
}

func (f *fakeHub) servedBytes(name string) int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.served[name]
}

func (f *fakeHub) rangesSeen() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.ranges...)
}

func (f *fakeHub) lastAuth() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.auth) == 0 {
		return ""
	}
	return f.auth[len(f.auth)-1]
}

func (f *fakeHub) setTamper(name string, on bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tamper[name] = on
}

// setStall makes content GETs of name stop after half the body and call
// fn; nil clears it.
func (f *fakeHub) setStall(name string, fn func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if fn == nil {
		delete(f.stall, name)
	} else {
		f.stall[name] = fn
	}
}

// setGated makes repo id answer 401 GatedRepo unless given token.
func (f *fakeHub) setGated(id, token string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.repos[id].gated = true
	f.token = token
}

func (f *fakeHub) getCount(name string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.gets[name]
}

func (f *fakeHub) requests() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.log...)
}

// fakeSafetensors returns a valid safetensors file holding one F32 tensor
// "w" of shape [n] with seeded random values.
func fakeSafetensors(seed uint64, n int) []byte {
	rng := rand.New(rand.NewPCG(seed, 7))
	hdr := fmt.Sprintf(`{"w":{"dtype":"F32","shape":[%d],"data_offsets":[0,%d]}}`, n, 4*n)
	for len(hdr)%8 != 0 {
		hdr += " "
	}
	out := make([]byte, 8, 8+len(hdr)+4*n)
	binary.LittleEndian.PutUint64(out, uint64(len(hdr)))
	out = append(out, hdr...)
	for i := 0; i < n; i++ {
		out = binary.LittleEndian.AppendUint32(out, rng.Uint32())
	}
	return out
}
