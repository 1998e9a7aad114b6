package fsx

import (
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// entries lists dir's names, sorted.
func entries(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		out = append(out, e.Name())
	}
	return out
}

func readString(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestWriteAtomic: a new file gets the bytes and the mode; an existing
// one stays intact (and unopened by name) while write runs and is
// replaced after; the temporary lies beside the target under an IsTemp
// name during the write and is gone after.
func TestWriteAtomic(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "out.bin")
	if err := WriteBytes(p, []byte("first"), 0o640); err != nil {
		t.Fatal(err)
	}
	if got := readString(t, p); got != "first" {
		t.Fatalf("content %q, want first", got)
	}
	if st, _ := os.Stat(p); goruntime.GOOS != "windows" && st.Mode().Perm() != 0o640 {
		t.Errorf("mode %v, want 0640", st.Mode().Perm())
	}
	err := WriteAtomic(p, 0o644, func(f *os.File) error {
		if got := readString(t, p); got != "first" {
			t.Errorf("target during the write: %q, want the old content", got)
		}
		if d := filepath.Dir(f.Name()); d != dir {
			t.Errorf("temporary in %s, want beside the target in %s", d, dir)
		}
		if !IsTemp(filepath.Base(f.Name())) || !strings.HasPrefix(filepath.Base(f.Name()), ".out.bin.tmp-") {
			t.Errorf("temporary name %s: want .out.bin.tmp-* (IsTemp)", f.Name())
		}
		if _, err := f.WriteString("second, longer"); err != nil {
			return err
		}
		_, err := f.WriteAt([]byte("S"), 0) // seeking writers are allowed
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := readString(t, p); got != "Second, longer" {
		t.Errorf("replaced content %q", got)
	}
	if got := entries(t, dir); !slices.Equal(got, []string{"out.bin"}) {
		t.Errorf("directory holds %v, want only out.bin", got)
	}
}

// TestWriteAtomicFails: an error or a panic in write, or a target
// directory that does not exist, leaves the old file (or no file) and no
// temporary; write's error comes back unchanged.
func TestWriteAtomicFails(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "out.bin")
	if err := WriteBytes(p, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	err := WriteAtomic(p, 0o644, func(f *os.File) error {
		f.WriteString("partial new content")
		return boom
	})
	if err != boom {
		t.Errorf("err %v, want write's error unchanged", err)
	}
	func() {
		defer func() {
			if r := recover(); r != "panic in write" {
				t.Errorf("recovered %v", r)
			}
		}()
		WriteAtomic(p, 0o644, func(f *os.File) error {
			f.WriteString("partial")
			panic("panic in write")
		})
	}()
	if got := readString(t, p); got != "old" {
		t.Errorf("target after failed writes: %q, want old", got)
	}
	if got := entries(t, dir); !slices.Equal(got, []string{"out.bin"}) {
		t.Errorf("directory holds %v after failed writes, want only out.bin", got)
	}
	fresh := filepath.Join(dir, "fresh")
	if err := WriteAtomic(fresh, 0o644, func(*os.File) error { return boom }); err != boom {
		t.Errorf("err %v", err)
	}
	if _, err := os.Lstat(fresh); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("failed write of a new file left %s: %v", fresh, err)
	}
	if err := WriteBytes(filepath.Join(dir, "missing", "x"), []byte("x"), 0o644); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing directory: err %v, want ErrNotExist", err)
	}
}

// TestWriteAtomicKilled: a process that dies in the middle of a write
// (os.Exit skips every deferred cleanup, as a kill does) leaves the old
// target intact and only an IsTemp-named temporary beside it.
func TestWriteAtomicKilled(t *testing.T) {
	if p := os.Getenv("FSX_KILLED_CHILD"); p != "" {
		WriteAtomic(p, 0o644, func(f *os.File) error {
			f.WriteString("half of the new conte")
			f.Sync()
			os.Exit(7)
			return nil
		})
		os.Exit(0)
	}
	dir := t.TempDir()
	p := filepath.Join(dir, "out.bin")
	if err := WriteBytes(p, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^TestWriteAtomicKilled$")
	cmd.Env = append(os.Environ(), "FSX_KILLED_CHILD="+p)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 7 {
		t.Fatalf("child: %v, want exit 7 in the middle of the write:\n%s", err, out)
	}
	if got := readString(t, p); got != "old" {
		t.Errorf("target after the kill: %q, want old", got)
	}
	got := entries(t, dir)
	if len(got) != 2 || got[1] != "out.bin" || !IsTemp(got[0]) {
		t.Fatalf("directory after the kill: %v, want out.bin and one IsTemp temporary", got)
	}
	stale := got[0]
	// The rerun removes the killed writer's temporary; temporaries of
	// other targets and files that only look alike stay.
	others := []string{".out.bin2.tmp-5", ".other.tmp-77", "out.bin.tmp-6", ".out.bin.tmp-x1", ".out.bin.tmp-1.tmp-9"}
	for _, o := range others {
		if err := os.WriteFile(filepath.Join(dir, o), []byte("keep"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := WriteBytes(p, []byte("new"), 0o644); err != nil {
		t.Fatal(err)
	}
	want := append(slices.Clone(others), "out.bin")
	slices.Sort(want)
	if got := entries(t, dir); !slices.Equal(got, want) || readString(t, p) != "new" {
		t.Errorf("directory after the rerun: %v (out.bin %q), want %v and out.bin = new (the killed writer's %s removed)", got, readString(t, p), want, stale)
	}
}

// TestWriteDirKilled: a process that dies in the middle of WriteDir
// (os.Exit, as a SIGKILL: no cleanup runs) leaves its temporary directory
// with a partial file; a rerun of WriteDir on the same path removes it,
// and the path appears with the rerun's files only.
func TestWriteDirKilled(t *testing.T) {
	if p := os.Getenv("FSX_KILLED_DIR_CHILD"); p != "" {
		WriteDir(p, func(tmp string) error {
			os.WriteFile(filepath.Join(tmp, "model.safetensors"), []byte("half of the weig"), 0o644)
			os.Exit(7)
			return nil
		})
		os.Exit(0)
	}
	parent := t.TempDir()
	p := filepath.Join(parent, "qq")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^TestWriteDirKilled$")
	cmd.Env = append(os.Environ(), "FSX_KILLED_DIR_CHILD="+p)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 7 {
		t.Fatalf("child: %v, want exit 7 in the middle of the build:\n%s", err, out)
	}
	got := entries(t, parent)
	if len(got) != 1 || !strings.HasPrefix(got[0], ".qq.tmp-") {
		t.Fatalf("parent after the kill: %v, want one .qq.tmp-* temporary", got)
	}
	stale := got[0]
	if err := WriteDir(p, func(tmp string) error {
		return os.WriteFile(filepath.Join(tmp, "config.json"), []byte("{}"), 0o644)
	}); err != nil {
		t.Fatal(err)
	}
	if got := entries(t, parent); !slices.Equal(got, []string{"qq"}) {
		t.Errorf("parent after the rerun: %v, want only qq (the killed build's %s kept)", got, stale)
	}
	if got := entries(t, p); !slices.Equal(got, []string{"config.json"}) {
		t.Errorf("qq holds %v, want only the rerun's config.json", got)
	}
}

// TestLiveTempKept: a temporary whose writer is still running (it holds
// the lock holdTemp takes) is not removed by another WriteAtomic or
// WriteDir of the same path; once the writer is gone it is.
func TestLiveTempKept(t *testing.T) {
	if goruntime.GOOS == "windows" || goruntime.GOOS == "wasip1" || goruntime.GOOS == "js" {
		t.Skip("temporaries are marked live by flock(2) on Unix only")
	}
	dir := t.TempDir()
	p := filepath.Join(dir, "out.bin")
	tmpFile := filepath.Join(dir, ".out.bin.tmp-4242")
	if err := os.WriteFile(tmpFile, []byte("in progress"), 0o644); err != nil {
		t.Fatal(err)
	}
	release := holdTemp(tmpFile)
	if err := WriteBytes(p, []byte("a"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := entries(t, dir); !slices.Equal(got, []string{".out.bin.tmp-4242", "out.bin"}) {
		t.Errorf("with a live writer: %v, want its temporary kept", got)
	}
	d := filepath.Join(dir, "m")
	tmpDir := filepath.Join(dir, ".m.tmp-17")
	if err := os.Mkdir(tmpDir, 0o755); err != nil {
		t.Fatal(err)
	}
	releaseDir := holdTemp(tmpDir)
	if err := WriteDir(d, func(string) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(tmpDir); err != nil {
		t.Errorf("live writer's temporary directory removed: %v", err)
	}
	release()
	releaseDir()
	if err := WriteBytes(p, []byte("b"), 0o644); err != nil {
		t.Fatal(err)
	}
	os.RemoveAll(d)
	if err := WriteDir(d, func(string) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if got := entries(t, dir); !slices.Equal(got, []string{"m", "out.bin"}) {
		t.Errorf("after the writers ended: %v, want their temporaries removed", got)
	}
}

// TestTempOf: the target of the names WriteAtomic and WriteDir make, and
// nothing else.
func TestTempOf(t *testing.T) {
	for name, want := range map[string]string{
		".out.lmpk.tmp-123": "out.lmpk", ".a.tmp-1.tmp-42": "a.tmp-1", ".quantize-weights-0a1b.tmp-9": "quantize-weights-0a1b",
		".out.lmpk.tmp-": "", ".out.lmpk.tmp-12x": "", "out.lmpk.tmp-1": "", "..tmp-1": "", ".hidden": "", "": "",
	} {
		got, ok := TempOf(name)
		if got != want || ok != (want != "") {
			t.Errorf("TempOf(%q) = %q, %v; want %q, %v", name, got, ok, want, want != "")
		}
	}
}

// TestWriteDir: the directory appears with what build wrote (mode 0755,
// nested files included), built in an IsTemp directory beside it; an
// existing path is refused before build runs; a failed or panicking build
// leaves neither path nor temporary.
func TestWriteDir(t *testing.T) {
	parent := t.TempDir()
	out := filepath.Join(parent, "model")
	err := WriteDir(out, func(tmp string) error {
		if filepath.Dir(tmp) != parent || !IsTemp(filepath.Base(tmp)) || !strings.HasPrefix(filepath.Base(tmp), ".model.tmp-") {
			t.Errorf("temporary directory %s: want %s/.model.tmp-*", tmp, parent)
		}
		if _, err := os.Lstat(out); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s visible before build finished: %v", out, err)
		}
		if err := os.WriteFile(filepath.Join(tmp, "config.json"), []byte("{}"), 0o644); err != nil {
			return err
		}
		if err := os.Mkdir(filepath.Join(tmp, "sub"), 0o755); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(tmp, "sub", "a.txt"), []byte("a"), 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	if readString(t, filepath.Join(out, "config.json")) != "{}" || readString(t, filepath.Join(out, "sub", "a.txt")) != "a" {
		t.Errorf("built files missing or wrong")
	}
	if st, _ := os.Stat(out); goruntime.GOOS != "windows" && st.Mode().Perm() != 0o755 {
		t.Errorf("mode %v, want 0755", st.Mode().Perm())
	}
	if got := entries(t, parent); !slices.Equal(got, []string{"model"}) {
		t.Errorf("parent holds %v, want only model", got)
	}

	called := false
	if err := WriteDir(out, func(string) error { called = true; return nil }); err == nil || !strings.Contains(err.Error(), "already exists") || called {
		t.Errorf("existing path: err %v, build called %v; want an error before build", err, called)
	}
	if readString(t, filepath.Join(out, "config.json")) != "{}" {
		t.Errorf("existing directory changed")
	}

	boom := errors.New("boom")
	failed := filepath.Join(parent, "failed")
	if err := WriteDir(failed, func(tmp string) error {
		os.WriteFile(filepath.Join(tmp, "half.safetensors"), []byte("xx"), 0o644)
		return boom
	}); err != boom {
		t.Errorf("err %v, want build's error unchanged", err)
	}
	func() {
		defer func() { recover() }()
		WriteDir(failed, func(tmp string) error {
			os.WriteFile(filepath.Join(tmp, "half"), []byte("xx"), 0o644)
			panic("panic in build")
		})
	}()
	if got := entries(t, parent); !slices.Equal(got, []string{"model"}) {
		t.Errorf("parent holds %v after failed builds, want only model", got)
	}
}

// TestIsTemp: the names WriteAtomic and WriteDir make, and nothing a user
// would name an output.
func TestIsTemp(t *testing.T) {
	for name, want := range map[string]bool{
		".out.lmpk.tmp-123": true, ".calibrate-0a1b.tmp-99": true,
		"out.lmpk": false, "model.tmp-1": false, ".hidden": false, "": false,
	} {
		if got := IsTemp(name); got != want {
			t.Errorf("IsTemp(%q) = %v, want %v", name, got, want)
		}
	}
}

// TestOneAtomicWriter parses every non-test Go file of the module and
// fails where os.Rename or os.CreateTemp is used outside internal/fsx:
// files and directories are replaced only through WriteAtomic, WriteDir
// and Commit, which fsync the data and the directory.
func TestOneAtomicWriter(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root: %v", err)
	}
	banned := map[string]bool{"Rename": true, "CreateTemp": true}
	fset := token.NewFileSet()
	files := 0
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if d.IsDir() {
			base := d.Name()
			if rel == filepath.Join("internal", "fsx") || (rel != "." && (strings.HasPrefix(base, ".") || base == "testdata" || base == "vendor")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		files++
		osName := ""
		for _, im := range f.Imports {
			if path, _ := strconv.Unquote(im.Path.Value); path == "os" {
				osName = "os"
				if im.Name != nil {
					osName = im.Name.Name
				}
			}
		}
		if osName == "" {
			return nil
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if sel, ok := n.(*ast.SelectorExpr); ok {
				if x, ok := sel.X.(*ast.Ident); ok && x.Name == osName && banned[sel.Sel.Name] {
					t.Errorf("%s: os.%s outside internal/fsx: use fsx.WriteAtomic, fsx.WriteDir or fsx.Commit", fset.Position(sel.Pos()), sel.Sel.Name)
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 50 {
		t.Fatalf("parsed %d files under %s; want the whole module", files, root)
	}
}

// TestScratchDirKilled: a process killed while it holds a ScratchDir
// (os.Exit: no cleanup runs) leaves the directory behind; the next
// ScratchDir for the same path and kind removes it, keeps a live one's
// and other kinds', and its own cleanup removes what it made.
func TestScratchDirKilled(t *testing.T) {
	if p := os.Getenv("FSX_SCRATCH_CHILD"); p != "" {
		tmp, _, err := ScratchDir(p, "experts")
		if err == nil {
			os.WriteFile(filepath.Join(tmp, "pass-0.safetensors"), []byte("partial"), 0o644)
		}
		os.Exit(7)
	}
	dir := t.TempDir()
	p := filepath.Join(dir, "c.st")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^TestScratchDirKilled$")
	cmd.Env = append(os.Environ(), "FSX_SCRATCH_CHILD="+p)
	if out, err := cmd.CombinedOutput(); err == nil {
		t.Fatalf("child exited 0, want 7:\n%s", out)
	}
	got := entries(t, dir)
	if len(got) != 1 || !strings.HasPrefix(got[0], ".c.st.experts.tmp-") {
		t.Fatalf("after the kill: %v, want one .c.st.experts.tmp-* directory", got)
	}
	stale := got[0]
	live, doneLive, err := ScratchDir(filepath.Join(dir, "c.st"), "experts")
	if err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(dir, ".c.st.other.tmp-5")
	if err := os.Mkdir(other, 0o755); err != nil {
		t.Fatal(err)
	}
	// A second job on the same output while the first still runs keeps
	// the first's directory.
	second, doneSecond, err := ScratchDir(p, "experts")
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{live, second, other} {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("%s: %v, want it kept", d, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, stale)); !os.IsNotExist(err) {
		t.Errorf("the killed run's %s: %v, want it removed", stale, err)
	}
	doneLive()
	doneSecond()
	if got := entries(t, dir); len(got) != 1 || got[0] != ".c.st.other.tmp-5" {
		t.Errorf("after both cleanups: %v, want only the other kind's directory", got)
	}
}
