//go:build unix

package fsx

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// TryLock takes an exclusive advisory lock on the whole of f without
// waiting: flock(2) LOCK_EX|LOCK_NB here, LockFileEx on Windows (there
// the lock is mandatory: other handles cannot write the locked range). It
// is released by Unlock or when f is closed. Errors: ErrLocked when the
// lock is held elsewhere, else the system error.
func TryLock(f *os.File) error {
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EWOULDBLOCK):
			return ErrLocked
		}
		return err
	}
}

// Unlock releases the lock TryLock took on f.
func Unlock(f *os.File) error { return unix.Flock(int(f.Fd()), unix.LOCK_UN) }

// holdTemp opens the temporary file or directory p of a writer
// (WriteAtomic, WriteDir) and takes a flock(2) on it that marks it in use
// until the returned function closes it (after the rename, through a
// descriptor of its own, so closing the writer's file does not drop it).
// When p cannot be opened or locked it returns a no-op: the temporary
// then only looks stale sooner.
func holdTemp(p string) func() {
	f, err := os.Open(p)
	if err != nil {
		return func() {}
	}
	if TryLock(f) != nil {
		f.Close()
		return func() {}
	}
	return func() { f.Close() }
}

// removeIfStale removes the temporary p (file or directory, recursively)
// unless a live writer holds its lock (holdTemp): the process that made
// it has died.
func removeIfStale(p string) {
	f, err := os.Open(p)
	if err != nil {
		return
	}
	defer f.Close()
	if TryLock(f) != nil {
		return
	}
	os.RemoveAll(p)
}
