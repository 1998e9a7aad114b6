//go:build windows

package fsx

import (
	"errors"
	"math"
	"os"

	"golang.org/x/sys/windows"
)

// TryLock takes an exclusive lock on the whole of f without waiting
// (LockFileEx with LOCKFILE_EXCLUSIVE_LOCK|LOCKFILE_FAIL_IMMEDIATELY);
// flock(2) on Unix. It is released by Unlock or when f is closed.
// Errors: ErrLocked when the lock is held elsewhere, else the system
// error.
func TryLock(f *os.File) error {
	var ol windows.Overlapped
	err := windows.LockFileEx(windows.Handle(f.Fd()), windows.LOCKFILE_EXCLUSIVE_LOCK|windows.LOCKFILE_FAIL_IMMEDIATELY, 0, math.MaxUint32, math.MaxUint32, &ol)
	if errors.Is(err, windows.ERROR_LOCK_VIOLATION) || errors.Is(err, windows.ERROR_IO_PENDING) {
		return ErrLocked
	}
	return err
}

// Unlock releases the lock TryLock took on f.
func Unlock(f *os.File) error {
	var ol windows.Overlapped
	return windows.UnlockFileEx(windows.Handle(f.Fd()), 0, math.MaxUint32, math.MaxUint32, &ol)
}

// holdTemp does nothing on Windows: a temporary file that a writer holds
// open cannot be removed there (see removeIfStale).
func holdTemp(p string) func() { return func() {} }

// removeIfStale removes the temporary p (file or directory, recursively);
// on Windows an open file refuses removal, so a live WriteAtomic's
// temporary survives.
func removeIfStale(p string) { os.RemoveAll(p) }
