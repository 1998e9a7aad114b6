package compress

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/calibrate"
	"github.com/lmpack/lmpack/eval"
	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/internal/engine"
	"github.com/lmpack/lmpack/internal/shared"
	"github.com/lmpack/lmpack/model"
	"github.com/lmpack/lmpack/pack"
	"github.com/lmpack/lmpack/quantize/oscar"
	"github.com/lmpack/lmpack/runtime"
	"github.com/lmpack/lmpack/runtime/kvcache"
)

// smallRecipe is a fast oscar2 recipe for stories260K: 1024 calibration
// tokens, 2 eval windows of 256 tokens.
const smallRecipe = `name: small
calibrate:
  tokens: 1024
  ctx: 256
quantize:
  kv:
    cache: oscar2
    sink: 8
    recent: 32
pack:
  lz4: true
eval:
  ctx: 256
  max_windows: 2
  max_delta_ppl_pct: 100000
  max_kl: 10
`

// smallWeightsRecipe is smallRecipe with 4-bit GPTQ (group 32,
// act-order) weights before the oscar2 KV stage.
var smallWeightsRecipe = strings.Replace(smallRecipe, "quantize:\n", "quantize:\n  weights:\n    method: gptq\n    bits: 4\n    group: 32\n    act_order: true\n", 1)

func mustRecipe(t *testing.T, src string) *Recipe {
	t.Helper()
	r, err := ParseRecipe("test.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func testOptions(t *testing.T, r *Recipe, out, work string) Options {
	return Options{Model: shared.Path(t, "stories260K-hf"), Recipe: r, Out: out, WorkDir: work,
		Data: shared.Path(t, "tinystories-valid", "calib.txt"), EvalData: shared.Path(t, "tinystories-valid", "heldout.txt"),
		Threads: 1, Version: "test"}
}

// oscar2Serving is the KV bits per element of smallRecipe's cache
// (oscar2, fp16 windows 8 and 32) on stories260K (head_dim 8) at the
// default serving context of 32768 tokens, by hand: a quantized token
// stores 2-bit codes and an fp16 scale and zero per (token, head) row of 8
// channels, 2 + 32/8 = 6 bits per element; the 40 window tokens 16 bits:
// (40·16 + (32768−40)·6) / 32768 = 197008/32768.
const oscar2Serving = 197008.0 / 32768

// cachedStages maps stage name to its Cached flag.
func cachedStages(rep *Report) map[string]bool {
	m := map[string]bool{}
	for _, s := range rep.Stages {
		m[s.Name] = s.Cached
	}
	return m
}

// hashTree returns the sha256 of every regular file under the paths.
func hashTree(t *testing.T, paths ...string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, root := range paths {
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			s := sha256.Sum256(b)
			out[p] = hex.EncodeToString(s[:])
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// TestCompressResumeDeterminism: with the weights recipe (4-bit GPTQ,
// oscar2 KV), a run killed mid-calibrate, then mid-quantize-weights, then
// mid-eval (a context cancelled from the progress hook, which leaves the
// stage's temporary directory behind as a kill would) resumes: each rerun
// reuses the finished stages and recomputes the interrupted one, and the
// final artifact is byte-identical to an uninterrupted run's and to a
// second uninterrupted run's (determinism). The model, data files are
// never modified. The artifact verifies and records the oscar2 scheme and
// the quantized weights.
func TestCompressResumeDeterminism(t *testing.T) {
	dir := t.TempDir()
	r := mustRecipe(t, smallWeightsRecipe)
	model := shared.Path(t, "stories260K-hf")
	inputs := []string{model, shared.Path(t, "tinystories-valid")}
	before := hashTree(t, inputs...)

	outA := filepath.Join(dir, "a.lmpk")
	repA, err := Run(t.Context(), testOptions(t, r, outA, filepath.Join(dir, "workA")))
	if err != nil {
		t.Fatal(err)
	}
	if !repA.Written || repA.Gate == nil || !repA.Gate.Passed || repA.KVCache != "oscar2" || repA.Eval.KVCache != "oscar2" {
		t.Fatalf("report A: %+v", repA)
	}
	for _, s := range repA.Stages {
		if s.Cached {
			t.Errorf("fresh run: stage %s cached", s.Name)
		}
	}

	outB := filepath.Join(dir, "b.lmpk")
	workB := filepath.Join(dir, "workB")
	interrupt := func(stage string) {
		t.Helper()
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		o := testOptions(t, r, outB, workB)
		hit := false
		o.Progress = func(s string, done, total int) {
			if s == stage && done < total && !hit {
				hit = true
				cancel()
			}
		}
		_, err := Run(ctx, o)
		if !errors.Is(err, context.Canceled) || !hit {
			t.Fatalf("interrupted in %s: err %v, hook hit %v", stage, err, hit)
		}
		// A cancelled stage removes its temporary directory (a killed one
		// leaves it for the next run to remove: cmd/lmpack.TestCompressKilled).
		if tmp, _ := filepath.Glob(filepath.Join(workB, ".*.tmp-*")); len(tmp) != 0 {
			t.Fatalf("after the interrupt in %s: temporary dirs %v left behind", stage, tmp)
		}
		if _, err := os.Stat(outB); !os.IsNotExist(err) {
			t.Fatalf("output written by an interrupted run: %v", err)
		}
	}
	interrupt("calibrate")
	interrupt("quantize-weights")
	interrupt("eval")
	repB, err := Run(t.Context(), testOptions(t, r, outB, workB))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"calibrate": true, "quantize-weights": true, "quantize-kv": true, "pack": true, "eval": false}
	if got := cachedStages(repB); !mapsEqual(got, want) {
		t.Errorf("resumed run cached stages %v, want %v", got, want)
	}
	if tmp, _ := filepath.Glob(filepath.Join(workB, ".*.tmp-*")); len(tmp) != 0 {
		t.Errorf("temporary dirs left after the resumed run: %v", tmp)
	}

	outC := filepath.Join(dir, "c.lmpk")
	if _, err := Run(t.Context(), testOptions(t, r, outC, filepath.Join(dir, "workC"))); err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(outA)
	b, _ := os.ReadFile(outB)
	c, _ := os.ReadFile(outC)
	if len(a) == 0 || !bytes.Equal(a, b) || !bytes.Equal(a, c) {
		t.Fatalf("artifacts differ: uninterrupted %d bytes, resumed %d (equal %v), second run %d (equal %v)",
			len(a), len(b), bytes.Equal(a, b), len(c), bytes.Equal(a, c))
	}
	if *repA.Eval != *repB.Eval {
		t.Errorf("eval differs: %+v vs %+v", *repA.Eval, *repB.Eval)
	}
	if after := hashTree(t, inputs...); !mapsEqual(before, after) {
		t.Errorf("input files changed")
	}
	vr, err := pack.Verify(outA)
	if err != nil {
		t.Fatal(err)
	}
	if vr.SHA256 != repA.SHA256 || vr.Bytes != repA.Sizes.ArtifactBytes {
		t.Errorf("report sha256 %s, %d bytes; verify %s, %d", repA.SHA256, repA.Sizes.ArtifactBytes, vr.SHA256, vr.Bytes)
	}
	rd, err := pack.Open(outA)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	m := rd.Manifest()
	if m.KV == nil || m.KV.Cache != "oscar2" || m.KV.Sink != 8 || m.KV.Recent != 32 || len(m.KV.Rotations) != 5 {
		t.Errorf("manifest kv %+v", m.KV)
	}
	nq := 0
	for _, e := range m.Tensors {
		if e.Quant != nil && e.Quant.Bits == 4 {
			nq++
		}
	}
	if nq != 35 || m.WeightsMethod != "gptq" || m.FormatVersion != 2 {
		t.Errorf("manifest: %d 4-bit tensors, want 35; weights_method %q, format %d", nq, m.WeightsMethod, m.FormatVersion)
	}
	if m.Provenance.SourceModelFingerprint != repA.ModelFingerprint || !strings.Contains(string(m.Provenance.Recipe), `"cache":"oscar2"`) ||
		!strings.Contains(string(m.Provenance.Recipe), `"weights":{"method":"gptq","bits":4,"group":32,"act_order":true}`) ||
		strings.Contains(string(m.Provenance.Recipe), "max_windows") {
		t.Errorf("provenance %+v", m.Provenance)
	}
	z := repA.Sizes
	t.Logf("sizes %+v; eval %+v", z, *repA.Eval)
	// 35 weights of 226560 parameters at 4-bit g32 (5 bits per weight
	// with scales and zero-points, down_proj per-channel), the rest fp32.
	// Parameters as lmpack inspect counts them: 260032 (the tied lm_head
	// copy is not a parameter).
	if z.SourceParams != 260032 || z.Params != 260032 || !(z.BitsPerWeight > 8 && z.BitsPerWeight < 16) || z.LZ4SavedBytes <= 0 ||
		z.ArtifactBytes != int64(len(a)) || z.ArtifactBytes*2 > z.SourceTensorBytes {
		t.Errorf("sizes %+v", z)
	}
	if repA.WeightsMethod != "gptq" || !(repA.WeightsBitsPerWeight > 4 && repA.WeightsBitsPerWeight <= 5.5) {
		t.Errorf("report weights %q %.3f bits per weight", repA.WeightsMethod, repA.WeightsBitsPerWeight)
	}
	if e := repA.Eval; e.Windows != 2 || e.TokensScored != 510 || !(e.KL > 0) || !(e.DeltaPPL != 0) || !(e.KVBitsPerElement > 2 && e.KVBitsPerElement < 32) {
		t.Errorf("eval %+v", *e)
	}
}

func mapsEqual[K comparable, V comparable](a, b map[K]V) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// TestCompressRecipeChange: changing one recipe section recomputes that
// stage and the later ones only; a gate threshold recomputes nothing.
func TestCompressRecipeChange(t *testing.T) {
	dir := t.TempDir()
	work := filepath.Join(dir, "work")
	out := filepath.Join(dir, "m.lmpk")
	if _, err := Run(t.Context(), testOptions(t, mustRecipe(t, smallRecipe), out, work)); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, from, to string
		want           map[string]bool
	}{
		{"eval windows", "max_windows: 2", "max_windows: 1", map[string]bool{"calibrate": true, "quantize-kv": true, "pack": true, "eval": false}},
		{"gate only", "max_kl: 10", "max_kl: 20", map[string]bool{"calibrate": true, "quantize-kv": true, "pack": true, "eval": true}},
		{"kv window", "recent: 32", "recent: 16", map[string]bool{"calibrate": true, "quantize-kv": false, "pack": false, "eval": false}},
		{"lz4", "lz4: true", "lz4: false", map[string]bool{"calibrate": true, "quantize-kv": true, "pack": false, "eval": false}},
		{"calibration", "tokens: 1024", "tokens: 768", map[string]bool{"calibrate": false, "quantize-kv": false, "pack": false, "eval": false}},
	} {
		src := strings.Replace(smallRecipe, c.from, c.to, 1)
		rep, err := Run(t.Context(), testOptions(t, mustRecipe(t, src), out, work))
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got := cachedStages(rep); !mapsEqual(got, c.want) {
			t.Errorf("%s: cached %v, want %v", c.name, got, c.want)
		}
	}
	// The original recipe is still fully cached.
	rep, err := Run(t.Context(), testOptions(t, mustRecipe(t, smallRecipe), out, work))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range rep.Stages {
		if !s.Cached {
			t.Errorf("rerun of the first recipe: stage %s recomputed", s.Name)
		}
	}
	// A finished stage whose output file was deleted is recomputed (and
	// the later stages reused, their keys being unchanged).
	kv := rep.Stages[1]
	if err := os.Remove(filepath.Join(work, "quantize-kv-"+kv.Key[:24], "rot.safetensors")); err != nil {
		t.Fatal(err)
	}
	rep, err = Run(t.Context(), testOptions(t, mustRecipe(t, smallRecipe), out, work))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := cachedStages(rep), map[string]bool{"calibrate": true, "quantize-kv": false, "pack": true, "eval": true}; !mapsEqual(got, want) {
		t.Errorf("after deleting the rotation file: cached %v, want %v", got, want)
	}
}

// TestCompressGate: a ΔPPL or KL above the recipe's bound is ErrGate with
// the report (gate failures named) and no output file; the prune recipe
// yields a 4-layer artifact with fewer parameters.
func TestCompressGate(t *testing.T) {
	dir := t.TempDir()
	src := strings.Replace(smallRecipe, "max_kl: 10", "max_kl: 0.0001", 1)
	src = strings.Replace(src, "max_delta_ppl_pct: 100000", "max_delta_ppl_pct: 10000000", 1)
	src = strings.Replace(src, "quantize:", "prune:\n  layers: 1\nquantize:", 1)
	out := filepath.Join(dir, "m.lmpk")
	rep, err := Run(t.Context(), testOptions(t, mustRecipe(t, src), out, filepath.Join(dir, "work")))
	if !errors.Is(err, ErrGate) || rep == nil || rep.Gate.Passed || rep.Written || len(rep.Gate.Failures) != 1 ||
		!strings.Contains(rep.Gate.Failures[0], "exceeds max_kl 0.0001") {
		if rep != nil {
			t.Fatalf("err %v, gate %+v, written %v", err, rep.Gate, rep.Written)
		}
		t.Fatalf("err %v, no report", err)
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Errorf("output written despite the failed gate: %v", err)
	}
	if rep.Sizes.Params >= rep.Sizes.SourceParams || rep.Sizes.ArtifactBytes >= rep.Sizes.SourceTensorBytes {
		t.Errorf("pruned sizes %+v", rep.Sizes)
	}
	rd, err := pack.Open(filepath.Join(dir, "work", "pack-"+rep.Stages[3].Key[:24], "model.lmpk"))
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	if n := len(rd.Manifest().Model.Layers); n != 4 || len(rd.Manifest().KV.Rotations) != 4 {
		t.Errorf("pruned artifact: %d layers, %d rotations; want 4", n, len(rd.Manifest().KV.Rotations))
	}
}

// TestCompressKVMixed: a recipe with cache oscar-mixed and kv_bits runs
// the clip search and the width DP in its quantize-kv stage, and the
// artifact carries per-layer widths in {2, 4, 8} whose average cost
// (b + 32/head_dim bits per side: fp16 scale and zero per row; the
// windows only add to the DP's figure) stays within kv_bits. stories260K
// has head_dim 8, so the all-2-bit cost is 6 bits and kv_bits 7 leaves
// room for at least one wider side, which the DP must use.
func TestCompressKVMixed(t *testing.T) {
	dir := t.TempDir()
	src := strings.Replace(smallRecipe, "    cache: oscar2\n", "    cache: oscar-mixed\n    kv_bits: 7\n    clip_search: true\n    search_tokens: 256\n", 1)
	out := filepath.Join(dir, "m.lmpk")
	rep, err := Run(t.Context(), testOptions(t, mustRecipe(t, src), out, filepath.Join(dir, "work")))
	if err != nil {
		t.Fatal(err)
	}
	if rep.KVCache != "oscar-mixed" || !rep.Written {
		t.Fatalf("report: cache %q written %v", rep.KVCache, rep.Written)
	}
	rd, err := pack.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	kv := rd.Manifest().KV
	layers := len(rd.Manifest().Model.Layers)
	if kv.Cache != "oscar-mixed" || len(kv.BitsK) != layers || len(kv.BitsV) != layers || len(kv.Rotations) != layers {
		t.Fatalf("manifest KV %+v", kv)
	}
	// Bits per element of the chosen widths at the serving context (no
	// windows here are amortised to nothing but the 8+32 of the recipe):
	// each side costs b + 32/head_dim bits (fp16 scale and zero per row).
	hd := rd.Manifest().Model.Layers[0].HeadDim
	var sum float64
	wider := 0
	for i := range layers {
		for _, b := range []int{kv.BitsK[i], kv.BitsV[i]} {
			if b != 2 && b != 4 && b != 8 {
				t.Fatalf("layer %d width %d", i, b)
			}
			if b > 2 {
				wider++
			}
			sum += float64(b) + 32/float64(hd)
		}
	}
	avg := sum / float64(2*layers)
	if avg > 7+1e-9 {
		t.Errorf("average %.4f bits/element of the widths above kv_bits 7 (widths K %v V %v)", avg, kv.BitsK, kv.BitsV)
	}
	// The report's figure at the serving context (default 32768): the
	// widths' average over the quantized tokens and the 8+32 fp16 window
	// tokens at 16 bits, every layer of the same kvDim; within kv_bits,
	// the budget the DP chose the widths for at that context.
	serving := (40*16 + (32768-40)*avg) / 32768
	if e := rep.Eval; e.ServingCtx != 32768 || math.Abs(e.KVBitsPerElementServing-serving) > 1e-12*serving ||
		rep.KVServingCtx != 32768 || rep.KVBitsPerElementServing != e.KVBitsPerElementServing || !(e.KVBitsPerElementServing <= 7) {
		t.Errorf("kv bits/element at serving context %d: %v (report %d: %v), want %v (widths K %v V %v)",
			e.ServingCtx, e.KVBitsPerElementServing, rep.KVServingCtx, rep.KVBitsPerElementServing, serving, kv.BitsK, kv.BitsV)
	}
	// At the eval context (256 tokens, measured) the windows weigh more.
	if want := (40*16 + (256-40)*avg) / 256; math.Abs(rep.Eval.KVBitsPerElement-want) > 1e-12*want {
		t.Errorf("kv bits/element at the eval context %d: %v, want %v", rep.Eval.Ctx, rep.Eval.KVBitsPerElement, want)
	}
	if wider == 0 {
		t.Errorf("kv_bits 7 above the all-2-bit cost %.2f gave no wider side (K %v V %v)", 2+32/float64(hd), kv.BitsK, kv.BitsV)
	}
	if len(kv.ClipK) != layers {
		t.Errorf("clip search recorded %d 2-bit K ratios for %d layers", len(kv.ClipK), layers)
	}
}

// TestCompressRefusesModelDir: a work directory inside the model
// directory is refused before any stage runs.
func TestCompressRefusesModelDir(t *testing.T) {
	o := testOptions(t, mustRecipe(t, smallRecipe), filepath.Join(t.TempDir(), "m.lmpk"), "")
	o.WorkDir = filepath.Join(o.Model, "work")
	_, err := Run(t.Context(), o)
	if err == nil || !strings.Contains(err.Error(), "inside the model directory") {
		t.Fatalf("got %v", err)
	}
	if _, err := os.Stat(o.WorkDir); !os.IsNotExist(err) {
		t.Fatalf("work dir created inside the model directory")
	}
}

// kvWrap is a model whose NewCache builds a given KV cache scheme.
type kvWrap struct {
	runtime.Model
	method string
	layers []kvcache.Layer
	opt    kvcache.Options
}

// NewCache builds the cache as the artifact does (its eval feeds it
// decode-faithful).
func (m *kvWrap) NewCache(capacity int) runtime.KVCache {
	c, err := kvcache.New(m.method, m.layers, capacity, m.opt)
	if err != nil {
		panic(err)
	}
	return c
}

// TestCompressWeightsEvalMatchesCheckpoint: the eval stage's result for
// the w4 + oscar2 artifact equals, field for field, the comparison of the
// source with the quantize-weights stage's checkpoint run with the
// quantize-kv stage's rotations and the recipe's windows; the artifact's
// and that checkpoint's logits are identical.
func TestCompressWeightsEvalMatchesCheckpoint(t *testing.T) {
	dir := t.TempDir()
	work := filepath.Join(dir, "work")
	o := testOptions(t, mustRecipe(t, smallWeightsRecipe), filepath.Join(dir, "m.lmpk"), work)
	rep, err := Run(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	keyOf := map[string]string{}
	for _, s := range rep.Stages {
		keyOf[s.Name] = s.Key[:24]
	}
	qdir := filepath.Join(work, "quantize-weights-"+keyOf["quantize-weights"], "model")
	rotPath := filepath.Join(work, "quantize-kv-"+keyOf["quantize-kv"], "rot.safetensors")
	ck, err := engine.Open(t.Context(), qdir, engine.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	if ck.Desc.Quant == nil || len(ck.Desc.Quant.Tensors) != 35 {
		t.Fatalf("stage checkpoint %s: quantization %+v", qdir, ck.Desc.Quant)
	}
	fp, err := model.Fingerprint(qdir, ck.Checkpoint)
	if err != nil {
		t.Fatal(err)
	}
	rot, _, err := oscar.ReadFile(rotPath, model.Expect{ModelFingerprint: fp, Desc: ck.Desc})
	if err != nil {
		t.Fatal(err)
	}
	kr := kvcache.Rotations(*rot)
	ck.Model = &kvWrap{Model: ck.Model, method: "oscar2", layers: kvcache.LayersOf(ck.Desc), opt: kvcache.Options{Rotations: &kr, Sink: 8, Recent: 32}}
	ck.KVCache = "oscar2"
	src, err := engine.Open(t.Context(), o.Model, engine.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	ids, err := src.EvalIDs(o.EvalData, 256)
	if err != nil {
		t.Fatal(err)
	}
	want, err := compareModels(t.Context(), src, ck, ids, 256, 2, 0, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The artifact's figure at the serving context (its manifest's
	// scheme), which compareModels leaves to the eval stage.
	want.ServingCtx, want.KVBitsPerElementServing = 32768, oscar2Serving
	t.Logf("artifact eval %+v; weights bpw %.3f", *rep.Eval, rep.WeightsBitsPerWeight)
	if *rep.Eval != *want {
		t.Errorf("artifact eval %+v\nquantized checkpoint + oscar2 %+v", *rep.Eval, *want)
	}
	art, err := engine.Open(t.Context(), o.Out, engine.Options{Threads: 1, Artifacts: true})
	if err != nil {
		t.Fatal(err)
	}
	defer art.Close()
	V := ck.Desc.VocabSize
	a, b := make([]float32, 256*V), make([]float32, 256*V)
	// Both fed one token per call, as the eval stage feeds the artifact.
	for _, x := range []struct {
		m   runtime.Model
		out []float32
	}{{art.Model, a}, {ck.Model, b}} {
		if err := eval.TeacherForce(t.Context(), x.m, [][]int{ids[:256]}, []runtime.KVCache{x.m.NewCache(256)}, [][]float32{x.out}, 0, 1); err != nil {
			t.Fatal(err)
		}
	}
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("logit %d: artifact %v, stage checkpoint %v", i, a[i], b[i])
		}
	}
}

// TestCompressMoEMixed: the moe-mixed recipe (GEMQ expert widths under a
// bits-per-expert-weight budget) runs on stories260K-moe-hf; the experts
// meet the budget with widths in 1..4 bits, and the artifact's eval
// equals that of the stage's quantized checkpoint.
func TestCompressMoEMixed(t *testing.T) {
	if testing.Short() {
		t.Skip("MoE compress run (about 20 s on 2 cores)")
	}
	r, err := LoadRecipe(filepath.Join("..", "recipes", "moe-mixed.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	r.Calibrate.Tokens = 4096
	// This test checks the pipeline, not the recipe's gate (which
	// stories260K-moe-hf does not meet, as the recipe's comment says).
	r.Eval.MaxDeltaPPLPct, r.Eval.MaxKL = 0, 0
	dir := t.TempDir()
	o := testOptions(t, r, filepath.Join(dir, "moe.lmpk"), filepath.Join(dir, "work"))
	o.Model = shared.Path(t, "stories260K-moe-hf")
	// A budget of one MoE layer's statistics: one calibration pass per
	// MoE layer (calibrate.max_expert_memory reaches calibrate.Run).
	d, err := arch.Load(o.Model)
	if err != nil {
		t.Fatal(err)
	}
	var one int64
	moeLayers := 0
	for l := range d.Layers {
		if b := calibrate.ExpertLayerBytes(d, l); b > 0 {
			one = max(one, b)
			moeLayers++
		}
	}
	r.Calibrate.MaxExpertMemory = &one
	rep, err := Run(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	var ws weightsSummary
	var cs calibrate.Summary
	for _, s := range rep.Stages {
		switch s.Name {
		case "quantize-weights":
			if err := json.Unmarshal(s.Result, &ws); err != nil {
				t.Fatal(err)
			}
		case "calibrate":
			if err := json.Unmarshal(s.Result, &cs); err != nil {
				t.Fatal(err)
			}
		}
	}
	if moeLayers < 2 || cs.ExpertPasses != moeLayers {
		t.Errorf("calibrate stage: %d expert passes under a one-layer budget of %d bytes, want one per MoE layer (%d)", cs.ExpertPasses, one, moeLayers)
	}
	t.Logf("experts %.4f bits per weight (budget %.1f), all weights %.4f; eval %+v", ws.ExpertBitsPerWeight, ws.MoEBudget, rep.WeightsBitsPerWeight, *rep.Eval)
	if rep.ExpertBitsPerWeight != ws.ExpertBitsPerWeight {
		t.Errorf("report expert bits per weight %v, stage %v", rep.ExpertBitsPerWeight, ws.ExpertBitsPerWeight)
	}
	if ws.MoEBudget != 3 || !(ws.ExpertBitsPerWeight > 1 && ws.ExpertBitsPerWeight <= 3) {
		t.Errorf("expert bits per weight %v, want in (1, 3] under budget %v", ws.ExpertBitsPerWeight, ws.MoEBudget)
	}
	qdir := filepath.Join(o.WorkDir, "quantize-weights-"+rep.Stages[1].Key[:24], "model")
	ck, err := engine.Open(t.Context(), qdir, engine.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	widths := map[int]bool{}
	for name, q := range ck.Desc.Quant.Tensors {
		if strings.Contains(name, ".experts.") {
			widths[q.Bits] = true
			if q.Bits < 1 || q.Bits > 4 {
				t.Errorf("%s: %d bits, want 1..4", name, q.Bits)
			}
		}
	}
	if len(widths) < 2 {
		t.Errorf("expert widths %v: want a mix under the budget", widths)
	}
	src, err := engine.Open(t.Context(), o.Model, engine.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	ids, err := src.EvalIDs(o.EvalData, rep.Eval.Ctx)
	if err != nil {
		t.Fatal(err)
	}
	want, err := compareModels(t.Context(), src, ck, ids, rep.Eval.Ctx, r.Eval.MaxWindows, r.Eval.KVPrompt, r.Eval.KVChunk, nil)
	if err != nil {
		t.Fatal(err)
	}
	// No KV scheme: the float32 cache, 32 bits at any context.
	want.ServingCtx, want.KVBitsPerElementServing = 32768, 32
	if *rep.Eval != *want {
		t.Errorf("artifact eval %+v\nquantized checkpoint %+v", *rep.Eval, *want)
	}
}

// TestCompressCorruptCache: a cached stage whose outputs are corrupt is
// recomputed, with every later stage, instead of being published: a byte
// flipped in the cached artifact, the cached artifact truncated, a shard
// of the quantized model deleted. Each rerun writes an artifact that
// verifies and is byte-identical to the first run's.
func TestCompressCorruptCache(t *testing.T) {
	dir := t.TempDir()
	work := filepath.Join(dir, "work")
	out := filepath.Join(dir, "m.lmpk")
	src := strings.Replace(smallRecipe, "quantize:\n", "quantize:\n  weights:\n    method: rtn\n    bits: 4\n    group: 32\n", 1)
	r := mustRecipe(t, src)
	rep, err := Run(t.Context(), testOptions(t, r, out, work))
	if err != nil {
		t.Fatal(err)
	}
	first, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if sum := sha256.Sum256(first); rep.SHA256 != hex.EncodeToString(sum[:]) || rep.ContentSHA256 == "" || rep.ContentSHA256 == rep.SHA256 {
		t.Errorf("report sha256 %s, content %s; the file's sha256 is %x", rep.SHA256, rep.ContentSHA256, sum)
	}
	// Parameters agree with lmpack inspect (stories260K ties lm_head to
	// the embedding and stores a copy, which is not a parameter and is
	// not packed).
	ins, err := engine.InspectModel(t.Context(), shared.Path(t, "stories260K-hf"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Sizes.SourceParams != ins.Params || rep.Sizes.Params != ins.Params {
		t.Errorf("params: source %d, artifact %d; inspect says %d", rep.Sizes.SourceParams, rep.Sizes.Params, ins.Params)
	}
	stageDir := func(rep *Report, name string) string {
		for _, s := range rep.Stages {
			if s.Name == name {
				return filepath.Join(work, name+"-"+s.Key[:24])
			}
		}
		t.Fatalf("no stage %s", name)
		return ""
	}
	art := filepath.Join(stageDir(rep, "pack"), "model.lmpk")
	for _, c := range []struct {
		name    string
		corrupt func()
		want    map[string]bool
	}{
		{"flipped byte", func() {
			b, err := os.ReadFile(art)
			if err != nil {
				t.Fatal(err)
			}
			b[len(b)/2] ^= 0x40
			if err := os.WriteFile(art, b, 0o644); err != nil {
				t.Fatal(err)
			}
		}, map[string]bool{"calibrate": true, "quantize-weights": true, "quantize-kv": true, "pack": false, "eval": false}},
		{"truncated artifact", func() {
			if err := os.Truncate(art, 1000); err != nil {
				t.Fatal(err)
			}
		}, map[string]bool{"calibrate": true, "quantize-weights": true, "quantize-kv": true, "pack": false, "eval": false}},
		{"deleted shard", func() {
			m := filepath.Join(stageDir(rep, "quantize-weights"), "model")
			shards, err := filepath.Glob(filepath.Join(m, "*.safetensors"))
			if err != nil || len(shards) == 0 {
				t.Fatalf("no shards in %s: %v", m, err)
			}
			if err := os.Remove(shards[0]); err != nil {
				t.Fatal(err)
			}
		}, map[string]bool{"calibrate": true, "quantize-weights": false, "quantize-kv": false, "pack": false, "eval": false}},
	} {
		c.corrupt()
		if err := os.Remove(out); err != nil {
			t.Fatal(err)
		}
		rep2, err := Run(t.Context(), testOptions(t, r, out, work))
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got := cachedStages(rep2); !mapsEqual(got, c.want) {
			t.Errorf("%s: cached %v, want %v", c.name, got, c.want)
		}
		if _, err := pack.Verify(out); err != nil {
			t.Errorf("%s: published artifact: %v", c.name, err)
		}
		if b, err := os.ReadFile(out); err != nil || !bytes.Equal(b, first) {
			t.Errorf("%s: artifact differs from the first run's (%v)", c.name, err)
		}
	}
}

// TestCompressGateOlderOutput: when the gate fails and a file from an
// earlier run is at the output path, the error says that older file is
// left unchanged, and it is.
func TestCompressGateOlderOutput(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "m.lmpk")
	old := []byte("an older artifact")
	if err := os.WriteFile(out, old, 0o644); err != nil {
		t.Fatal(err)
	}
	src := strings.Replace(smallRecipe, "max_kl: 10", "max_kl: 0.000000001", 1)
	_, err := Run(t.Context(), testOptions(t, mustRecipe(t, src), out, filepath.Join(dir, "work")))
	if !errors.Is(err, ErrGate) || !strings.Contains(err.Error(), "an older file at "+out+" is left unchanged") {
		t.Fatalf("err %v, want ErrGate saying the older file is left unchanged", err)
	}
	if b, err := os.ReadFile(out); err != nil || !bytes.Equal(b, old) {
		t.Errorf("older output changed: %q, %v", b, err)
	}
}

// TestCompressModelMismatch: a moe_budget on a dense model, a target_bpw
// on an MoE model, a sparsity the model cannot reach and head_refit with
// a sparsity that removes no head are refused before any stage runs (no
// work directory is created), naming the recipe key.
func TestCompressModelMismatch(t *testing.T) {
	moeRecipe, err := LoadRecipe(filepath.Join("..", "recipes", "moe-mixed.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	o := testOptions(t, moeRecipe, filepath.Join(dir, "a.lmpk"), filepath.Join(dir, "work-a"))
	o.RecipePath = "moe-mixed.yaml"
	if _, err := Run(t.Context(), o); !errors.Is(err, ErrRecipe) || !strings.Contains(err.Error(), "quantize.weights.moe_budget") || !strings.Contains(err.Error(), "dense model") {
		t.Errorf("moe_budget on a dense model: %v", err)
	}
	bpw := mustRecipe(t, strings.Replace(smallWeightsRecipe, "bits: 4\n    group: 32\n", "target_bpw: 4\n", 1))
	o = testOptions(t, bpw, filepath.Join(dir, "b.lmpk"), filepath.Join(dir, "work-b"))
	o.Model = shared.Path(t, "stories260K-moe-hf")
	if _, err := Run(t.Context(), o); !errors.Is(err, ErrRecipe) || !strings.Contains(err.Error(), "quantize.weights.target_bpw") {
		t.Errorf("target_bpw on an MoE model: %v", err)
	}
	// A sparsity the model cannot reach, and head_refit with a sparsity
	// that removes no head group on stories260K (0.2: FFN nodes only).
	for _, c := range []struct{ work, prune, want string }{
		{"work-c", "prune:\n  sparsity: 0.95\n", "prune.sparsity: prune: bad options: sparsity 0.95"},
		{"work-d", "prune:\n  sparsity: 0.2\n  head_refit: true\n", "prune.head_refit: prune.sparsity 0.2 removes no KV head group"},
		{"work-e", "prune:\n  layers: 5\n", "prune.layers 5: want at most 3 of the 5 layers removed"},
		{"work-f", "prune:\n  method: list:1,99\n", `prune.method "list:1,99": want layers the 5-layer model can lose`},
		{"work-g", "prune:\n  method: list:0\n", `prune.method "list:0": want layers the 5-layer model can lose`},
		{"work-h", "prune:\n  ffn_ratio: 0.999999\n", "prune.ffn_ratio 0.999999: want a ratio that keeps some and removes some units of every FFN (layer 0:"},
	} {
		o = testOptions(t, mustRecipe(t, strings.Replace(smallRecipe, "quantize:\n", c.prune+"quantize:\n", 1)), filepath.Join(dir, c.work+".lmpk"), filepath.Join(dir, c.work))
		if _, err := Run(t.Context(), o); !errors.Is(err, ErrRecipe) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want ErrRecipe with %q", strings.TrimSpace(c.prune), err, c.want)
		}
	}
	// Context and KV windows beyond max_position_embeddings (512).
	for _, c := range []struct{ work, from, to, want string }{
		{"work-i", "calibrate:\n  tokens: 1024\n  ctx: 256\n", "calibrate:\n  tokens: 2048\n  ctx: 1024\n", "calibrate.ctx 1024: want at most the model's max_position_embeddings 512"},
		{"work-j", "eval:\n  ctx: 256\n", "eval:\n  ctx: 600\n", "eval.ctx 600: want at most the model's max_position_embeddings 512"},
		{"work-k", "recent: 32\n", "recent: 600\n", "quantize.kv.recent 600: want at most the model's max_position_embeddings 512 tokens (the fp16 recent window must fit the context)"},
		{"work-m", "sink: 8\n", "sink: 600\n", "quantize.kv.sink 600: want at most the model's max_position_embeddings 512 tokens (the fp16 sink window must fit the context)"},
		{"work-n", "sink: 8\n", "sink: 500\n", "quantize.kv.recent 32: want at most 12 tokens: the model's max_position_embeddings 512 less quantize.kv.sink 500 (the two fp16 windows must fit the context together)"},
	} {
		o = testOptions(t, mustRecipe(t, strings.Replace(smallRecipe, c.from, c.to, 1)), filepath.Join(dir, c.work+".lmpk"), filepath.Join(dir, c.work))
		if _, err := Run(t.Context(), o); !errors.Is(err, ErrRecipe) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want ErrRecipe with %q", c.work, err, c.want)
		}
	}
	// A moe_budget below the all-1-bit allocation of stories260K-moe-hf.
	low := mustRecipe(t, strings.Replace(smallWeightsRecipe, "    act_order: true\n", "    act_order: true\n    moe_budget: 0.5\n", 1))
	o = testOptions(t, low, filepath.Join(dir, "work-l.lmpk"), filepath.Join(dir, "work-l"))
	o.Model = shared.Path(t, "stories260K-moe-hf")
	if _, err := Run(t.Context(), o); !errors.Is(err, ErrRecipe) || !strings.Contains(err.Error(), "quantize.weights.moe_budget 0.5: want at least the smallest allocation on this model, every expert at 1 bit") || !strings.Contains(err.Error(), "1.4032") {
		t.Errorf("moe_budget 0.5: %v", err)
	}
	for _, w := range []string{"work-a", "work-b", "work-c", "work-d", "work-e", "work-f", "work-g", "work-h", "work-i", "work-j", "work-k", "work-l", "work-m", "work-n"} {
		if _, err := os.Stat(filepath.Join(dir, w)); !os.IsNotExist(err) {
			t.Errorf("%s created before the recipe was checked against the model", w)
		}
	}
}

// TestCompressInputLengths: data files too short for the recipe (eval.ctx
// × eval.max_windows, calibrate.tokens) are refused before any stage runs
// (no work directory), naming the key and the token counts; the eval gate
// never measures fewer windows than the recipe asks for.
func TestCompressInputLengths(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct{ work, from, to, want string }{
		{"work-a", "max_windows: 2\n", "max_windows: 1000\n", "eval.data"},
		{"work-b", "tokens: 1024\n", "tokens: 100000000\n", "calibrate.data"},
	} {
		r := mustRecipe(t, strings.Replace(smallRecipe, c.from, c.to, 1))
		o := testOptions(t, r, filepath.Join(dir, c.work+".lmpk"), filepath.Join(dir, c.work))
		o.Data, o.EvalData = "", ""
		r.Calibrate.Data, r.Eval.Data = shared.Path(t, "tinystories-valid", "calib.txt"), shared.Path(t, "tinystories-valid", "heldout.txt")
		_, err := Run(t.Context(), o)
		if !errors.Is(err, ErrRecipe) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "tokens, fewer than") {
			t.Errorf("%s → %s: %v, want ErrRecipe naming %s", c.from, c.to, err, c.want)
		}
		if _, err := os.Stat(filepath.Join(dir, c.work)); !os.IsNotExist(err) {
			t.Errorf("%s: work directory created before the inputs were checked", c.work)
		}
	}
}

// TestRecipeCtxFromModel: a recipe without calibrate.ctx and eval.ctx
// parses, and Run's defaults give both min(512, max_position_embeddings)
// of the model: 256 for tiny1m-hf, 512 for stories260K.
func TestRecipeCtxFromModel(t *testing.T) {
	src := strings.ReplaceAll(smallRecipe, "  ctx: 256\n", "")
	r := mustRecipe(t, src)
	if r.Calibrate.Ctx != 0 || r.Eval.Ctx != 0 {
		t.Fatalf("parsed ctx %d, %d; want 0 (from the model)", r.Calibrate.Ctx, r.Eval.Ctx)
	}
	for _, c := range []struct {
		model string
		want  int
	}{{"tiny1m-hf", 256}, {"stories260K-hf", 512}} {
		d, err := arch.Load(shared.Path(t, c.model))
		if err != nil {
			t.Fatal(err)
		}
		got := r.withModelDefaults(d)
		if got.Calibrate.Ctx != c.want || got.Eval.Ctx != c.want || r.Calibrate.Ctx != 0 {
			t.Errorf("%s: ctx %d, %d (recipe %d); want %d", c.model, got.Calibrate.Ctx, got.Eval.Ctx, r.Calibrate.Ctx, c.want)
		}
	}
}
