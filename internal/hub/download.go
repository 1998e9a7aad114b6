package hub

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/lmpack/lmpack/internal/fsx"
)

// maxAPIBytes bounds the JSON answer of the model-info endpoint.
const maxAPIBytes = 64 << 20

// repoInfo is the part of GET /api/models/{id}/revision/{rev} we use.
type repoInfo struct {
	SHA      string `json:"sha"`
	Siblings []struct {
		RFilename string `json:"rfilename"`
	} `json:"siblings"`
}

// download fetches the files lmpack needs for r.id at r.rev into the cache
// and returns the snapshot directory. Files already linked in the snapshot
// are not fetched again; blobs already present (shared with another
// revision) are linked without downloading.
func (r *resolver) download(ctx context.Context) (string, error) {
	info, err := r.fetchInfo(ctx)
	if err != nil {
		return "", err
	}
	commit := info.SHA
	inRepo := map[string]bool{}
	var all, weights []string
	for _, s := range info.Siblings {
		all = append(all, s.RFilename)
		if safeTopLevel(s.RFilename) {
			inRepo[s.RFilename] = true
			if strings.HasSuffix(s.RFilename, ".safetensors") {
				weights = append(weights, s.RFilename)
			}
		}
	}
	sort.Strings(all)
	sort.Strings(weights)
	if !inRepo[configFile] || len(weights) == 0 {
		what := "no *.safetensors weights"
		if !inRepo[configFile] {
			what = "no config.json"
		}
		return "", fmt.Errorf("hub: %s: %w: %s at commit %s (found: %s)", r.ref(), ErrNoWeights, what, commit, summarize(all, 20))
	}

	small := []string{configFile}
	for _, f := range optionalFiles {
		if inRepo[f] {
			small = append(small, f)
		}
	}
	if inRepo[indexFile] {
		small = append(small, indexFile)
	}
	for _, f := range small {
		if err := r.fetchFile(ctx, commit, f); err != nil {
			return "", err
		}
	}
	if inRepo[indexFile] {
		shards, err := readIndexShards(filepath.Join(r.snapshotDir(commit), indexFile))
		if err != nil {
			return "", fmt.Errorf("hub: %s: %w: %w", r.ref(), ErrNoWeights, err)
		}
		for _, s := range shards {
			if !inRepo[s] {
				return "", fmt.Errorf("hub: %s: %w: %s names shard %q, absent at commit %s", r.ref(), ErrNoWeights, indexFile, s, commit)
			}
		}
		weights = shards
	}
	for _, f := range weights {
		if err := r.fetchFile(ctx, commit, f); err != nil {
			return "", err
		}
	}
	// Completion markers: absent optional files, then the ref. A run killed
	// before this point leaves a snapshot that the next run completes.
	for _, f := range append(optionalFiles, indexFile) {
		if !inRepo[f] {
			if err := r.markAbsent(commit, f); err != nil {
				return "", err
			}
		}
	}
	if r.rev != commit {
		if err := r.writeRef(commit); err != nil {
			return "", err
		}
	}
	return r.snapshotDir(commit), nil
}

// summarize joins up to n names, noting how many more there are.
func summarize(names []string, n int) string {
	if len(names) == 0 {
		return "no files"
	}
	if len(names) <= n {
		return strings.Join(names, ", ")
	}
	return strings.Join(names[:n], ", ") + fmt.Sprintf(", ... %d more", len(names)-n)
}

// newRequest builds a request carrying the User-Agent, identity encoding
// (byte counts must match the stored sizes) and, for the Hub's own host,
// the bearer token.
func (r *resolver) newRequest(ctx context.Context, method, u string) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, method, u, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("User-Agent", "lmpack")
	req.Header.Set("Accept-Encoding", "identity")
	if r.opt.Token != "" {
		if ep, err := url.Parse(r.opt.Endpoint); err == nil && ep.Host == req.URL.Host {
			req.Header.Set("Authorization", "Bearer "+r.opt.Token)
		}
	}
	return req, nil
}

// fetchInfo asks the Hub for the revision's commit hash and file list.
func (r *resolver) fetchInfo(ctx context.Context) (*repoInfo, error) {
	u := r.opt.Endpoint + "/api/models/" + r.id + "/revision/" + url.PathEscape(r.rev)
	req, err := r.newRequest(ctx, http.MethodGet, u)
	if err != nil {
		return nil, fmt.Errorf("hub: %s: %w", r.ref(), err)
	}
	req.Header.Set("Accept", "application/json")
	resp, err := r.opt.Client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("hub: %s: GET %s: %w", r.ref(), u, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, r.statusError(resp, "model info")
	}
	var info repoInfo
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxAPIBytes)).Decode(&info); err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("hub: %s: GET %s: %w", r.ref(), u, ctx.Err())
		}
		return nil, fmt.Errorf("hub: %s: GET %s: %w: %w", r.ref(), u, ErrProtocol, err)
	}
	if !isCommitHash(info.SHA) {
		return nil, fmt.Errorf("hub: %s: GET %s: %w: field \"sha\" is %q, want a 40-hex commit hash", r.ref(), u, ErrProtocol, info.SHA)
	}
	return &info, nil
}

// statusError turns a non-success HTTP answer into an error naming the id.
// It reads X-Error-Code / X-Error-Message (set by the Hub) and, failing
// that, the start of the body.
func (r *resolver) statusError(resp *http.Response, what string) error {
	code := resp.Header.Get("X-Error-Code")
	msg := resp.Header.Get("X-Error-Message")
	if msg == "" && resp.Body != nil {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 300))
		msg = strings.TrimSpace(string(b))
	}
	detail := ""
	if msg != "" {
		detail = ": " + msg
	}
	st := resp.StatusCode
	switch {
	case code == "RevisionNotFound":
		return fmt.Errorf("hub: %s: %w: revision %q does not exist (HTTP %d, %s)%s", r.ref(), ErrNotFound, r.rev, st, what, detail)
	case code == "EntryNotFound":
		return fmt.Errorf("hub: %s: %w: file missing (HTTP %d, %s)%s", r.ref(), ErrNotFound, st, what, detail)
	case code == "GatedRepo":
		return fmt.Errorf("hub: %s: %w: the repository is gated (HTTP %d, %s); accept its terms on %s/%s and set HF_TOKEN%s", r.ref(), ErrAccess, st, what, r.opt.Endpoint, r.id, detail)
	case st == http.StatusNotFound || code == "RepoNotFound":
		hint := ""
		if r.opt.Token == "" {
			hint = " (if it is private, set HF_TOKEN)"
		}
		return fmt.Errorf("hub: %s: %w: no model repository %q on %s (HTTP %d, %s)%s%s", r.ref(), ErrNotFound, r.id, r.opt.Endpoint, st, what, hint, detail)
	case st == http.StatusUnauthorized || st == http.StatusForbidden:
		hint := "no token is set: set HF_TOKEN"
		if r.opt.Token != "" {
			hint = "the token in use lacks access"
		}
		return fmt.Errorf("hub: %s: %w: the repository is gated or private (HTTP %d, %s); %s%s", r.ref(), ErrAccess, st, what, hint, detail)
	}
	return fmt.Errorf("hub: %s: %s: HTTP %d%s", r.ref(), what, st, detail)
}

// fileMeta is what a HEAD on the resolve URL tells about one file.
type fileMeta struct {
	etag string // blob name: X-Linked-Etag (LFS sha256) or ETag (git sha1)
	size int64  // X-Linked-Size or Content-Length; -1 when unknown
}

func (r *resolver) resolveURL(commit, name string) string {
	segs := strings.Split(name, "/")
	for i, s := range segs {
		segs[i] = url.PathEscape(s)
	}
	return r.opt.Endpoint + "/" + r.id + "/resolve/" + commit + "/" + strings.Join(segs, "/")
}

// head reads a file's blob name and size from the Hub without following a
// redirect to another host (the CDN's own headers do not name the blob);
// relative redirects (renamed repositories) are followed.
func (r *resolver) head(ctx context.Context, commit, name string) (fileMeta, error) {
	c := *r.opt.Client
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	u := r.resolveURL(commit, name)
	var resp *http.Response
	for hops := 0; ; hops++ {
		req, err := r.newRequest(ctx, http.MethodHead, u)
		if err != nil {
			return fileMeta{}, fmt.Errorf("hub: %s: %s: %w", r.ref(), name, err)
		}
		resp, err = c.Do(req)
		if err != nil {
			return fileMeta{}, fmt.Errorf("hub: %s: %s: HEAD %s: %w", r.ref(), name, u, err)
		}
		resp.Body.Close()
		loc := resp.Header.Get("Location")
		if resp.StatusCode/100 != 3 || loc == "" || hops >= 10 {
			break
		}
		lu, err := url.Parse(loc)
		if err != nil || lu.IsAbs() || lu.Host != "" {
			break
		}
		u = req.URL.ResolveReference(lu).String()
	}
	if resp.StatusCode/100 != 2 && resp.StatusCode/100 != 3 {
		return fileMeta{}, r.statusError(resp, name)
	}
	if hc := resp.Header.Get("X-Repo-Commit"); hc != "" && hc != commit {
		return fileMeta{}, fmt.Errorf("hub: %s: %s: %w: X-Repo-Commit %q, want %q", r.ref(), name, ErrProtocol, hc, commit)
	}
	m := fileMeta{etag: normalizeETag(resp.Header.Get("X-Linked-Etag")), size: -1}
	if m.etag == "" {
		m.etag = normalizeETag(resp.Header.Get("ETag"))
	}
	if !safeBlobName(m.etag) {
		return fileMeta{}, fmt.Errorf("hub: %s: %s: %w: ETag %q cannot name a blob", r.ref(), name, ErrProtocol, m.etag)
	}
	sz := resp.Header.Get("X-Linked-Size")
	if sz == "" {
		sz = resp.Header.Get("Content-Length")
	}
	if n, err := strconv.ParseInt(sz, 10, 64); err == nil && n >= 0 {
		m.size = n
	}
	return m, nil
}

// normalizeETag strips a weak-validator prefix and the quotes.
func normalizeETag(s string) string {
	s = strings.TrimSpace(s)
	s = strings.TrimPrefix(s, "W/")
	return strings.Trim(s, "\"")
}

// isSHA256 reports whether an ETag is an LFS object id (64 hex digits).
func isSHA256(etag string) bool { return len(etag) == 64 && isLowerHex(strings.ToLower(etag)) }

// fetchFile makes snapshots/<commit>/<name> resolve to a verified blob.
func (r *resolver) fetchFile(ctx context.Context, commit, name string) error {
	if isRegular(filepath.Join(r.snapshotDir(commit), filepath.FromSlash(name))) {
		return nil
	}
	m, err := r.head(ctx, commit, name)
	if err != nil {
		return err
	}
	blob := r.blobPath(m.etag)
	if err := os.MkdirAll(filepath.Dir(blob), 0o755); err != nil {
		return fmt.Errorf("hub: %s: %s: %w", r.ref(), name, err)
	}
	unlock, err := lockFile(ctx, filepath.Join(r.lockDir, m.etag+".lock"))
	if err != nil {
		return fmt.Errorf("hub: %s: %s: lock: %w", r.ref(), name, err)
	}
	defer unlock()
	if st, err := os.Stat(blob); err == nil && (m.size < 0 || st.Size() == m.size) {
		r.log.Debug("hub: blob already cached", "model", r.ref(), "file", name, "blob", m.etag)
	} else {
		if err == nil {
			r.log.Warn("hub: cached blob has the wrong size; downloading again", "file", name, "blob", blob, "bytes", st.Size(), "want", m.size)
			if err := os.Remove(blob); err != nil {
				return fmt.Errorf("hub: %s: %s: %w", r.ref(), name, err)
			}
		}
		resumed := exists(blob + ".incomplete")
		err := r.downloadBlob(ctx, r.resolveURL(commit, name), name, m, blob)
		if err != nil && resumed && errors.Is(err, ErrIntegrity) {
			// The partial file from an earlier run may be what was wrong;
			// it is gone now, so try once more from byte 0.
			r.log.Warn("hub: resumed download failed verification; downloading from the start", "file", name, "err", err)
			err = r.downloadBlob(ctx, r.resolveURL(commit, name), name, m, blob)
		}
		if err != nil {
			return err
		}
	}
	return r.linkSnapshot(commit, name, m.etag)
}

// downloadBlob writes the file at u to blob via blob+".incomplete",
// resuming an existing partial file with a Range request, checking the
// size (when known) and the sha256 (when the ETag is one), and renaming
// into place only when both match. On a mismatch the partial file is
// removed; on cancellation or a transport error it is kept for a resume.
func (r *resolver) downloadBlob(ctx context.Context, u, name string, m fileMeta, blob string) (err error) {
	inc := blob + ".incomplete"
	f, err := os.OpenFile(inc, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("hub: %s: %s: %w", r.ref(), name, err)
	}
	defer func() {
		if f != nil {
			f.Close()
		}
	}()
	fail := func(format string, a ...any) error {
		return fmt.Errorf("hub: %s: %s: "+format, append([]any{r.ref(), name}, a...)...)
	}
	st, err := f.Stat()
	if err != nil {
		return fail("%w", err)
	}
	have := st.Size()
	if m.size >= 0 && have > m.size {
		have = 0
	}
	var h hash.Hash
	if isSHA256(m.etag) {
		h = sha256.New()
	}
	restart := func() error {
		have = 0
		if h != nil {
			h.Reset()
		}
		return f.Truncate(0)
	}
	if have == 0 {
		if err := f.Truncate(0); err != nil {
			return fail("%w", err)
		}
	} else if h != nil {
		if _, err := io.Copy(h, io.NewSectionReader(f, 0, have)); err != nil {
			return fail("reading partial download: %w", err)
		}
	}

	if m.size < 0 || have < m.size {
		if err := r.getInto(ctx, u, name, m, f, h, &have, restart); err != nil {
			return err
		}
	}

	if err := f.Sync(); err != nil {
		return fail("%w", err)
	}
	if st, err = f.Stat(); err != nil {
		return fail("%w", err)
	}
	bad := ""
	if m.size >= 0 && st.Size() != m.size {
		bad = fmt.Sprintf("size %d bytes, want %d", st.Size(), m.size)
	} else if h != nil {
		if got := hex.EncodeToString(h.Sum(nil)); got != strings.ToLower(m.etag) {
			bad = fmt.Sprintf("sha256 %s, want %s", got, m.etag)
		}
	}
	cerr := f.Close()
	f = nil
	if bad != "" {
		os.Remove(inc)
		return fail("%w: %s (partial file removed)", ErrIntegrity, bad)
	}
	if cerr != nil {
		return fail("%w", cerr)
	}
	// The .incomplete file is huggingface_hub's resumable partial
	// download (synced above); only its final rename is fsx's.
	if err := fsx.Commit(inc, blob); err != nil {
		return fail("%w", err)
	}
	return nil
}

// getInto GETs u (following redirects) from byte *have on, appending to f
// and h and advancing *have. A server that ignores the Range header, or
// answers 416, makes it start over from byte 0.
func (r *resolver) getInto(ctx context.Context, u, name string, m fileMeta, f *os.File, h hash.Hash, have *int64, restart func() error) error {
	fail := func(format string, a ...any) error {
		return fmt.Errorf("hub: %s: %s: "+format, append([]any{r.ref(), name}, a...)...)
	}
	for attempt := 0; ; attempt++ {
		req, err := r.newRequest(ctx, http.MethodGet, u)
		if err != nil {
			return fail("%w", err)
		}
		if *have > 0 {
			req.Header.Set("Range", fmt.Sprintf("bytes=%d-", *have))
		}
		resp, err := r.opt.Client.Do(req)
		if err != nil {
			if ctx.Err() != nil {
				return fail("download interrupted: %w", ctx.Err())
			}
			return fail("GET %s: %w", u, err)
		}
		switch {
		case resp.StatusCode == http.StatusPartialContent && *have > 0:
			if start, ok := contentRangeStart(resp.Header.Get("Content-Range")); !ok || start != *have {
				resp.Body.Close()
				return fail("%w: asked for bytes from %d, got Content-Range %q", ErrProtocol, *have, resp.Header.Get("Content-Range"))
			}
		case resp.StatusCode == http.StatusOK:
			if *have > 0 {
				r.log.Info("hub: server ignored the Range request; restarting", "file", name)
				if err := restart(); err != nil {
					resp.Body.Close()
					return fail("%w", err)
				}
			}
		case resp.StatusCode == http.StatusRequestedRangeNotSatisfiable && *have > 0 && attempt == 0:
			resp.Body.Close()
			if err := restart(); err != nil {
				return fail("%w", err)
			}
			continue
		default:
			err := r.statusError(resp, name)
			resp.Body.Close()
			return err
		}
		err = r.copyBody(ctx, resp, name, m, f, h, have)
		resp.Body.Close()
		return err
	}
}

// copyBody appends resp's body at offset *have of f, feeding h and the
// progress display.
func (r *resolver) copyBody(ctx context.Context, resp *http.Response, name string, m fileMeta, f *os.File, h hash.Hash, have *int64) error {
	if _, err := f.Seek(*have, io.SeekStart); err != nil {
		return fmt.Errorf("hub: %s: %s: %w", r.ref(), name, err)
	}
	total := m.size
	if total < 0 && resp.ContentLength >= 0 {
		total = *have + resp.ContentLength
	}
	p := r.startProgress(name, total, *have)
	ws := []io.Writer{f, counter{have}, p}
	if h != nil {
		ws = append(ws, h)
	}
	_, err := io.CopyBuffer(io.MultiWriter(ws...), resp.Body, make([]byte, 256<<10))
	p.end(err)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("hub: %s: %s: download interrupted at byte %d: %w", r.ref(), name, *have, ctx.Err())
		}
		return fmt.Errorf("hub: %s: %s: download failed at byte %d (rerun to resume): %w", r.ref(), name, *have, err)
	}
	return nil
}

// counter adds the length of each write to *n.
type counter struct{ n *int64 }

func (c counter) Write(p []byte) (int, error) { *c.n += int64(len(p)); return len(p), nil }

// contentRangeStart parses the first byte of "bytes start-end/total".
func contentRangeStart(s string) (int64, bool) {
	s, ok := strings.CutPrefix(strings.TrimSpace(s), "bytes ")
	if !ok {
		return 0, false
	}
	i := strings.IndexByte(s, '-')
	if i < 0 {
		return 0, false
	}
	n, err := strconv.ParseInt(s[:i], 10, 64)
	return n, err == nil
}
