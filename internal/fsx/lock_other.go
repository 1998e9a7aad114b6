//go:build !unix && !windows

package fsx

import "os"

// TryLock does nothing and succeeds: platforms other than Unix and
// Windows (e.g. wasip1) have no file locks, and they run one process.
func TryLock(f *os.File) error { return nil }

// Unlock does nothing (see TryLock).
func Unlock(f *os.File) error { return nil }

// holdTemp does nothing: these platforms run one process and have no
// file locks.
func holdTemp(p string) func() { return func() {} }

// removeIfStale removes the temporary p (file or directory, recursively).
func removeIfStale(p string) { os.RemoveAll(p) }
