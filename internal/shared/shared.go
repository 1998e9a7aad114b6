// Package shared locates the project's shared data folder (../shared/data
// beside the repository root) for tests and benchmarks.
//
// Tests never copy these files into the repository; they read them through
// Path, which fails the test with the missing file's name when it is absent
// (a missing file never makes a test pass silently).
package shared

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

// Root returns the absolute path of the shared data folder. It honours
// $LMPACK_SHARED_DATA, else it is ../shared/data relative to the repository
// root (found from this source file's location).
func Root() string {
	if d := os.Getenv("LMPACK_SHARED_DATA"); d != "" {
		return d
	}
	_, file, _, _ := runtime.Caller(0)
	repo := filepath.Dir(filepath.Dir(filepath.Dir(file)))
	return filepath.Join(filepath.Dir(repo), "shared", "data")
}

// Path joins rel onto Root and checks that the file or folder exists. When it
// does not, it calls tb.Fatalf naming the missing path.
func Path(tb testing.TB, rel ...string) string {
	tb.Helper()
	p := filepath.Join(append([]string{Root()}, rel...)...)
	if _, err := os.Stat(p); err != nil {
		tb.Fatalf("shared data file missing: %s (%v); the tests need ../shared/data beside the repository", p, err)
	}
	return p
}
