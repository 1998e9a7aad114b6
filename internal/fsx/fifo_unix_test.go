//go:build unix

package fsx

import (
	"syscall"
	"testing"
)

// mkfifo makes a named pipe at path (Unix only; see fifo_other_test.go).
func mkfifo(t *testing.T, path string) {
	t.Helper()
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
}
