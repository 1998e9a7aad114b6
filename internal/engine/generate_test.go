package engine

import (
	"context"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/internal/shared"
)

// TestGenerateContinuesPrompt: the streamed text is what Decode of prompt
// and generated ids adds after Decode of the prompt, so the leading space
// of the first generated token is kept after prompt text (the
// SentencePiece decoder of stories260K strips it only at the start of the
// text); with Echo the stream is Decode of everything; an invalid UTF-8
// prompt is refused naming the offset.
func TestGenerateContinuesPrompt(t *testing.T) {
	e, err := Open(context.Background(), shared.Path(t, "stories260K-hf"), Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	const prompt = "Once upon a time,"
	gen := func(echo bool) (string, []int) {
		var b strings.Builder
		st, err := e.Generate(context.Background(), prompt, GenerateOptions{MaxTokens: 12, Echo: echo}, func(s string) error {
			b.WriteString(s)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return b.String(), st.IDs
	}
	got, ids := gen(false)
	pids, err := e.PromptIDs(prompt)
	if err != nil {
		t.Fatal(err)
	}
	pre := e.Tokenizer.Decode(pids, true)
	whole := e.Tokenizer.Decode(append(pids, ids...), true)
	if pre != prompt || !strings.HasPrefix(whole, pre) {
		t.Fatalf("Decode(prompt) %q, Decode(all) %q", pre, whole)
	}
	if got != whole[len(pre):] {
		t.Errorf("streamed %q, want %q (Decode(all) after the prompt)", got, whole[len(pre):])
	}
	if !strings.HasPrefix(got, " ") {
		t.Errorf("streamed %q: the first generated token's space is lost", got)
	}
	if echoed, _ := gen(true); echoed != whole {
		t.Errorf("with Echo streamed %q, want %q", echoed, whole)
	}
	_, err = e.Generate(context.Background(), "ab\xffc", GenerateOptions{MaxTokens: 1}, nil)
	if err == nil || !strings.Contains(err.Error(), "prompt is not valid UTF-8 (first bad byte at offset 2)") {
		t.Errorf("invalid UTF-8 prompt: %v", err)
	}
}
