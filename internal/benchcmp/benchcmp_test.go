package benchcmp

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/internal/llamacpp"
	"github.com/lmpack/lmpack/internal/shared"
)

// workerEnv makes the test binary lmpack's side (ServeLmpack) instead of
// running the tests, so that the harness starts it as it starts the real
// command's -worker.
const workerEnv = "LMPACK_BENCHCMP_WORKER"

func TestMain(m *testing.M) {
	if os.Getenv(workerEnv) == "1" {
		if err := ServeLmpack(context.Background(), os.Stdin, os.Stdout); err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func selfWorker(t *testing.T) func() *exec.Cmd {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return func() *exec.Cmd {
		c := exec.Command(exe)
		c.Env = append(os.Environ(), workerEnv+"=1")
		return c
	}
}

// runTiny runs the harness on the Tiny model for one pair per row, all
// formats, 1 thread, short runs (64-token prefill, 16-token decode), and
// checks the rows.
func runTiny(t *testing.T, llama *llamacpp.Runner) *Result {
	shared.Path(t, "stories260K-hf", "tokenizer.json")
	shared.Path(t, "tinystories-valid", "calib.txt")
	opt := Options{Config: Tiny, Threads: []int{1}, Reps: 1, Prefill: 64, Decode: 16,
		Work: t.TempDir(), Lmpack: selfWorker(t), Llama: llama}
	res, err := Run(context.Background(), opt)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Variants) != len(Formats) || len(res.Rows) != 2*len(Formats) {
		t.Fatalf("%d variants and %d rows; want %d and %d", len(res.Variants), len(res.Rows), len(Formats), 2*len(Formats))
	}
	var f32Bytes int64
	for _, v := range res.Variants {
		if v.Name == "F32" {
			f32Bytes = v.DirBytes
		}
		// A GGUF of the same weights: F32 about the checkpoint's size,
		// the quantized ones smaller than the F32 one.
		if v.GGUFBytes <= 0 || v.DirBytes <= 0 {
			t.Errorf("%s: file sizes %d (lmpack) and %d (GGUF)", v.Name, v.DirBytes, v.GGUFBytes)
		}
	}
	for _, r := range res.Rows {
		if len(r.Lmpack) != 1 || r.Lmpack[0] <= 0 {
			t.Errorf("%s %s threads %d: lmpack tokens/s %v; want one positive figure", r.Format, r.Phase, r.Threads, r.Lmpack)
		}
		// The lmpack process holds at least the F32 model's weights
		// (the embedding and norms stay float in every variant, the
		// F32 one is loaded whole); the Go runtime alone is well under
		// what a process that read and ran them reaches.
		if r.Format == "F32" && r.LmpackRSS*1024 < f32Bytes {
			t.Errorf("F32 %s: lmpack peak RSS %d KiB under the weights' %d bytes", r.Phase, r.LmpackRSS, f32Bytes)
		}
		if (llama != nil) != (len(r.Llama) == 1) || (llama != nil && (r.Llama[0] <= 0 || r.LlamaRSS <= 0 || len(r.Ratio) != 1)) {
			t.Errorf("%s %s: llama.cpp figures %v, ratio %v, RSS %d with llama.cpp %v", r.Format, r.Phase, r.Llama, r.Ratio, r.LlamaRSS, llama != nil)
		}
	}
	var b bytes.Buffer
	if err := WriteTable(&b, Tiny, res); err != nil {
		t.Fatal(err)
	}
	for _, f := range Formats {
		if !strings.Contains(b.String(), "\n"+f+" ") {
			t.Errorf("table has no row of %s:\n%s", f, b.String())
		}
	}
	t.Logf("\n%s", b.String())
	return res
}

// TestHarnessLmpack runs lmpack's side of the harness (preparation of
// every variant, the worker protocol, the table) without llama.cpp.
func TestHarnessLmpack(t *testing.T) {
	runTiny(t, nil)
}

// TestHarnessLlamaCpp runs both sides (skipped without test/llamacpp
// installed, a failure with LMPACK_REQUIRE_LLAMACPP=1) and checks that
// llama.cpp decodes the same greedy ids from lmpack's F32 export as
// lmpack does from the checkpoint (the two sides run the same weights).
func TestHarnessLlamaCpp(t *testing.T) {
	r := llamacpp.Require(t)
	res := runTiny(t, r)
	if n := res.Agree["F32"]; n < 8 {
		t.Errorf("F32: greedy decode ids agree for the first %d of 16 tokens only; want >= 8", n)
	}
}

// TestPrepareRefusesUnknownFormat: a format name outside Formats is an
// error naming it.
func TestPrepareRefusesUnknownFormat(t *testing.T) {
	shared.Path(t, "stories260K-hf", "tokenizer.json")
	_, err := Prepare(context.Background(), filepath.Join(t.TempDir(), "w"), Tiny, []string{"Q5_K"})
	if err == nil || !strings.Contains(err.Error(), `"Q5_K"`) {
		t.Fatalf("Prepare with Q5_K: %v; want an error naming it", err)
	}
}
