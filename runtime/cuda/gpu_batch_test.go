package cuda

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/lmpack/lmpack/runtime"
)

// batchRounds is a ragged schedule: rounds[r][s] new tokens of sequence s
// in round r (0: sits out), decode steps and prefill chunks mixed at
// different positions (B = 5, second round T = 1,1,7,3,1).
var batchRounds = [][]int{
	{7, 3, 1, 5, 2},
	{1, 1, 7, 3, 1},
	{0, 2, 1, 1, 4},
	{1, 1, 1, 1, 1},
	{3, 0, 1, 1, 1},
	{1, 1, 1, 1, 1},
}

// TestGPUForwardBatchMatchesAlone: the ragged ForwardBatch on the GPU
// (fp16 and oscar2 caches, GQA 4:2) gives each sequence the logits it gets
// alone through Forward with the same call boundaries, within 1e-4 of max
// |logit| (matmulX picks its kernel by the call's row count, so the sums'
// order may differ), with the same argmax everywhere but near-ties, and
// each cache at the length it would have alone.
func TestGPUForwardBatchMatchesAlone(t *testing.T) {
	gpuOrSkip(t)
	desc, src := syntheticModel(t, 2, 128, 4, 2, 32, 256, 256, 61)
	ctx := context.Background()
	g, err := (Backend{CacheDir: testCacheDir(t)}).Load(ctx, desc, src, runtime.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	m := g.(*Model)
	V := desc.VocabSize
	B := len(batchRounds[0])
	rng := rand.New(rand.NewPCG(3, 4))
	toks := make([][]int, B)
	for s := range toks {
		for _, row := range batchRounds {
			for j := 0; j < row[s]; j++ {
				toks[s] = append(toks[s], rng.IntN(V))
			}
		}
	}
	rot := randRotations(rand.New(rand.NewPCG(8, 9)), desc)
	for _, o := range []CacheOptions{{Method: "fp16"}, {Method: "oscar2", Sink: 2, Recent: 4, Rotations: rot}} {
		newCaches := func() []*DeviceCache {
			cs := make([]*DeviceCache, B)
			for s := range cs {
				c, err := m.NewDeviceCache(len(toks[s])+1, o)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { c.Free() })
				cs[s] = c
			}
			return cs
		}
		alone, batched := newCaches(), newCaches()
		off := make([]int, B)
		var maxDiff, maxLogit float64
		same, total := 0, 0
		for r, row := range batchRounds {
			var seqs []runtime.Seq
			var want [][]float32
			for s, T := range row {
				if T == 0 {
					continue
				}
				all := (r+s)%2 == 1
				n := V
				if all {
					n = T * V
				}
				a := make([]float32, n)
				if err := m.Forward(ctx, toks[s][off[s]:off[s]+T], alone[s], a, all); err != nil {
					t.Fatalf("%s round %d sequence %d alone: %v", o.Method, r, s, err)
				}
				want = append(want, a)
				seqs = append(seqs, runtime.Seq{Tokens: toks[s][off[s] : off[s]+T], Cache: batched[s], Logits: make([]float32, n), AllLogits: all})
				off[s] += T
			}
			if err := runtime.ForwardBatch(ctx, m, seqs); err != nil {
				t.Fatalf("%s round %d: %v", o.Method, r, err)
			}
			for i, sq := range seqs {
				for j, w := range want[i] {
					maxDiff = max(maxDiff, math.Abs(float64(sq.Logits[j]-w)))
					maxLogit = max(maxLogit, math.Abs(float64(w)))
					if sq.Logits[j] == w {
						same++
					}
					total++
				}
				for p := 0; p < len(want[i])/V; p++ {
					a, b := runtime.Argmax(want[i][p*V:(p+1)*V]), runtime.Argmax(sq.Logits[p*V:(p+1)*V])
					if a != b && math.Abs(float64(want[i][p*V+a]-want[i][p*V+b])) > 1e-4*maxLogit {
						t.Errorf("%s round %d: argmax %d batched, %d alone", o.Method, r, b, a)
					}
				}
			}
		}
		for s := range alone {
			if alone[s].Len() != batched[s].Len() {
				t.Errorf("%s sequence %d: cache holds %d tokens batched, %d alone", o.Method, s, batched[s].Len(), alone[s].Len())
			}
		}
		t.Logf("%s: max |Δlogit| %.3g of max |logit| %.3g; %d of %d logits bit-identical", o.Method, maxDiff, maxLogit, same, total)
		if !(maxDiff <= 1e-4*maxLogit) {
			t.Errorf("%s: batched logits differ from alone by %.3g > 1e-4 × max |logit| %.3g", o.Method, maxDiff, maxLogit)
		}
	}
}
