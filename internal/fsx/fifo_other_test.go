//go:build !unix

package fsx

import "testing"

// mkfifo skips the test: named pipes in the file system (mkfifo) exist
// only on Unix.
func mkfifo(t *testing.T, path string) {
	t.Helper()
	t.Skip("mkfifo: no named pipes in the file system on this OS")
}
