package eval

import (
	"context"
	"fmt"

	"github.com/lmpack/lmpack/runtime"
)

// TeacherForce runs each window wins[i] through its empty cache caches[i]
// as generation feeds a model (docs/METHODS.md §10, decode-faithful
// protocol): first the prompt tokens wins[i][:prompt] in one Forward call
// (full precision among themselves, as a served prefill), then the
// remaining tokens chunk at a time (1: one token per call, as decode), each
// call reading the earlier calls' tokens from the cache in its storage
// format. All windows advance together: every step is one
// runtime.ForwardBatch call with one Seq per window that still has tokens,
// so a batched backend reads the weights once per step for all windows.
// logits[i] receives [len(wins[i]), vocab] row-major float32, the logits
// at every position of the window (prompt positions included).
//
// Errors: len(caches) or len(logits) ≠ len(wins), prompt < 0, chunk < 1,
// a logits buffer shorter than its window, and ForwardBatch's errors
// (naming the window and the position), ctx cancelled.
func TeacherForce(ctx context.Context, m runtime.Model, wins [][]int, caches []runtime.KVCache, logits [][]float32, prompt, chunk int) error {
	if len(caches) != len(wins) || len(logits) != len(wins) {
		return fmt.Errorf("eval: teacher forcing: %d windows, %d caches, %d logits buffers, want one each", len(wins), len(caches), len(logits))
	}
	if prompt < 0 || chunk < 1 {
		return fmt.Errorf("eval: teacher forcing: prompt %d, chunk %d: want prompt >= 0 and chunk >= 1", prompt, chunk)
	}
	V := m.Description().VocabSize
	for i, w := range wins {
		if len(logits[i]) < len(w)*V {
			return fmt.Errorf("eval: teacher forcing: window %d: logits buffer %d values, want %d×%d", i, len(logits[i]), len(w), V)
		}
	}
	pos := make([]int, len(wins))
	seqs := make([]runtime.Seq, 0, len(wins))
	idx := make([]int, 0, len(wins))
	for {
		seqs, idx = seqs[:0], idx[:0]
		for i, w := range wins {
			if pos[i] >= len(w) {
				continue
			}
			step := chunk
			if pos[i] == 0 && prompt > 0 {
				step = prompt
			}
			end := min(len(w), pos[i]+step)
			seqs = append(seqs, runtime.Seq{Tokens: w[pos[i]:end], Cache: caches[i],
				Logits: logits[i][pos[i]*V : end*V], AllLogits: true})
			idx = append(idx, i)
		}
		if len(seqs) == 0 {
			return nil
		}
		if err := runtime.ForwardBatch(ctx, m, seqs); err != nil {
			return fmt.Errorf("eval: teacher forcing at position %d of window %d: %w", pos[idx[0]], idx[0], err)
		}
		for j, i := range idx {
			pos[i] += len(seqs[j].Tokens)
		}
	}
}
