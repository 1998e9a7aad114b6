package runtime

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"testing"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
)

// shapes returns every tensor the description names with its expected
// shape.
func shapes(d *arch.Description) map[string][]int { return d.TensorShapes() }

// synthCheckpoint writes config.json and a random model.safetensors for
// config into a temp dir (seeded, so the same seed gives the same bytes).
// Norm weights are near 1, other weights N(0, scale²) with scale
// 1/sqrt(fan-in). dtype is the stored dtype. It returns the dir, the
// description and the weights as float64 read back from the file.
func synthCheckpoint(t testing.TB, config map[string]any, seed uint64, dtype safetensors.DType) (string, *arch.Description, map[string][]float64) {
	t.Helper()
	raw, _ := json.Marshal(config)
	d, err := arch.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "config.json"), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(seed, 7))
	var ws []safetensors.WriteTensor
	sh := shapes(d)
	names := make([]string, 0, len(sh))
	for n := range sh {
		names = append(names, n)
	}
	// Deterministic order for the RNG.
	sort.Strings(names)
	for _, n := range names {
		shape := sh[n]
		size := 1
		for _, x := range shape {
			size *= x
		}
		v := make([]float32, size)
		isNorm := len(shape) == 1 && (filepath.Ext(n) == ".weight")
		fanIn := shape[len(shape)-1]
		for i := range v {
			if isNorm {
				v[i] = float32(1 + 0.1*rng.NormFloat64())
			} else {
				v[i] = float32(rng.NormFloat64() / math.Sqrt(float64(fanIn)))
			}
		}
		if len(shape) == 1 && !isNorm { // biases
			for i := range v {
				v[i] *= 0.5
			}
		}
		wt, err := safetensors.FromFloat32As(n, dtype, shape, v)
		if err != nil {
			t.Fatal(err)
		}
		ws = append(ws, wt)
	}
	if err := safetensors.WriteFile(filepath.Join(dir, "model.safetensors"), ws, map[string]string{"format": "pt"}); err != nil {
		t.Fatal(err)
	}
	ck, err := safetensors.OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	w := map[string][]float64{}
	for _, n := range ck.Names() {
		tt, err := ck.Tensor(n)
		if err != nil {
			t.Fatal(err)
		}
		f, err := tt.Float32()
		if err != nil {
			t.Fatal(err)
		}
		w[n] = make([]float64, len(f))
		for i, x := range f {
			w[n][i] = float64(x)
		}
	}
	return dir, d, w
}

// loadDir opens dir's checkpoint and loads it on the CPU backend.
func loadDir(t testing.TB, dir string, threads int) (Model, *arch.Description) {
	t.Helper()
	d, err := arch.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	ck, err := safetensors.OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ck.Close() })
	m, err := NewCPU().Load(context.Background(), d, ck, LoadOptions{Threads: threads})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m, d
}

// forwardAll runs tokens in one prefill and returns logits [T*V].
func forwardAll(t testing.TB, m Model, tokens []int) []float32 {
	t.Helper()
	V := m.Description().VocabSize
	logits := make([]float32, len(tokens)*V)
	c := m.NewCache(len(tokens))
	if err := m.Forward(context.Background(), tokens, c, logits, true); err != nil {
		t.Fatal(err)
	}
	return logits
}

// forwardSteps runs tokens one at a time (the decode path) and returns the
// logits of every step [T*V].
func forwardSteps(t testing.TB, m Model, tokens []int, chunk int) []float32 {
	t.Helper()
	V := m.Description().VocabSize
	out := make([]float32, len(tokens)*V)
	c := m.NewCache(len(tokens))
	for i := 0; i < len(tokens); i += chunk {
		j := min(i+chunk, len(tokens))
		if err := m.Forward(context.Background(), tokens[i:j], c, out[i*V:j*V], true); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func maxAbsDiff(a []float32, b []float64) float64 {
	if len(a) != len(b) {
		panic(fmt.Sprintf("length %d vs %d", len(a), len(b)))
	}
	var m float64
	for i := range a {
		m = math.Max(m, math.Abs(float64(a[i])-b[i]))
	}
	return m
}

func flatten(x [][]float64) []float64 {
	var out []float64
	for _, r := range x {
		out = append(out, r...)
	}
	return out
}

func loadDescription(dir string) (*arch.Description, error) { return arch.Load(dir) }

func loadDescriptionBytes(b []byte) (*arch.Description, error) { return arch.Parse(b) }

func loadCheckpoint(t testing.TB, dir string) *safetensors.Checkpoint {
	t.Helper()
	ck, err := safetensors.OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ck.Close() })
	return ck
}
