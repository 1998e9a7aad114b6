package runtime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/quantize/weights"
)

// batchPlan is a ragged schedule: plan[r][s] new tokens of sequence s in
// round r (0: the sequence sits the round out). Sequence s wants all logits
// in a round when (r+s) is odd, the last row's otherwise.
type batchPlan [][]int

// mixedPlan mixes decode steps and prefill chunks at different positions:
// B = 5, the second round T = 1,1,7,3,1.
var mixedPlan = batchPlan{
	{7, 3, 1, 5, 2},
	{1, 1, 7, 3, 1},
	{0, 2, 1, 1, 4},
	{1, 1, 1, 1, 1},
	{3, 0, 1, 1, 1},
}

// planTokens returns seeded token ids for every sequence of plan.
func planTokens(plan batchPlan, V int, seed uint64) [][]int {
	rng := rand.New(rand.NewPCG(seed, 3))
	toks := make([][]int, len(plan[0]))
	for s := range toks {
		n := 0
		for _, row := range plan {
			n += row[s]
		}
		toks[s] = make([]int, n)
		for i := range toks[s] {
			toks[s][i] = rng.IntN(V)
		}
	}
	return toks
}

// planLen returns the tokens of sequence s over the whole plan.
func planLen(plan batchPlan, s int) int {
	n := 0
	for _, row := range plan {
		n += row[s]
	}
	return n
}

// runPlanAlone runs every sequence of plan alone through alone.Forward,
// with the plan's call boundaries, on caches from newCache, and returns
// the logits of every call: out[r][s] (nil when the sequence sat out).
func runPlanAlone(t *testing.T, m Model, plan batchPlan, toks [][]int, newCache func(capacity int) KVCache) [][][]float32 {
	t.Helper()
	V := m.Description().VocabSize
	out := make([][][]float32, len(plan))
	for r := range out {
		out[r] = make([][]float32, len(plan[r]))
	}
	for s := range toks {
		c := newCache(planLen(plan, s) + 2)
		off := 0
		for r, row := range plan {
			T := row[s]
			if T == 0 {
				continue
			}
			all := (r+s)%2 == 1
			n := V
			if all {
				n = T * V
			}
			lg := make([]float32, n)
			if err := m.Forward(context.Background(), toks[s][off:off+T], c, lg, all); err != nil {
				t.Fatalf("sequence %d round %d alone: %v", s, r, err)
			}
			out[r][s] = lg
			off += T
		}
	}
	return out
}

// runPlanBatch runs plan with one ForwardBatch call per round.
func runPlanBatch(t *testing.T, m Model, plan batchPlan, toks [][]int, newCache func(capacity int) KVCache) [][][]float32 {
	t.Helper()
	V := m.Description().VocabSize
	caches := make([]KVCache, len(toks))
	for s := range caches {
		caches[s] = newCache(planLen(plan, s) + 2)
	}
	off := make([]int, len(toks))
	out := make([][][]float32, len(plan))
	for r, row := range plan {
		out[r] = make([][]float32, len(row))
		var seqs []Seq
		var idx []int
		for s, T := range row {
			if T == 0 {
				continue
			}
			all := (r+s)%2 == 1
			n := V
			if all {
				n = T * V
			}
			seqs = append(seqs, Seq{Tokens: toks[s][off[s] : off[s]+T], Cache: caches[s], Logits: make([]float32, n), AllLogits: all})
			idx = append(idx, s)
			off[s] += T
		}
		if err := ForwardBatch(context.Background(), m, seqs); err != nil {
			t.Fatalf("round %d: %v", r, err)
		}
		for i, s := range idx {
			out[r][s] = seqs[i].Logits
			if want := off[s]; caches[s].Len() != want {
				t.Fatalf("round %d sequence %d: cache holds %d tokens, want %d", r, s, caches[s].Len(), want)
			}
		}
	}
	return out
}

// sameLogits fails unless got and want are the same bits everywhere.
func sameLogits(t *testing.T, what string, got, want [][][]float32) {
	t.Helper()
	for r := range want {
		for s := range want[r] {
			g, w := got[r][s], want[r][s]
			if len(g) != len(w) {
				t.Fatalf("%s: round %d sequence %d: %d logits, want %d", what, r, s, len(g), len(w))
			}
			for i := range w {
				if math.Float32bits(g[i]) != math.Float32bits(w[i]) {
					t.Fatalf("%s: round %d sequence %d: logit %d is %v batched, %v alone (the batch changed a row)", what, r, s, i, g[i], w[i])
				}
			}
		}
	}
}

// checkBatchAlone runs plan batched on mb and alone on ma and wants the
// same bits.
func checkBatchAlone(t *testing.T, what string, ma, mb Model, plan batchPlan, newCache func(m Model) func(int) KVCache) {
	t.Helper()
	toks := planTokens(plan, ma.Description().VocabSize, 17)
	want := runPlanAlone(t, ma, plan, toks, newCache(ma))
	got := runPlanBatch(t, mb, plan, toks, newCache(mb))
	sameLogits(t, what, got, want)
}

func f32Caches(m Model) func(int) KVCache { return m.NewCache }

// TestForwardBatchMatchesAlone: for every family of the synthetic tests
// (GQA, biases, q/k norm, MoE with and without a shared expert, sliding
// window, RoPE scaling) and odd sizes, the logits of a ragged batch equal
// bit for bit those of each sequence run alone with the same call
// boundaries, alone on one thread and batched on three.
func TestForwardBatchMatchesAlone(t *testing.T) {
	cases := []struct {
		name  string
		cfg   map[string]any
		dtype safetensors.DType
	}{
		{"llama-gqa", baseConfig("LlamaForCausalLM"), safetensors.F32},
		{"qwen2-biases-tied", with(baseConfig("Qwen2ForCausalLM"), "tie_word_embeddings", true), safetensors.F32},
		{"qwen3-qknorm", with(baseConfig("Qwen3ForCausalLM"), "head_dim", 16), safetensors.F32},
		{"qwen2moe-shared", with(baseConfig("Qwen2MoeForCausalLM"), "num_experts", 6, "num_experts_per_tok", 2,
			"moe_intermediate_size", 24, "shared_expert_intermediate_size", 40, "decoder_sparse_step", 1, "mlp_only_layers", []int{1}), safetensors.F32},
		{"qwen3moe", with(baseConfig("Qwen3MoeForCausalLM"), "head_dim", 8, "num_experts", 8, "num_experts_per_tok", 3,
			"moe_intermediate_size", 16, "norm_topk_prob", true), safetensors.F32},
		{"mistral-window", with(baseConfig("MistralForCausalLM"), "sliding_window", 5), safetensors.F16},
		{"llama3-rope-odd", with(baseConfig("LlamaForCausalLM"), "hidden_size", 45, "num_attention_heads", 5, "num_key_value_heads", 1,
			"head_dim", 6, "intermediate_size", 67, "vocab_size", 101, "attention_bias", true,
			"rope_scaling", map[string]any{"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 16}), safetensors.F32},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir, _, _ := synthCheckpoint(t, c.cfg, uint64(700+i), c.dtype)
			ma, _ := loadDir(t, dir, 1)
			mb, _ := loadDir(t, dir, 3)
			checkBatchAlone(t, c.name, ma, mb, mixedPlan, f32Caches)
		})
	}
}

// TestForwardBatchLongRows: rows long enough for the k slices of the GEMM
// (intermediate 1600 > 768) and more rows than one attention block, on a
// wide model: 17 sequences, prefill chunks up to 70 tokens.
func TestForwardBatchLongRows(t *testing.T) {
	cfg := with(baseConfig("LlamaForCausalLM"), "hidden_size", 96, "intermediate_size", 1600, "num_hidden_layers", 2,
		"num_attention_heads", 4, "num_key_value_heads", 2, "vocab_size", 131)
	dir, _, _ := synthCheckpoint(t, cfg, 811, safetensors.F32)
	ma, _ := loadDir(t, dir, 1)
	mb, _ := loadDir(t, dir, 2)
	plan := batchPlan{make([]int, 17), make([]int, 17), make([]int, 17)}
	for s := range plan[0] {
		plan[0][s] = []int{1, 70, 5, 13}[s%4]
		plan[1][s] = 1
		plan[2][s] = []int{2, 1, 1}[s%3]
	}
	checkBatchAlone(t, "long rows", ma, mb, plan, f32Caches)
}

// packedSource builds cfg's checkpoint in memory with every 2-d weight but
// the embedding RTN-quantized with o (lmpack-wq storage tensors).
func packedSource(t testing.TB, cfg map[string]any, seed uint64, o weights.Options) (*arch.Description, memSource) {
	t.Helper()
	raw, _ := json.Marshal(cfg)
	d, err := arch.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	d.Quant = &arch.Quantization{Format: arch.QuantFormat, Version: arch.QuantVersion, Method: "rtn", Tensors: map[string]arch.TensorQuant{}}
	sh := shapes(d)
	names := make([]string, 0, len(sh))
	for n := range sh {
		names = append(names, n)
	}
	sort.Strings(names)
	rng := rand.New(rand.NewPCG(seed, 24))
	src := memSource{}
	for _, n := range names {
		s := sh[n]
		size := 1
		for _, x := range s {
			size *= x
		}
		v := make([]float32, size)
		for i := range v {
			if len(s) == 1 {
				v[i] = float32(1 + 0.1*rng.NormFloat64())
			} else {
				v[i] = float32(rng.NormFloat64() / math.Sqrt(float64(s[len(s)-1])))
			}
		}
		router := strings.HasSuffix(n, "mlp.gate.weight")
		if len(s) == 2 && n != d.Embedding && !router {
			q, err := weights.QuantizeRTN(v, s[0], s[1], o)
			if err != nil {
				t.Fatal(err)
			}
			src.putQuantized(n, q)
			d.Quant.Tensors[n] = arch.TensorQuant{Bits: q.Bits, GroupSize: q.GroupSize, Symmetric: q.Symmetric}
			continue
		}
		tt := safetensors.FromFloat32(n, s, v)
		src[n] = &safetensors.Tensor{Name: n, File: "(mem)", DType: tt.DType, Shape: tt.Shape, Data: tt.Data}
	}
	return d, src
}

// TestForwardBatchPackedMatchesAlone: packed quantized weights (4-bit g32
// asymmetric, 3-bit g32 symmetric, 8-bit g32, 2-bit per channel, 1-bit
// g32; dense and MoE) give each sequence of a batch the bits it gets alone
// (on 1 and 2 threads), and, on the tile path, the same bits as the
// weights dequantized at load; on int8 activations they meet
// checkQ8Logits' criterion against them.
func TestForwardBatchPackedMatchesAlone(t *testing.T) {
	small := func(a string) map[string]any {
		return with(baseConfig(a), "num_hidden_layers", 2, "hidden_size", 64, "num_attention_heads", 4, "intermediate_size", 96)
	}
	dense := small("LlamaForCausalLM")
	moe := with(small("Qwen2MoeForCausalLM"), "num_experts", 4, "num_experts_per_tok", 2,
		"moe_intermediate_size", 32, "shared_expert_intermediate_size", 64, "decoder_sparse_step", 1, "mlp_only_layers", []int{})
	cases := []struct {
		name string
		cfg  map[string]any
		o    weights.Options
	}{
		{"4bit-g32", dense, weights.Options{Bits: 4, GroupSize: 32}},
		{"3bit-g32-sym", dense, weights.Options{Bits: 3, GroupSize: 32, Symmetric: true}},
		{"8bit-g32", dense, weights.Options{Bits: 8, GroupSize: 32}},
		{"2bit-perchannel", dense, weights.Options{Bits: 2}},
		{"1bit-g32", dense, weights.Options{Bits: 1, GroupSize: 32}},
		{"moe-4bit-g32", moe, weights.Options{Bits: 4, GroupSize: 32}},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d, src := packedSource(t, c.cfg, uint64(900+i), c.o)
			load := func(threads int, dequant bool) Model {
				m, err := NewCPU().Load(context.Background(), d, src, LoadOptions{Threads: threads, DequantizeWeights: dequant})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { m.Close() })
				return m
			}
			ma, mb, mdq := load(1, false), load(2, false), load(1, true)
			if LinearWeightBytes(ma) >= LinearWeightBytes(mdq) {
				t.Fatalf("weights not packed: %d bytes packed, %d dequantized", LinearWeightBytes(ma), LinearWeightBytes(mdq))
			}
			checkBatchAlone(t, c.name, ma, mb, mixedPlan, f32Caches)
			// Weights on the tile path (3 bits here) are also bit for bit
			// the weights dequantized at load; those on int8 activations
			// (qlinear.go) meet the int8-activation criterion against them
			// (checkQ8Logits), in a 40-token prefill and in 40 decode steps.
			if !Q8Width(c.o.Bits) {
				checkBatchAlone(t, c.name+" vs dequantized at load", mdq, mb, mixedPlan, f32Caches)
			} else {
				toks := planTokens(batchPlan{{40}}, d.VocabSize, 19)[0]
				checkQ8Logits(t, c.name+" prefill vs dequantized at load", forwardAll(t, ma, toks), forwardAll(t, mdq, toks), d.VocabSize)
				checkQ8Logits(t, c.name+" decode vs dequantized at load", forwardSteps(t, ma, toks, 1), forwardSteps(t, mdq, toks, 1), d.VocabSize)
			}
		})
	}
}

// cancelAfter is a context whose Err turns context.Canceled after n calls.
type cancelAfter struct {
	context.Context
	n int
}

func (c *cancelAfter) Err() error {
	if c.n <= 0 {
		return context.Canceled
	}
	c.n--
	return nil
}

// TestForwardBatchBadInput: every bad sequence is refused before any cache
// is touched, with the sequence's index in the error; a cancelled call
// leaves every cache at its length before the call, and what runs next
// gives the logits of a run that never saw the cancelled call.
func TestForwardBatchBadInput(t *testing.T) {
	dir, d, _ := synthCheckpoint(t, baseConfig("LlamaForCausalLM"), 31, safetensors.F32)
	m, _ := loadDir(t, dir, 1)
	V := d.VocabSize
	ctx := context.Background()
	c0, c1, full := m.NewCache(8), m.NewCache(8), m.NewCache(2)
	if err := m.Forward(ctx, []int{1, 2}, full, make([]float32, V), false); err != nil {
		t.Fatal(err)
	}
	if err := m.Forward(ctx, []int{3}, c0, make([]float32, V), false); err != nil {
		t.Fatal(err)
	}
	good := func(c KVCache) Seq { return Seq{Tokens: []int{4, 5}, Cache: c, Logits: make([]float32, V)} }
	cases := []struct {
		name string
		bad  Seq
		want string
	}{
		{"empty tokens", Seq{Cache: m.NewCache(4), Logits: make([]float32, V)}, "sequence 1: no tokens"},
		{"id out of range", Seq{Tokens: []int{1, V}, Cache: m.NewCache(4), Logits: make([]float32, V)}, fmt.Sprintf("sequence 1: token %d at index 1 out of range", V)},
		{"negative id", Seq{Tokens: []int{-1}, Cache: m.NewCache(4), Logits: make([]float32, V)}, "sequence 1: token -1 at index 0 out of range"},
		{"cache full", Seq{Tokens: []int{1}, Cache: full, Logits: make([]float32, V)}, "sequence 1: 1 tokens at position 2 exceed the KV cache capacity 2"},
		{"short logits", Seq{Tokens: []int{1, 2}, Cache: m.NewCache(4), Logits: make([]float32, V), AllLogits: true}, fmt.Sprintf("sequence 1: logits has %d elements, want %d", V, 2*V)},
		{"nil cache", Seq{Tokens: []int{1}, Logits: make([]float32, V)}, "sequence 1: no KV cache"},
		{"same cache", good(c0), "sequences 0 and 1 share one KV cache"},
	}
	for _, c := range cases {
		err := m.(BatchForwarder).ForwardBatch(ctx, []Seq{good(c0), c.bad, good(c1)})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want it to contain %q", c.name, err, c.want)
		}
		if c0.Len() != 1 || c1.Len() != 0 || full.Len() != 2 {
			t.Fatalf("%s: caches hold %d, %d, %d tokens after a refused call, want 1, 0, 2", c.name, c0.Len(), c1.Len(), full.Len())
		}
	}
	if err := m.(BatchForwarder).ForwardBatch(ctx, nil); err == nil || !strings.Contains(err.Error(), "no sequences") {
		t.Errorf("no sequences: error %v", err)
	}
	m.SetObserver(&recordingObserver{})
	err := m.(BatchForwarder).ForwardBatch(ctx, []Seq{good(c0), good(c1)})
	if err == nil || !strings.Contains(err.Error(), "observer") {
		t.Errorf("two sequences with an observer: error %v, want a refusal naming the observer", err)
	}
	m.SetObserver(nil)

	// Cancelled after the first block: both caches back to their lengths.
	seqs := []Seq{good(c0), good(c1)}
	if err := m.(BatchForwarder).ForwardBatch(&cancelAfter{ctx, 2}, seqs); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled call: error %v, want context.Canceled", err)
	}
	if c0.Len() != 1 || c1.Len() != 0 {
		t.Fatalf("cancelled call: caches hold %d, %d tokens, want 1, 0", c0.Len(), c1.Len())
	}
	if err := m.(BatchForwarder).ForwardBatch(ctx, seqs); err != nil {
		t.Fatal(err)
	}
	fresh0, fresh1 := m.NewCache(8), m.NewCache(8)
	want0, want1 := make([]float32, V), make([]float32, V)
	forwardOrFail(t, m, []int{3}, fresh0, make([]float32, V))
	forwardOrFail(t, m, []int{4, 5}, fresh0, want0)
	forwardOrFail(t, m, []int{4, 5}, fresh1, want1)
	for i := range want0 {
		if seqs[0].Logits[i] != want0[i] || seqs[1].Logits[i] != want1[i] {
			t.Fatalf("after a cancelled call, logit %d is %v, %v; want %v, %v (as if it never ran)", i, seqs[0].Logits[i], seqs[1].Logits[i], want0[i], want1[i])
		}
	}
}

func forwardOrFail(t *testing.T, m Model, toks []int, c KVCache, logits []float32) {
	t.Helper()
	if err := m.Forward(context.Background(), toks, c, logits, false); err != nil {
		t.Fatal(err)
	}
}

// recordingObserver counts the blocks it sees.
type recordingObserver struct{ blocks int }

func (o *recordingObserver) BlockInput(layer, pos, n int, x []float32)  { o.blocks++ }
func (o *recordingObserver) BlockOutput(layer, pos, n int, x []float32) {}

// TestForwardBatchOneSequenceObserver: an observer still sees one
// sequence run through ForwardBatch, as through Forward.
func TestForwardBatchOneSequenceObserver(t *testing.T) {
	dir, d, _ := synthCheckpoint(t, baseConfig("LlamaForCausalLM"), 32, safetensors.F32)
	m, _ := loadDir(t, dir, 1)
	o := &recordingObserver{}
	m.SetObserver(o)
	seqs := []Seq{{Tokens: []int{1, 2, 3}, Cache: m.NewCache(4), Logits: make([]float32, d.VocabSize)}}
	if err := ForwardBatch(context.Background(), m, seqs); err != nil {
		t.Fatal(err)
	}
	if o.blocks != len(d.Layers) {
		t.Fatalf("observer saw %d blocks, want %d", o.blocks, len(d.Layers))
	}
}
