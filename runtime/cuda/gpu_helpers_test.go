package cuda

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/internal/shared"
	"github.com/lmpack/lmpack/runtime/kvcache"
)

// gpuOrSkip opens device 0 and the kernels, skipping the test with the
// reason when there is no driver or device (failing instead when
// LMPACK_REQUIRE_GPU=1, as scripts/gpu-check.sh sets). NVRTC missing on a
// GPU machine is a failure.
func gpuOrSkip(tb testing.TB) (*Device, *Kernels) {
	tb.Helper()
	d, err := OpenDevice(0)
	if err != nil {
		if os.Getenv("LMPACK_REQUIRE_GPU") == "1" {
			tb.Fatalf("LMPACK_REQUIRE_GPU=1 but no CUDA GPU: %v", err)
		}
		tb.Skipf("no CUDA GPU: %v", err)
	}
	cache := os.Getenv("LMPACK_CUDA_CACHE") // shared by scripts/gpu-check.sh's runs
	if cache == "" {
		cache = tb.TempDir()
	}
	k, err := LoadKernels(d, cache)
	if err != nil {
		d.Close()
		tb.Fatalf("loading kernels on %s: %v", d.Name, err)
	}
	tb.Cleanup(func() {
		k.Close()
		d.Close()
	})
	return d, k
}

// devBuf uploads v and frees it at cleanup.
func devBuf[T any](tb testing.TB, d *Device, v []T) DevPtr {
	tb.Helper()
	var z T
	n := int64(len(v)) * int64(sizeOf(z))
	p, err := d.Alloc(n)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { d.Free(p) })
	if err := Upload(d, p, v); err != nil {
		tb.Fatal(err)
	}
	return p
}

func sizeOf(v any) int {
	switch v.(type) {
	case float32, int32, uint32:
		return 4
	case uint16:
		return 2
	case uint8:
		return 1
	}
	panic(fmt.Sprintf("sizeOf %T", v))
}

func download[T any](tb testing.TB, d *Device, p DevPtr, n int) []T {
	tb.Helper()
	if err := d.Sync(); err != nil {
		tb.Fatal(err)
	}
	out := make([]T, n)
	if err := Download(d, out, p); err != nil {
		tb.Fatal(err)
	}
	return out
}

func randVec(r *rand.Rand, n int, scale float64) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.NormFloat64() * scale)
	}
	return v
}

// randOrthogonal returns a random orthogonal [d, d] matrix (Gram–Schmidt
// on Gaussian rows, float64).
func randOrthogonal(r *rand.Rand, d int) []float32 {
	q := make([][]float64, d)
	for i := range q {
		for {
			v := make([]float64, d)
			for j := range v {
				v[j] = r.NormFloat64()
			}
			for k := 0; k < i; k++ {
				var dot float64
				for j := range v {
					dot += v[j] * q[k][j]
				}
				for j := range v {
					v[j] -= dot * q[k][j]
				}
			}
			var n float64
			for _, x := range v {
				n += x * x
			}
			n = math.Sqrt(n)
			if n > 1e-6 {
				for j := range v {
					v[j] /= n
				}
				q[i] = v
				break
			}
		}
	}
	out := make([]float32, d*d)
	for i := range q {
		for j := range q[i] {
			out[i*d+j] = float32(q[i][j])
		}
	}
	return out
}

// randRotations returns oscar2 rotations for d with OSCAR's published
// clipping ratios (0.96 keys, 0.92 values).
func randRotations(r *rand.Rand, d *arch.Description) *kvcache.Rotations {
	rot := &kvcache.Rotations{}
	for _, l := range d.Layers {
		rot.K = append(rot.K, randOrthogonal(r, l.HeadDim))
		rot.V = append(rot.V, randOrthogonal(r, l.HeadDim))
		rot.ClipK = append(rot.ClipK, 0.96)
		rot.ClipV = append(rot.ClipV, 0.92)
	}
	return rot
}

// mapSource is an in-memory runtime.TensorSource.
type mapSource map[string]*safetensors.Tensor

func (m mapSource) Tensor(name string) (*safetensors.Tensor, error) {
	t, ok := m[name]
	if !ok {
		return nil, fmt.Errorf("%w: %q", safetensors.ErrMissingTensor, name)
	}
	return t, nil
}

// syntheticModel returns a Llama description and random F16 weights
// (syntheticModelOpts with the Llama defaults); seed fixes them.
func syntheticModel(tb testing.TB, layers, hidden, heads, kvHeads, headDim, inter, vocab int, seed uint64) (*arch.Description, mapSource) {
	tb.Helper()
	return syntheticModelOpts(tb, synthOpts{Layers: layers, Hidden: hidden, Heads: heads, KVHeads: kvHeads, HeadDim: headDim, Inter: inter, Vocab: vocab}, seed)
}

// synthOpts describes a synthetic checkpoint for syntheticModelOpts.
type synthOpts struct {
	// Arch is config.json's architectures[0] ("" = LlamaForCausalLM).
	Arch string
	// Sizes: num_hidden_layers, hidden_size, num_attention_heads,
	// num_key_value_heads, head_dim, intermediate_size, vocab_size.
	Layers, Hidden, Heads, KVHeads, HeadDim, Inter, Vocab int
	// Extra holds further config.json keys (sliding_window,
	// attention_bias, tie_word_embeddings, ...); they override the
	// defaults.
	Extra map[string]any
	// BF16 stores every tensor as BF16 instead of F16.
	BF16 bool
	// QKScale multiplies the q_proj and k_proj weights (0 means 1), so
	// that q and k leave the projections far from unit RMS (what Qwen3's
	// q/k norms then undo).
	QKScale float64
}

// synthModelTypes is config.json's model_type for each architecture.
var synthModelTypes = map[string]string{
	"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2",
	"Qwen3ForCausalLM": "qwen3", "MixtralForCausalLM": "mixtral",
}

// syntheticModelOpts returns the description o spells out and random
// weights for every tensor it names (d.TensorShapes): norm weights (and
// any other 1-d tensor but a bias) 1 + 0.1·N(0, 1), biases N(0, 0.5²),
// matrices N(0, 1/cols) (times QKScale for q_proj and k_proj), stored F16
// (or BF16). The tensors are drawn in name order, so seed fixes them.
func syntheticModelOpts(tb testing.TB, o synthOpts, seed uint64) (*arch.Description, mapSource) {
	tb.Helper()
	if o.Arch == "" {
		o.Arch = "LlamaForCausalLM"
	}
	cfg := map[string]any{
		"architectures": []string{o.Arch}, "model_type": synthModelTypes[o.Arch],
		"hidden_size": o.Hidden, "intermediate_size": o.Inter, "num_hidden_layers": o.Layers,
		"num_attention_heads": o.Heads, "num_key_value_heads": o.KVHeads, "head_dim": o.HeadDim, "vocab_size": o.Vocab,
		"max_position_embeddings": 65536, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": false,
	}
	for k, v := range o.Extra {
		cfg[k] = v
	}
	raw, err := json.Marshal(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	d, err := arch.Parse(raw)
	if err != nil {
		tb.Fatal(err)
	}
	qk := o.QKScale
	if qk == 0 {
		qk = 1
	}
	r := rand.New(rand.NewPCG(seed, 7))
	src := mapSource{}
	shapes := d.TensorShapes()
	for _, name := range slices.Sorted(maps.Keys(shapes)) {
		shape := shapes[name]
		n := 1
		for _, s := range shape {
			n *= s
		}
		v := make([]float32, n)
		switch {
		case strings.HasSuffix(name, ".bias"):
			for i := range v {
				v[i] = float32(0.5 * r.NormFloat64())
			}
		case len(shape) == 1:
			for i := range v {
				v[i] = float32(1 + 0.1*r.NormFloat64())
			}
		default:
			sd := 1 / math.Sqrt(float64(shape[len(shape)-1]))
			if strings.HasSuffix(name, ".q_proj.weight") || strings.HasSuffix(name, ".k_proj.weight") {
				sd *= qk
			}
			for i := range v {
				v[i] = float32(r.NormFloat64() * sd)
			}
		}
		t := &safetensors.Tensor{Name: name, File: "synthetic", DType: safetensors.F16, Shape: shape, Data: safetensors.F16Bytes(v)}
		if o.BF16 {
			t.DType, t.Data = safetensors.BF16, safetensors.BF16Bytes(v)
		}
		src[name] = t
	}
	return d, src
}

// storiesTokens returns the first n token ids of the shared tokenized
// TinyStories validation text.
func storiesTokens(tb testing.TB, n int) []int {
	tb.Helper()
	b, err := os.ReadFile(shared.Path(tb, "stories260K-hf", "reference", "tinystories_val.tok512.u16"))
	if err != nil {
		tb.Fatal(err)
	}
	if len(b) < 2*n {
		tb.Fatalf("tinystories_val.tok512.u16 holds %d tokens, want %d", len(b)/2, n)
	}
	out := make([]int, n)
	for i := range out {
		out[i] = int(binary.LittleEndian.Uint16(b[2*i:]))
	}
	return out
}

// logitDiff returns max |a−b|, mean |a−b| and the fraction of rows of
// width v whose argmax agrees.
func logitDiff(a, b []float32, v int) (maxAbs, meanAbs, agree float64) {
	var s float64
	rows, same := len(a)/v, 0
	for r := 0; r < rows; r++ {
		ia, ib := 0, 0
		for j := 0; j < v; j++ {
			x, y := a[r*v+j], b[r*v+j]
			dd := math.Abs(float64(x - y))
			maxAbs = max(maxAbs, dd)
			s += dd
			if x > a[r*v+ia] {
				ia = j
			}
			if y > b[r*v+ib] {
				ib = j
			}
		}
		if ia == ib {
			same++
		}
	}
	return maxAbs, s / float64(len(a)), float64(same) / float64(rows)
}

// testCacheDir is $LMPACK_CUDA_CACHE, else a temporary directory.
func testCacheDir(tb testing.TB) string {
	if d := os.Getenv("LMPACK_CUDA_CACHE"); d != "" {
		return d
	}
	return tb.TempDir()
}
