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
