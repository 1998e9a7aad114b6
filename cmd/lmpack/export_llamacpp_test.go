package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/internal/llamacpp"
	"github.com/lmpack/lmpack/internal/shared"
)

// TestExportGGUFGreedyTextInLlamaCpp: `lmpack export --format gguf
// --gguf-type f32` of stories260K and tiny1m gives a file that llama.cpp
// loads and decodes, from the prompt's text (tokenized by llama.cpp from
// the GGUF's tokenizer metadata), to exactly the text `lmpack run
// --temperature 0` prints for 32 tokens (the F32 export holds the same
// float32 weights; export/gguf_llamacpp_test.go bounds the logits).
func TestExportGGUFGreedyTextInLlamaCpp(t *testing.T) {
	r := llamacpp.Require(t)
	const prompt = "Once upon a time, there was a little girl"
	for _, name := range []string{"stories260K-hf", "tiny1m-hf"} {
		t.Run(name, func(t *testing.T) {
			dir := shared.Path(t, name)
			out := filepath.Join(t.TempDir(), name+".gguf")
			wantOK(t, lmpack(t, nil, "export", dir, "--format", "gguf", "--gguf-type", "f32", "-o", out))
			run := lmpack(t, nil, "run", dir, "--prompt", prompt, "--temperature", "0", "--max-tokens", "32")
			wantOK(t, run)
			res, err := r.Run(context.Background(), out, 128, []llamacpp.Request{{Prompt: prompt, Generate: 32}})
			if err != nil {
				t.Fatal(err)
			}
			got := res.Results[0].Text
			t.Logf("%s: llama.cpp %q", name, got)
			if want := strings.TrimSuffix(run.stdout, "\n"); got != want {
				t.Errorf("%s: greedy text differs\n llama.cpp  %q\n lmpack run %q", name, got, want)
			}
		})
	}
}
