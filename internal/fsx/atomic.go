package fsx

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
)

// tmpInfix marks the temporary names WriteAtomic and WriteDir create
// beside their target: "." + base + ".tmp-" + random digits.
const tmpInfix = ".tmp-"

// IsTemp reports whether the file name (not a path) is one that
// WriteAtomic or WriteDir use for their temporaries, so that a directory
// left behind by a killed process can be cleaned up.
func IsTemp(name string) bool {
	return strings.HasPrefix(name, ".") && strings.Contains(name, tmpInfix)
}

// TempOf returns the base name of the target whose temporary the file
// name (not a path) is, when it has the exact form WriteAtomic and
// WriteDir give theirs: "." + base + ".tmp-" + decimal digits (the last
// ".tmp-" counts, so ".a.tmp-1.tmp-42" belongs to "a.tmp-1"). ok is false
// for any other name.
func TempOf(name string) (base string, ok bool) {
	i := strings.LastIndex(name, tmpInfix)
	if i < 2 || name[0] != '.' {
		return "", false
	}
	digits := name[i+len(tmpInfix):]
	if digits == "" || strings.Trim(digits, "0123456789") != "" {
		return "", false
	}
	return name[1:i], true
}

// removeStaleTemps removes the temporaries of the target base in dir
// (TempOf) that earlier writers left, a process killed mid-write
// (SIGKILL, a crash, a power cut), so that a rerun does not keep them
// beside its output. A temporary whose writer is still running is kept:
// the writer holds a lock on it (holdTemp, flock(2) on Unix) until its
// rename. Errors are ignored (the write itself reports real trouble).
func removeStaleTemps(dir, base string) {
	es, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range es {
		if b, ok := TempOf(e.Name()); ok && b == base {
			removeIfStale(filepath.Join(dir, e.Name()))
		}
	}
}

// WriteAtomic creates or replaces the file path with the bytes write
// writes: it creates a temporary file beside path (same directory, name
// "."+base+".tmp-*", so the rename cannot cross file systems), calls
// write on it (which may write, seek and WriteAt; it must not close f),
// sets the mode perm, fsyncs and closes it, renames it onto path and
// fsyncs the directory (Commit). Readers see the old file or the new one,
// never a partial one; until the rename an existing path is untouched.
//
// On any error (write's included) and on a panic in write the temporary
// file is removed and path is left as it was. A process killed mid-write
// leaves the temporary (IsTemp names it) and an intact path; the next
// WriteAtomic of path removes it first (and any other temporary of path
// whose writer has died). Two processes writing one path at the same time
// both succeed and the later rename wins: on Unix each holds a flock(2)
// on its temporary until the rename, so neither removes the other's; on
// Windows a temporary file that is open cannot be removed.
//
// Errors: write's error unchanged; os errors from the other steps (they
// name the temporary file or path).
func WriteAtomic(path string, perm fs.FileMode, write func(f *os.File) error) (err error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	removeStaleTemps(dir, base)
	f, err := os.CreateTemp(dir, "."+base+tmpInfix+"*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer holdTemp(tmp)()
	committed := false
	defer func() {
		if !committed {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if err := write(f); err != nil {
		return err
	}
	if err := f.Chmod(perm); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := Commit(tmp, path); err != nil {
		return err
	}
	committed = true
	return nil
}

// WriteBytes is WriteAtomic writing b: it replaces path atomically with
// the bytes b and mode perm. Errors: as WriteAtomic.
func WriteBytes(path string, b []byte, perm fs.FileMode) error {
	return WriteAtomic(path, perm, func(f *os.File) error {
		_, err := f.Write(b)
		return err
	})
}

// WriteDir creates the directory path, which must not exist, with what
// build puts into tmp: it makes a temporary directory beside path
// ("."+base+".tmp-*"), calls build with its name, fsyncs every regular
// file and directory in it (build need not), sets its mode to 0755,
// renames it to path and fsyncs the parent (Commit). path appears
// complete or not at all.
//
// On any error (build's included) and on a panic in build the temporary
// directory is removed with everything in it. A process killed mid-build
// leaves the temporary directory; the next WriteDir of path removes it
// first, with every other temporary of path whose writer has died (on
// Unix a live writer holds a flock(2) on its directory until the rename,
// so two concurrent builds of one path do not remove each other's; the
// second rename then fails because path exists). On Windows two
// concurrent WriteDir of one path are not supported: the second may
// remove parts of the first's temporary directory, which then fails.
//
// Errors: path already exists (checked before build runs; the rename
// also fails when path appears meanwhile and is not an empty directory);
// build's error unchanged; os errors from the other steps.
func WriteDir(path string, build func(tmp string) error) (err error) {
	path = filepath.Clean(path)
	if _, err := os.Lstat(path); err == nil {
		return fmt.Errorf("%s already exists", path)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	removeStaleTemps(filepath.Dir(path), filepath.Base(path))
	tmp, err := os.MkdirTemp(filepath.Dir(path), "."+filepath.Base(path)+tmpInfix+"*")
	if err != nil {
		return err
	}
	defer holdTemp(tmp)()
	committed := false
	defer func() {
		if !committed {
			os.RemoveAll(tmp)
		}
	}()
	if err := build(tmp); err != nil {
		return err
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return err
	}
	if err := syncTree(tmp); err != nil {
		return err
	}
	if err := Commit(tmp, path); err != nil {
		return err
	}
	committed = true
	return nil
}

// syncTree fsyncs every regular file and directory under root, root
// included (directories last, after their entries).
func syncTree(root string) error {
	var dirs []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			dirs = append(dirs, p)
		case d.Type().IsRegular():
			if err := syncFile(p); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := SyncDir(dirs[i]); err != nil {
			return err
		}
	}
	return nil
}

func syncFile(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// Commit renames the finished temporary file or directory tmp (synced by
// the caller, in path's directory) onto path and fsyncs path's directory,
// so that the new name survives a crash. It is the last step of
// WriteAtomic and WriteDir, and is exported for writers that keep their
// own temporary (a resumable download's partial file). Errors: the
// rename's or the directory sync's (after a failed sync the rename has
// happened).
func Commit(tmp, path string) error {
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	return SyncDir(filepath.Dir(path))
}

// SyncDir fsyncs the directory dir so that entries created, renamed or
// removed in it are durable. It does nothing on Windows (directories
// cannot be opened for sync there; NTFS journals renames) and accepts
// file systems that refuse fsync on a directory (EINVAL, ENOTSUP).
// Errors: opening dir, other fsync errors.
func SyncDir(dir string) error {
	if runtime.GOOS == "windows" {
		return nil
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	cerr := d.Close()
	if err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOTSUP) {
		return err
	}
	return cerr
}

// ScratchDir creates a scratch directory beside the file path for a job
// that writes path, named "." + base(path) + "." + kind + ".tmp-" + digits
// (kind, e.g. "experts", keeps it apart from the output's own temporary),
// after removing the ones a killed earlier run of the same job left there
// (those no live process holds a lock on, as WriteAtomic does for its
// temporaries). The returned function removes the directory and drops its
// lock. Errors: os.MkdirTemp's.
func ScratchDir(path, kind string) (string, func(), error) {
	dir, base := filepath.Dir(path), filepath.Base(path)+"."+kind
	removeStaleTemps(dir, base)
	tmp, err := os.MkdirTemp(dir, "."+base+tmpInfix+"*")
	if err != nil {
		return "", nil, err
	}
	release := holdTemp(tmp)
	return tmp, func() { release(); os.RemoveAll(tmp) }, nil
}
