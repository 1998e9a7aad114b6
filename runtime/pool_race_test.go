package runtime

import (
	"context"
	"sync"
	"testing"

	"github.com/lmpack/lmpack/internal/shared"
)

// TestConcurrentDecodeStress decodes on several models at once, each with
// more pool threads than this machine has cores, and checks every one
// decodes the same greedy continuation as a single-thread model. (The
// pool's stale wake-up crash needed several processes competing for the
// cores to show; cmd/lmpack's TestConcurrentRuns reproduces that.)
func TestConcurrentDecodeStress(t *testing.T) {
	dir := shared.Path(t, "stories260K-moe-hf")
	steps := 400
	if testing.Short() {
		steps = 100
	}
	var want []int
	{
		m, d := loadDir(t, dir, 1)
		want = greedy(t, m, d.VocabSize, steps)
	}
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		m, d := loadDir(t, dir, 2+g)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for rep := 0; rep < 3; rep++ {
				got := greedy(t, m, d.VocabSize, steps)
				for i := range want {
					if got[i] != want[i] {
						t.Errorf("threads %d rep %d: token %d is %d, want %d", 2+g, rep, i, got[i], want[i])
						return
					}
				}
			}
		}()
	}
	wg.Wait()
}

func greedy(t testing.TB, m Model, V, steps int) []int {
	c := m.NewCache(steps + 1)
	logits := make([]float32, V)
	tok := []int{1}
	var out []int
	for i := 0; i < steps; i++ {
		if err := m.Forward(context.Background(), tok, c, logits, false); err != nil {
			t.Error(err)
			return nil
		}
		tok[0] = Argmax(logits)
		out = append(out, tok[0])
	}
	return out
}
