package kernels

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// asmgenFiles are the assembly files internal/asmgen writes.
var asmgenFiles = []string{"qdot8_amd64.s", "qdot8m_amd64.s", "qdot8p_amd64.s", "qdot8act_amd64.s"}

// TestAsmgenUpToDate runs the generator into a temporary directory and
// fails, naming the file and the first differing line, when a committed
// .s file is not exactly what it generates (an edit to the .s file that
// was not made in the generator, or a generator change not regenerated).
func TestAsmgenUpToDate(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH to run internal/asmgen:", err)
	}
	// The generator runs in a child process, whose reads go test's result
	// cache does not see: reading its sources here makes an edit to them
	// invalidate a cached pass.
	srcs, err := filepath.Glob(filepath.Join("internal", "asmgen", "*.go"))
	if err != nil || len(srcs) == 0 {
		t.Fatalf("internal/asmgen sources: %v (%d files)", err, len(srcs))
	}
	for _, src := range srcs {
		if _, err := os.ReadFile(src); err != nil {
			t.Fatal(err)
		}
	}
	dir := t.TempDir()
	cmd := exec.Command(goTool, "run", "./internal/asmgen", "-out", dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go run ./internal/asmgen: %v\n%s", err, out)
	}
	for _, name := range asmgenFiles {
		committed, err := os.ReadFile(name)
		if err != nil {
			t.Fatalf("committed %s: %v", name, err)
		}
		generated, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatalf("generated %s: %v", name, err)
		}
		if line, c, g, differ := firstDiff(committed, generated); differ {
			t.Errorf("%s:%d differs from what internal/asmgen generates (run go generate ./runtime/kernels):\n committed: %q\n generated: %q", name, line, c, g)
		}
	}
}

// firstDiff returns the first line (1-based) at which a and b differ and
// that line of each ("<end of file>" past the last line).
func firstDiff(a, b []byte) (line int, la, lb string, differ bool) {
	if bytes.Equal(a, b) {
		return 0, "", "", false
	}
	as, bs := bytes.SplitAfter(a, []byte("\n")), bytes.SplitAfter(b, []byte("\n"))
	at := func(s [][]byte, i int) string {
		if i < len(s) {
			return string(s[i])
		}
		return "<end of file>"
	}
	for i := 0; ; i++ {
		if x, y := at(as, i), at(bs, i); x != y {
			return i + 1, x, y, true
		}
	}
}

func TestFirstDiff(t *testing.T) {
	for _, c := range []struct {
		a, b   string
		line   int
		differ bool
	}{
		{"x\ny\n", "x\ny\n", 0, false},
		{"x\ny\n", "x\nz\n", 2, true},
		{"x\ny\n", "x\ny", 2, true},   // missing final newline
		{"x\n", "x\ny\n", 2, true},    // generated is longer
		{"a\nb\n", "c\nb\n", 1, true}, // first line
	} {
		line, _, _, differ := firstDiff([]byte(c.a), []byte(c.b))
		if line != c.line || differ != c.differ {
			t.Errorf("firstDiff(%q, %q) = line %d, %v; want %d, %v", c.a, c.b, line, differ, c.line, c.differ)
		}
	}
}
