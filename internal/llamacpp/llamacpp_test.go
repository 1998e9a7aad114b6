package llamacpp

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRunReportsLoaderError: a file that is not GGUF comes back as an
// error naming the file and llama.cpp's (node-llama-cpp's) reason, not as
// an empty result.
func TestRunReportsLoaderError(t *testing.T) {
	r := Require(t)
	bad := filepath.Join(t.TempDir(), "bad.gguf")
	if err := os.WriteFile(bad, []byte("GGUX this is not a GGUF file at all"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := r.Run(context.Background(), bad, 64, []Request{{Tokens: []int{1, 2}, Score: true}})
	if err == nil {
		t.Fatal("Run accepted a file that is not GGUF")
	}
	for _, want := range []string{bad, "did not load", "GGUF magic"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
	}
}

// TestLogProbs: log of each probability, −Inf for 0.
func TestLogProbs(t *testing.T) {
	got := LogProbs([]float64{1, 0.5, 0})
	if got[0] != 0 || got[1] != -0.6931471805599453 || !(got[2] < -1e308) {
		t.Errorf("LogProbs = %v", got)
	}
}
