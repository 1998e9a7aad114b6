//go:build !unix && !windows

package fsx

import "os"

// TryLock does nothing and succeeds: platforms other than Unix and
// Windows (e.g. wasip1) have no file locks, and they run one process.
func TryLock(f *os.File) error { return nil }

// Unlock does nothing (see TryLock).
func Unlock(f *os.File) error { return nil }
