package engine

import (
	"context"
	"github.com/lmpack/lmpack/runtime"
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

// eosAfter makes the wrapped model's logits pick token eos from its
// after-th Forward call on (a story that ends).
type eosAfter struct {
	runtime.Model
	eos, after, calls int
}

func (m *eosAfter) Forward(ctx context.Context, toks []int, c runtime.KVCache, logits []float32, all bool) error {
	if err := m.Model.Forward(ctx, toks, c, logits, all); err != nil {
		return err
	}
	if m.calls++; m.calls >= m.after {
		logits[len(logits)-m.Model.Description().VocabSize+m.eos] = 1e9
	}
	return nil
}

// TestGenerateContextLimited: with MaxTokens beyond the context,
// generation runs to the context (ContextLimited, context − prompt
// tokens) unless an end-of-sequence token comes first: with StopAtEOS,
// an EOS at the 6th step is not a stop at the context (it was reported as
// one).
func TestGenerateContextLimited(t *testing.T) {
	e, err := Open(context.Background(), shared.Path(t, "stories260K-hf"), Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	const prompt = "Once upon a time,"
	pids, err := e.PromptIDs(prompt)
	if err != nil {
		t.Fatal(err)
	}
	room := e.Desc.MaxPositionEmbeddings - len(pids)
	st, err := e.Generate(context.Background(), prompt, GenerateOptions{MaxTokens: 100000}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !st.ContextLimited || st.GeneratedTokens != room {
		t.Errorf("without EOS: %d tokens, ContextLimited %v; want %d (the context) and true", st.GeneratedTokens, st.ContextLimited, room)
	}
	eos, ok := e.Tokenizer.EOS()
	if !ok {
		t.Fatal("stories260K's tokenizer names no EOS token")
	}
	e.Model = &eosAfter{Model: e.Model, eos: eos, after: 6}
	st, err = e.Generate(context.Background(), prompt, GenerateOptions{MaxTokens: 100000, StopAtEOS: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if st.GeneratedTokens != 5 || st.ContextLimited {
		t.Errorf("EOS at step 6: %d tokens, ContextLimited %v; want 5 and false", st.GeneratedTokens, st.ContextLimited)
	}
}
