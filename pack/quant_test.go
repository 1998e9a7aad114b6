package pack_test

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/calibrate"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/internal/engine"
	"github.com/lmpack/lmpack/internal/shared"
	"github.com/lmpack/lmpack/model"
	. "github.com/lmpack/lmpack/pack"
	"github.com/lmpack/lmpack/prune"
	"github.com/lmpack/lmpack/quantize/oscar"
	"github.com/lmpack/lmpack/quantize/wquant"
	"github.com/lmpack/lmpack/runtime"
	"github.com/lmpack/lmpack/runtime/kvcache"
)

// quantizedStories writes a 4-bit group-32 RTN (asymmetric) copy of
// stories260K into dir/q (calibrated on 1024 tokens of calib.txt).
func quantizedStories(t *testing.T, dir string, method string, actOrder bool) string {
	t.Helper()
	model := shared.Path(t, "stories260K-hf")
	calib := filepath.Join(dir, "calib-src.safetensors")
	if _, err := calibrate.Run(t.Context(), calibrate.Options{Model: model, Data: shared.Path(t, "tinystories-valid", "calib.txt"),
		Tokens: 1024, Ctx: 256, Out: calib, Threads: 1, Version: "test"}); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "q")
	if _, err := wquant.Run(t.Context(), wquant.Options{Model: model, Calib: calib, Out: out, Method: method,
		Bits: 4, GroupSize: 32, ActOrder: actOrder, Threads: 1, Version: "test"}); err != nil {
		t.Fatal(err)
	}
	return out
}

// forwardLogits runs ids through m with cache c and returns the logits
// [len(ids), vocab].
func forwardLogits(t *testing.T, m runtime.Model, ids []int, c runtime.KVCache, vocab int) []float32 {
	t.Helper()
	out := make([]float32, len(ids)*vocab)
	if err := m.Forward(t.Context(), ids, c, out, true); err != nil {
		t.Fatal(err)
	}
	return out
}

func tensorBytes(t *testing.T, dir string) int64 {
	t.Helper()
	ck, err := safetensors.OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	var n int64
	for _, name := range ck.Names() {
		x, err := ck.Tensor(name)
		if err != nil {
			t.Fatal(err)
		}
		n += int64(len(x.Data))
	}
	return n
}

// TestQuantizedArtifactOSCAR2 is issue #6's acceptance for the stories260K
// artifact with 4-bit weights (GPTQ act-order, group 32) and an oscar2 KV
// cache: the artifact's logits over 96 tokens equal bit for bit those of
// the quantized checkpoint run with kvcache.New("oscar2") and the same
// rotation file (computed on the quantized model); every storage tensor
// is consumed; the manifest records each weight's format; the artifact is
// smaller than the fp32 checkpoint (sizes logged).
func TestQuantizedArtifactOSCAR2(t *testing.T) {
	dir := t.TempDir()
	qdir := quantizedStories(t, dir, wquant.MethodGPTQ, true)
	rotPath := rotationFile(t, qdir, dir)
	a, err := FromCheckpoint(qdir, FromOptions{KVRotations: rotPath, KVSink: 4, KVRecent: 16, LmpackVersion: "test"})
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "m.lmpk")
	_, err = Write(out, a, WriteOptions{})
	a.Close()
	if err != nil {
		t.Fatal(err)
	}
	if rep, err := Verify(out); err != nil || !rep.OK {
		t.Fatalf("verify: %v %+v", err, rep)
	}
	r, err := Open(out)
	if err != nil {
		t.Fatal(err)
	}
	m := r.Manifest()
	nq, perms := 0, 0
	for _, e := range m.Tensors {
		if e.Quant == nil {
			continue
		}
		nq++
		q := e.Quant
		if q.Bits != 4 || q.ScaleDType != "F16" || q.ZeroDType != "F16" || q.PackingOrder != PackingLSBFirst || e.DType != "U8" ||
			!strings.HasSuffix(e.Section, ".qweight") || q.ZeroSection == "" {
			t.Errorf("tensor %s: %+v %+v", e.Name, e, *q)
		}
		if q.GroupSize != 32 && q.GroupSize != e.Shape[1] {
			t.Errorf("tensor %s: group %d, want 32 or per-channel %d", e.Name, q.GroupSize, e.Shape[1])
		}
		if q.PermSection != "" {
			perms++
		}
	}
	if nq != 5*7 || perms == 0 || m.FormatVersion != 2 || m.WeightsMethod != "gptq" {
		t.Errorf("%d quantized tensors (want 35), %d with a permutation, format %d, method %q", nq, perms, m.FormatVersion, m.WeightsMethod)
	}
	r.Close()

	ea, err := engine.Open(t.Context(), out, engine.Options{Threads: 1, Artifacts: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ea.Close()
	if ea.KVCache != "oscar2" || ea.Desc.Quant == nil || len(ea.Desc.Quant.Tensors) != nq {
		t.Fatalf("engine KVCache %q, quant %v", ea.KVCache, ea.Desc.Quant)
	}
	for _, n := range ea.Artifact.Unconsumed() {
		if n != "lm_head.weight" || !ea.Desc.TieWordEmbeddings {
			t.Fatalf("tensor %q unconsumed after load", n)
		}
	}
	ec, err := engine.Open(t.Context(), qdir, engine.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer ec.Close()
	fp, err := model.Fingerprint(qdir, ec.Checkpoint)
	if err != nil {
		t.Fatal(err)
	}
	rot, _, err := oscar.ReadFile(rotPath, model.Expect{ModelFingerprint: fp, Desc: ec.Desc})
	if err != nil {
		t.Fatal(err)
	}
	kr := kvcache.Rotations(*rot)
	const n = 96
	ids, err := ec.EvalIDs(shared.Path(t, "tinystories-valid", "heldout.txt"), n)
	if err != nil {
		t.Fatal(err)
	}
	ids = ids[:n]
	V := ec.Desc.VocabSize
	c, err := kvcache.New("oscar2", kvcache.LayersOf(ec.Desc), n, kvcache.Options{Rotations: &kr, Sink: 4, Recent: 16})
	if err != nil {
		t.Fatal(err)
	}
	want := forwardLogits(t, ec.Model, ids, c, V)
	got := forwardLogits(t, ea.Model, ids, ea.Model.NewCache(n), V)
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("logit %d (position %d): artifact %v, quantized checkpoint+oscar2 %v", i, i/V, got[i], want[i])
		}
	}
	// The weights really are the quantized ones: the float checkpoint's
	// logits with the same cache scheme differ.
	ef, err := engine.Open(t.Context(), shared.Path(t, "stories260K-hf"), engine.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer ef.Close()
	f32 := forwardLogits(t, ef.Model, ids, ef.Model.NewCache(n), V)
	diff := 0
	for i := range f32 {
		if f32[i] != got[i] {
			diff++
		}
	}
	if diff < n*V/2 {
		t.Errorf("only %d of %d logits differ from the float model's", diff, n*V)
	}
	st, err := os.Stat(out)
	if err != nil {
		t.Fatal(err)
	}
	fp32 := tensorBytes(t, shared.Path(t, "stories260K-hf"))
	t.Logf("stories260K 4-bit GPTQ g32 + oscar2 artifact: %d bytes; fp32 checkpoint tensors %d bytes (%.2fx smaller); quantized checkpoint tensors %d bytes",
		st.Size(), fp32, float64(fp32)/float64(st.Size()), tensorBytes(t, qdir))
	if st.Size() >= fp32 {
		t.Errorf("artifact %d bytes is not smaller than the fp32 checkpoint's %d tensor bytes", st.Size(), fp32)
	}
}

// TestQuantizedArtifactLoudFailures: a quantized weight whose scales
// section is missing, or of the wrong size, is refused by the writer; a
// storage tensor nobody reads shows in Unconsumed; the weight's own name
// is refused by Tensor; a quantized entry in a version-1 manifest is
// ErrVersion.
func TestQuantizedArtifactLoudFailures(t *testing.T) {
	dir := t.TempDir()
	qdir := quantizedStories(t, dir, wquant.MethodRTN, false)
	const w = "model.layers.0.self_attn.q_proj.weight"
	build := func(edit func(a *Artifact)) (string, error) {
		a, err := FromCheckpoint(qdir, FromOptions{LmpackVersion: "test"})
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		edit(a)
		p := filepath.Join(t.TempDir(), "x.lmpk")
		_, err = Write(p, a, WriteOptions{})
		return p, err
	}
	dropSection := func(a *Artifact, name string) {
		a.Sections = slices.DeleteFunc(a.Sections, func(s Section) bool { return s.Name == name })
	}
	if _, err := build(func(a *Artifact) { dropSection(a, "model.layers.0.self_attn.q_proj.scales") }); !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), "q_proj.scales") {
		t.Errorf("missing scales: %v", err)
	}
	if _, err := build(func(a *Artifact) {
		for i := range a.Sections {
			if a.Sections[i].Name == "model.layers.0.self_attn.q_proj.qzeros" {
				a.Sections[i].Data = a.Sections[i].Data[:len(a.Sections[i].Data)-2]
			}
		}
	}); !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), "q_proj.qzeros") {
		t.Errorf("short qzeros: %v", err)
	}
	if _, err := build(func(a *Artifact) {
		for i := range a.Manifest.Tensors {
			if q := a.Manifest.Tensors[i].Quant; q != nil {
				q.PackingOrder = "msb_first"
			}
		}
	}); !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), "packing_order") {
		t.Errorf("msb_first: %v", err)
	}
	p, err := build(func(*Artifact) {})
	if err != nil {
		t.Fatal(err)
	}
	r, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := r.Tensor(w); !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), "quantized") {
		t.Errorf("Tensor(%s): %v", w, err)
	}
	for _, n := range []string{"model.layers.0.self_attn.q_proj.qweight", "model.layers.0.self_attn.q_proj.scales"} {
		if _, err := r.Tensor(n); err != nil {
			t.Fatal(err)
		}
	}
	un := r.Unconsumed()
	if !slices.Contains(un, "model.layers.0.self_attn.q_proj.qzeros") || slices.Contains(un, "model.layers.0.self_attn.q_proj.scales") || slices.Contains(un, w) {
		t.Errorf("unconsumed after reading qweight and scales: %v", un)
	}
	// A version-1 manifest may not carry quantized tensors.
	m := *r.Manifest()
	m.FormatVersion = 1
	m.WeightsMethod = ""
	b, _ := json.Marshal(&m)
	if _, err := DecodeManifest("x", b); !errors.Is(err, ErrVersion) || !strings.Contains(err.Error(), "format version 2") {
		t.Errorf("v1 manifest with quant: %v", err)
	}
}

// TestPrunedArtifactLogits: a width-pruned stories260K (4 GQA groups and
// 25% of FFN nodes removed: heterogeneous heads and intermediate sizes
// per layer) packs, the manifest keeps each layer's sizes, and the
// artifact's logits equal the pruned checkpoint's bit for bit.
func TestPrunedArtifactLogits(t *testing.T) {
	dir := t.TempDir()
	model := shared.Path(t, "stories260K-hf")
	calib := filepath.Join(dir, "calib.safetensors")
	if _, err := calibrate.Run(t.Context(), calibrate.Options{Model: model, Data: shared.Path(t, "tinystories-valid", "calib.txt"),
		Tokens: 1024, Ctx: 256, Out: calib, Threads: 1, Version: "test"}); err != nil {
		t.Fatal(err)
	}
	pdir := filepath.Join(dir, "pruned")
	if _, err := prune.Run(t.Context(), prune.Options{Model: model, Calib: calib, Out: pdir, HeadGroups: 4, HeadMethod: prune.HeadProxy,
		FFNRatio: 0.25, Threads: 1}); err != nil {
		t.Fatal(err)
	}
	a, err := FromCheckpoint(pdir, FromOptions{LmpackVersion: "test"})
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "p.lmpk")
	_, err = Write(out, a, WriteOptions{})
	a.Close()
	if err != nil {
		t.Fatal(err)
	}
	ea, err := engine.Open(t.Context(), out, engine.Options{Threads: 1, Artifacts: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ea.Close()
	ec, err := engine.Open(t.Context(), pdir, engine.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer ec.Close()
	heads := map[int]bool{}
	for i, l := range ec.Desc.Layers {
		al := ea.Desc.Layers[i]
		if al.NumHeads != l.NumHeads || al.NumKVHeads != l.NumKVHeads || al.MLP.IntermediateSize != l.MLP.IntermediateSize {
			t.Errorf("layer %d: artifact %+v, checkpoint %+v", i, al, l)
		}
		heads[l.NumKVHeads] = true
		if l.MLP.IntermediateSize != 129 {
			t.Errorf("layer %d: intermediate %d, want 129 after pruning", i, l.MLP.IntermediateSize)
		}
	}
	if len(heads) < 2 {
		t.Errorf("KV heads per layer %v: want heterogeneous layers", heads)
	}
	const n = 128
	ids, err := ec.EvalIDs(shared.Path(t, "tinystories-valid", "heldout.txt"), n)
	if err != nil {
		t.Fatal(err)
	}
	ids = ids[:n]
	V := ec.Desc.VocabSize
	want := forwardLogits(t, ec.Model, ids, ec.Model.NewCache(n), V)
	got := forwardLogits(t, ea.Model, ids, ea.Model.NewCache(n), V)
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("logit %d: artifact %v, pruned checkpoint %v", i, got[i], want[i])
		}
	}
}

// TestQuantizedArtifactVersionsAndCorruption: a quantized artifact is
// format version 2 and a plain one version 1; a header version that
// disagrees with the manifest's, or one this lmpack does not read, is
// ErrVersion; a flipped byte in a scales section fails the engine's load
// with ErrChecksum naming the storage tensor, and Verify names the section.
func TestQuantizedArtifactVersionsAndCorruption(t *testing.T) {
	dir := t.TempDir()
	qdir := quantizedStories(t, dir, wquant.MethodRTN, false)
	a, err := FromCheckpoint(qdir, FromOptions{LmpackVersion: "test"})
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "q.lmpk")
	_, err = Write(out, a, WriteOptions{NoCompress: true})
	a.Close()
	if err != nil {
		t.Fatal(err)
	}
	plain, _ := PackStories(t, WriteOptions{})
	orig, _ := os.ReadFile(out)
	pb, _ := os.ReadFile(plain)
	le := binary.LittleEndian
	if v, pv := le.Uint32(orig[OffVersion:]), le.Uint32(pb[OffVersion:]); v != 2 || pv != 1 {
		t.Fatalf("header versions: quantized %d (want 2), plain %d (want 1)", v, pv)
	}
	write := func(b []byte) string {
		p := filepath.Join(t.TempDir(), "c.lmpk")
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	setVersion := func(b []byte, v uint32) []byte {
		b = slices.Clone(b)
		le.PutUint32(b[OffVersion:], v)
		le.PutUint32(b[OffHeaderCRC:], CRC(b[:OffHeaderCRC]))
		return b
	}
	if _, err := Open(write(setVersion(pb, 2))); !errors.Is(err, ErrVersion) || !strings.Contains(err.Error(), "header says 2") {
		t.Errorf("v1 manifest under a v2 header: %v", err)
	}
	if _, err := Open(write(setVersion(orig, 3))); !errors.Is(err, ErrVersion) || !strings.Contains(err.Error(), "reads 1..2") {
		t.Errorf("version 3: %v", err)
	}
	r, err := Open(out)
	if err != nil {
		t.Fatal(err)
	}
	const sec = "model.layers.2.mlp.up_proj.scales"
	off, ok := SectionOffset(r, sec)
	if !ok {
		t.Fatalf("no section %s", sec)
	}
	r.Close()
	b := slices.Clone(orig)
	b[off+1] ^= 0x10
	bad := write(b)
	if _, err := Verify(bad); !errors.Is(err, ErrChecksum) || !strings.Contains(err.Error(), sec) {
		t.Errorf("verify: %v", err)
	}
	if _, err := engine.Open(t.Context(), bad, engine.Options{Threads: 1, Artifacts: true}); !errors.Is(err, ErrChecksum) || !strings.Contains(err.Error(), sec) {
		t.Errorf("engine open of a corrupt scales section: %v", err)
	}
}
