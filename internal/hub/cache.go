package hub

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/lmpack/lmpack/internal/fsx"
)

// File names lmpack needs from a repository (top level only).
const (
	configFile = "config.json"
	indexFile  = "model.safetensors.index.json"
)

// optionalFiles are fetched when the repository has them; when it does not,
// an empty marker is written to .no_exist/<commit>/<name> so that later runs
// know the snapshot is complete without asking the Hub.
var optionalFiles = []string{
	"generation_config.json",
	"tokenizer.json",
	"tokenizer_config.json",
	"special_tokens_map.json",
	"tokenizer.model",
}

// resolver holds one Resolve call's id, revision, options with defaults
// filled in, and cache paths.
type resolver struct {
	id, rev string
	opt     Options
	log     *slog.Logger
	repoDir string // <cache>/models--org--name
	lockDir string // <cache>/.locks/models--org--name
}

func newResolver(id, rev string, opt Options) *resolver {
	if opt.CacheDir == "" {
		opt.CacheDir = DefaultCacheDir()
	}
	opt.Endpoint = strings.TrimRight(opt.Endpoint, "/")
	if opt.Endpoint == "" {
		opt.Endpoint = DefaultEndpoint
	}
	if opt.Client == nil {
		opt.Client = defaultClient()
	}
	log := opt.Logger
	if log == nil {
		if opt.Progress != nil {
			log = slog.New(slog.NewTextHandler(opt.Progress, nil))
		} else {
			log = slog.New(slog.DiscardHandler)
		}
	}
	folder := repoFolderName(id)
	return &resolver{
		id:      id,
		rev:     rev,
		opt:     opt,
		log:     log,
		repoDir: filepath.Join(opt.CacheDir, folder),
		lockDir: filepath.Join(opt.CacheDir, ".locks", folder),
	}
}

// repoFolderName is "models--" + id with "/" replaced by "--", the cache
// folder name of a model repository.
func repoFolderName(id string) string {
	return "models--" + strings.ReplaceAll(id, "/", "--")
}

func (r *resolver) ref() string { return r.id + "@" + r.rev }

func (r *resolver) refPath() string {
	return filepath.Join(r.repoDir, "refs", filepath.FromSlash(r.rev))
}

func (r *resolver) snapshotDir(commit string) string {
	return filepath.Join(r.repoDir, "snapshots", commit)
}

func (r *resolver) noExistPath(commit, name string) string {
	return filepath.Join(r.repoDir, ".no_exist", commit, filepath.FromSlash(name))
}

func (r *resolver) blobPath(etag string) string {
	return filepath.Join(r.repoDir, "blobs", etag)
}

// isCommitHash reports whether s is a full git commit hash (40 lowercase
// hex digits).
func isCommitHash(s string) bool { return len(s) == 40 && isLowerHex(s) }

func isLowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return s != ""
}

// cachedCommit returns the commit the revision maps to in the cache: the
// revision itself when it is a commit hash, else the content of
// refs/<revision>; "" when unknown.
func (r *resolver) cachedCommit() string {
	if isCommitHash(r.rev) {
		return r.rev
	}
	b, err := os.ReadFile(r.refPath())
	if err != nil {
		return ""
	}
	c := strings.TrimSpace(string(b))
	if !isCommitHash(c) {
		r.log.Warn("hub: ignoring malformed ref file", "file", r.refPath(), "content", c)
		return ""
	}
	return c
}

// snapState describes a cached snapshot. usable: config.json and all
// weights are present. complete: usable and every optional file is present
// or marked absent. missing lists what keeps it from being complete.
type snapState struct {
	usable, complete bool
	missing          []string
}

// inspect checks snapshots/<commit> against what lmpack needs.
func (r *resolver) inspect(commit string) snapState {
	snap := r.snapshotDir(commit)
	has := func(name string) bool { return isRegular(filepath.Join(snap, filepath.FromSlash(name))) }
	marked := func(name string) bool { return exists(r.noExistPath(commit, name)) }
	var essential, optional []string
	if !has(configFile) {
		essential = append(essential, configFile)
	}
	if has(indexFile) {
		shards, err := readIndexShards(filepath.Join(snap, indexFile))
		if err != nil {
			essential = append(essential, indexFile+" (unreadable: "+err.Error()+")")
		}
		for _, s := range shards {
			if !has(s) {
				essential = append(essential, s)
			}
		}
	} else {
		if len(cachedSafetensors(snap)) == 0 {
			essential = append(essential, "*.safetensors")
		}
		if !marked(indexFile) {
			optional = append(optional, indexFile)
		}
	}
	for _, f := range optionalFiles {
		if !has(f) && !marked(f) {
			optional = append(optional, f)
		}
	}
	st := snapState{usable: len(essential) == 0}
	st.complete = st.usable && len(optional) == 0
	st.missing = append(essential, optional...)
	return st
}

// cachedSafetensors lists the top-level *.safetensors entries of dir that
// resolve to regular files.
func cachedSafetensors(dir string) []string {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".safetensors") && isRegular(filepath.Join(dir, e.Name())) {
			out = append(out, e.Name())
		}
	}
	return out
}

// readIndexShards returns the sorted distinct shard file names of a
// model.safetensors.index.json ({"weight_map": {tensor: file}}). Each must
// be a plain top-level file name ending in .safetensors.
func readIndexShards(file string) ([]string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var idx struct {
		WeightMap map[string]string `json:"weight_map"`
	}
	if err := json.Unmarshal(b, &idx); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Base(file), err)
	}
	if len(idx.WeightMap) == 0 {
		return nil, fmt.Errorf("%s: field \"weight_map\" missing or empty", filepath.Base(file))
	}
	seen := map[string]bool{}
	var out []string
	for tensor, f := range idx.WeightMap {
		if !safeTopLevel(f) || !strings.HasSuffix(f, ".safetensors") {
			return nil, fmt.Errorf("%s: tensor %q: shard %q is not a top-level .safetensors file name", filepath.Base(file), tensor, f)
		}
		if !seen[f] {
			seen[f] = true
			out = append(out, f)
		}
	}
	sort.Strings(out)
	return out, nil
}

// safeTopLevel reports whether name is a plain file name (no directory, no
// "." or "..", no backslash or NUL).
func safeTopLevel(name string) bool {
	return name != "" && name != "." && name != ".." && !strings.ContainsAny(name, "/\\\x00")
}

// safeBlobName reports whether an ETag can name a file in blobs/.
func safeBlobName(s string) bool {
	if s == "" || s == "." || s == ".." || len(s) > 200 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

func isRegular(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

var tmpSeq atomic.Uint64

// tmpName returns a hidden temporary name beside p, unique to this process.
func tmpName(p string) string {
	return filepath.Join(filepath.Dir(p), "."+filepath.Base(p)+".tmp-"+
		strconv.Itoa(os.Getpid())+"-"+strconv.FormatUint(tmpSeq.Add(1), 10))
}

// linkSnapshot points snapshots/<commit>/<name> at blobs/<etag> with a
// relative symlink, replacing any previous entry atomically (a symlink
// made under a temporary name, then renamed).
func (r *resolver) linkSnapshot(commit, name, etag string) error {
	link := filepath.Join(r.snapshotDir(commit), filepath.FromSlash(name))
	if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
		return fmt.Errorf("hub: %s: %s: %w", r.ref(), name, err)
	}
	target, err := filepath.Rel(filepath.Dir(link), r.blobPath(etag))
	if err != nil {
		return fmt.Errorf("hub: %s: %s: %w", r.ref(), name, err)
	}
	tmp := tmpName(link)
	if err := os.Symlink(target, tmp); err != nil {
		return fmt.Errorf("hub: %s: %s: symlink into the cache: %w", r.ref(), name, err)
	}
	if err := fsx.Commit(tmp, link); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("hub: %s: %s: %w", r.ref(), name, err)
	}
	return nil
}

// writeRef stores commit in refs/<revision> (no trailing newline, as
// huggingface_hub writes it) atomically (fsx.WriteBytes).
func (r *resolver) writeRef(commit string) error {
	p := r.refPath()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return fmt.Errorf("hub: %s: ref: %w", r.ref(), err)
	}
	if err := fsx.WriteBytes(p, []byte(commit), 0o644); err != nil {
		return fmt.Errorf("hub: %s: ref: %w", r.ref(), err)
	}
	return nil
}

// markAbsent writes the empty .no_exist/<commit>/<name> marker.
func (r *resolver) markAbsent(commit, name string) error {
	p := r.noExistPath(commit, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return fmt.Errorf("hub: %s: %s: %w", r.ref(), name, err)
	}
	f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("hub: %s: %s: %w", r.ref(), name, err)
	}
	return f.Close()
}

// resolve answers from the cache when it can, else downloads.
func (r *resolver) resolve(ctx context.Context) (string, error) {
	commit := r.cachedCommit()
	var st snapState
	if commit != "" {
		st = r.inspect(commit)
		if st.complete {
			r.log.Debug("hub: using cached snapshot", "model", r.ref(), "dir", r.snapshotDir(commit))
			return r.snapshotDir(commit), nil
		}
	}
	if r.opt.Offline {
		if st.usable {
			r.log.Warn("hub: offline; cached snapshot lacks optional files", "model", r.ref(), "missing", strings.Join(st.missing, ", "))
			return r.snapshotDir(commit), nil
		}
		why := "no refs/" + path.Clean(r.rev) + " entry"
		if commit != "" {
			why = "snapshot " + commit + " lacks " + strings.Join(st.missing, ", ")
		}
		return "", fmt.Errorf("hub: %s: %w (offline mode, e.g. HF_HUB_OFFLINE=1); looked in %s: %s", r.ref(), ErrNotCached, r.repoDir, why)
	}
	dir, err := r.download(ctx)
	if err != nil && st.usable && isNetworkError(ctx, err) {
		r.log.Warn("hub: Hub unreachable; using cached snapshot", "model", r.ref(), "dir", r.snapshotDir(commit), "err", err)
		return r.snapshotDir(commit), nil
	}
	if err != nil && isNetworkError(ctx, err) {
		return "", fmt.Errorf("%w: %w (%s); without network, set HF_HUB_OFFLINE=1 to use a model already in the cache (%s), or give MODEL as a local checkpoint directory",
			err, ErrUnreachable, r.opt.Endpoint, r.opt.CacheDir)
	}
	return dir, err
}

// since returns seconds elapsed, at least 1 ms, for rate computations.
func since(t time.Time) float64 {
	d := time.Since(t).Seconds()
	if d < 1e-3 {
		d = 1e-3
	}
	return d
}
