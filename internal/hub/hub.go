package hub

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/term"
)

// DefaultEndpoint is the Hugging Face Hub used when neither Options.Endpoint
// nor $HF_ENDPOINT is set.
const DefaultEndpoint = "https://huggingface.co"

// DefaultRevision is the branch resolved when MODEL has no "@revision" and
// Options.Revision is empty.
const DefaultRevision = "main"

// Sentinel errors. Resolve wraps them with %w, so callers test them with
// errors.Is; the wrapping message names the model id, the file and the cache
// path involved.
var (
	// ErrNotModelID: MODEL is neither an existing directory nor a valid
	// "org/name[@revision]" hub id.
	ErrNotModelID = errors.New("no such directory and not a Hugging Face id (want org/name)")
	// ErrNotCached: offline mode (or the Hub is unreachable) and the cache
	// does not hold a usable snapshot of the model.
	ErrNotCached = errors.New("model is not in the cache")
	// ErrNotFound: the Hub answered 404 (or RepoNotFound / RevisionNotFound /
	// EntryNotFound) for the repository, revision or file.
	ErrNotFound = errors.New("not found on the Hub")
	// ErrAccess: the Hub answered 401 or 403: the repository is gated or
	// private and the token (HF_TOKEN) is missing or lacks access.
	ErrAccess = errors.New("access denied by the Hub")
	// ErrNoWeights: the repository has no *.safetensors weights, no
	// config.json, or an index naming shards it lacks, so lmpack cannot
	// load it.
	ErrNoWeights = errors.New("repository has no loadable safetensors checkpoint")
	// ErrIntegrity: a downloaded blob has the wrong size or sha256; the
	// partial file is deleted and no blob is created.
	ErrIntegrity = errors.New("downloaded file failed verification")
	// ErrProtocol: the Hub answered with something this package cannot use
	// (malformed JSON, missing commit hash or ETag, unsafe file name).
	ErrProtocol = errors.New("unexpected answer from the Hub")
	// ErrUnreachable: the Hub could not be reached at all (no network, DNS
	// failure, connection refused) and the cache holds no usable snapshot;
	// the message suggests HF_HUB_OFFLINE=1 or a local model directory.
	ErrUnreachable = errors.New("the Hub cannot be reached")
)

// Options configures Resolve. The zero value is usable: empty fields take
// the defaults named below (which are NOT read from the environment; use
// OptionsFromEnv for that).
type Options struct {
	// CacheDir is the hub cache root (the folder holding models--org--name).
	// Default: DefaultCacheDir().
	CacheDir string
	// Endpoint is the Hub base URL without trailing slash. Default:
	// DefaultEndpoint.
	Endpoint string
	// Token, when non-empty, is sent as "Authorization: Bearer <Token>" to
	// Endpoint's host (never to the CDN a download is redirected to).
	Token string
	// Revision is the branch, tag or commit hash used when MODEL carries no
	// "@revision". Default: DefaultRevision ("main").
	Revision string
	// Offline forbids all network access: Resolve answers from the cache
	// or fails with ErrNotCached.
	Offline bool
	// Progress receives download progress; nil shows none.
	Progress io.Writer
	// Terminal selects the display on Progress: one progress bar per file
	// when true, otherwise slog lines at coarse intervals (about every
	// 15 s per file, plus one at the start and end of each file).
	Terminal bool
	// Client performs the HTTP requests. Default: a client whose
	// transport waits at most 60 s for response headers; a body may take
	// as long as it needs (cancel the context to stop it).
	Client *http.Client
	// Logger receives events (download start/finish, cache fallbacks).
	// Default: a text handler on Progress, or nothing when Progress is nil.
	Logger *slog.Logger
}

// OptionsFromEnv returns Options read from the environment the way the
// Python huggingface_hub library reads it:
//
//   - CacheDir: $HF_HUB_CACHE, else $HUGGINGFACE_HUB_CACHE (legacy), else
//     $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else
//     ~/.cache/huggingface/hub (see DefaultCacheDir);
//   - Endpoint: $HF_ENDPOINT (trailing "/" removed), else DefaultEndpoint;
//   - Token: $HF_TOKEN, else the contents of the file $HF_TOKEN_PATH, else
//     of $HF_HOME/token (where `huggingface-cli login` stores it);
//   - Offline: $HF_HUB_OFFLINE is one of 1, ON, YES, TRUE (any case).
//
// Revision, Progress, Terminal, Client and Logger are left zero for the
// caller to fill (see IsTerminal).
func OptionsFromEnv() Options {
	ep := strings.TrimRight(os.Getenv("HF_ENDPOINT"), "/")
	if ep == "" {
		ep = DefaultEndpoint
	}
	return Options{
		CacheDir: DefaultCacheDir(),
		Endpoint: ep,
		Token:    tokenFromEnv(),
		Offline:  envTrue(os.Getenv("HF_HUB_OFFLINE")),
	}
}

// DefaultCacheDir returns the hub cache root from the environment:
// $HF_HUB_CACHE, else $HUGGINGFACE_HUB_CACHE, else $HF_HOME/hub, else
// $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub. When the
// home directory is unknown the last form is relative (".cache/...").
func DefaultCacheDir() string {
	if d := os.Getenv("HF_HUB_CACHE"); d != "" {
		return d
	}
	if d := os.Getenv("HUGGINGFACE_HUB_CACHE"); d != "" {
		return d
	}
	return filepath.Join(hfHome(), "hub")
}

// hfHome is $HF_HOME, else $XDG_CACHE_HOME/huggingface, else
// ~/.cache/huggingface.
func hfHome() string {
	if d := os.Getenv("HF_HOME"); d != "" {
		return d
	}
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "huggingface")
	}
	home, err := os.UserHomeDir()
	if err != nil {
		home = ""
	}
	return filepath.Join(home, ".cache", "huggingface")
}

func tokenFromEnv() string {
	if t := strings.TrimSpace(os.Getenv("HF_TOKEN")); t != "" {
		return t
	}
	p := os.Getenv("HF_TOKEN_PATH")
	if p == "" {
		p = filepath.Join(hfHome(), "token")
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

func envTrue(v string) bool {
	switch strings.ToUpper(strings.TrimSpace(v)) {
	case "1", "ON", "YES", "TRUE":
		return true
	}
	return false
}

// IsTerminal reports whether w is an *os.File attached to a terminal, the
// value to pass as Options.Terminal for a given Options.Progress.
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// Resolve returns a local directory holding the checkpoint named by model.
//
// If model names an existing directory it is returned unchanged. Otherwise
// model must be a hub id "org/name" or "org/name@revision" (the "@revision"
// overrides opt.Revision). The id is looked up in the cache at opt.CacheDir:
// when refs/<revision> (or the commit hash itself) leads to a snapshot that
// holds config.json, every safetensors shard and every optional file either
// present or marked absent in .no_exist, that snapshot directory
// (<cache>/models--org--name/snapshots/<commit>) is returned without network
// access. Otherwise, unless opt.Offline, the missing files are downloaded
// from opt.Endpoint and the same snapshot directory is returned.
//
// Errors (all prefixed "hub: " and wrapped with %w): ErrNotModelID for a
// MODEL that is neither a directory nor a hub id; ErrNotCached when offline
// and the cache lacks config.json or weights (the message names the cache
// folder); ErrNotFound / ErrAccess for HTTP 404 / 401-403 (naming the id);
// ErrNoWeights when the repository has no safetensors; ErrUnreachable
// (wrapping the transport error) when the Hub cannot be reached and the
// cache holds no usable snapshot; ErrIntegrity for a
// size or sha256 mismatch; ErrProtocol for a malformed Hub answer;
// ctx.Err() (context.Canceled, context.DeadlineExceeded) when ctx ends
// during a download, leaving the partial .incomplete file for a later
// resume. When the Hub cannot be reached at all but the cache holds
// config.json and complete weights, that snapshot is returned and a warning
// is logged.
func Resolve(ctx context.Context, model string, opt Options) (string, error) {
	if model == "" {
		return "", fmt.Errorf("hub: MODEL %q: %w", model, ErrNotModelID)
	}
	if st, err := os.Stat(model); err == nil {
		if !st.IsDir() {
			return "", fmt.Errorf("hub: MODEL %q: is a file, want a directory holding config.json and *.safetensors", model)
		}
		return model, nil
	}
	id, rev, err := ParseID(model)
	if err != nil {
		return "", err
	}
	if rev == "" {
		rev = opt.Revision
	}
	if rev == "" {
		rev = DefaultRevision
	}
	if err := checkRevision(rev); err != nil {
		return "", fmt.Errorf("hub: MODEL %q: %w", model, err)
	}
	r := newResolver(id, rev, opt)
	return r.resolve(ctx)
}

// ParseID splits a hub reference "org/name" or "org/name@revision" into the
// repository id and the revision ("" when absent). Both parts of the id must
// start and end with a letter, digit or "_", contain only letters, digits,
// "_", "-" and ".", and contain neither "--" nor ".."; the id is at most 96
// bytes (the Hub's own rules). Errors wrap ErrNotModelID.
func ParseID(model string) (id, revision string, err error) {
	bad := func() (string, string, error) {
		return "", "", fmt.Errorf("hub: MODEL %q: %w", model, ErrNotModelID)
	}
	id = model
	if i := strings.IndexByte(model, '@'); i >= 0 {
		id, revision = model[:i], model[i+1:]
		if revision == "" {
			return bad()
		}
	}
	if len(id) > 96 || strings.Contains(id, "--") || strings.Contains(id, "..") {
		return bad()
	}
	parts := strings.Split(id, "/")
	if len(parts) != 2 || !validIDPart(parts[0]) || !validIDPart(parts[1]) {
		return bad()
	}
	return id, revision, nil
}

func validIDPart(s string) bool {
	if s == "" {
		return false
	}
	word := func(c byte) bool {
		return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_'
	}
	if !word(s[0]) || !word(s[len(s)-1]) {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !word(c) && c != '-' && c != '.' {
			return false
		}
	}
	return true
}

// checkRevision rejects revisions that would escape refs/ when used as a
// file path (empty, ".", ".." components, backslashes, NUL, leading "/").
func checkRevision(rev string) error {
	if strings.ContainsAny(rev, "\\\x00") {
		return fmt.Errorf("revision %q: contains a backslash or NUL", rev)
	}
	for _, c := range strings.Split(rev, "/") {
		if c == "" || c == "." || c == ".." {
			return fmt.Errorf("revision %q: empty, \".\" or \"..\" path component", rev)
		}
	}
	return nil
}

func defaultClient() *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.ResponseHeaderTimeout = 60 * time.Second
	return &http.Client{Transport: tr}
}

// isNetworkError reports whether err means the Hub could not be reached
// (a transport failure, as opposed to an HTTP status, a verification
// failure or ctx ending).
func isNetworkError(ctx context.Context, err error) bool {
	if err == nil || ctx.Err() != nil {
		return false
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, io.ErrUnexpectedEOF)
}
