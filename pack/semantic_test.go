package pack_test

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"github.com/lmpack/lmpack/runtime/kvcache"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/calibrate"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/internal/shared"
	. "github.com/lmpack/lmpack/pack"
	"github.com/lmpack/lmpack/quantize/oscar"
	"github.com/lmpack/lmpack/quantize/wquant"
)

// copyDir copies the regular files of src into a new temporary directory.
func copyDir(t *testing.T, src string) string {
	t.Helper()
	dst := t.TempDir()
	es, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range es {
		if e.IsDir() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

// patchTensor rewrites the bytes of tensor name in the checkpoint dir in
// place with edit.
func patchTensor(t *testing.T, dir, name string, edit func(data []byte)) {
	t.Helper()
	ck, err := safetensors.OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	info, file, err := ck.Info(name)
	ck.Close()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	start := 8 + int64(binary.LittleEndian.Uint64(b)) + info.Begin
	edit(b[start : start+info.End-info.Begin])
	if err := os.WriteFile(file, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// patchConfig rewrites config.json of dir with edit applied to its
// lmpack_quantization block.
func patchConfig(t *testing.T, dir string, edit func(q map[string]any)) {
	t.Helper()
	p := filepath.Join(dir, "config.json")
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var c map[string]any
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	edit(c["lmpack_quantization"].(map[string]any))
	if b, err = json.Marshal(c); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestPackRefusesBrokenQuantized: pack refuses a quantized checkpoint the
// runtime could not load (bad scale or zero-point values, a perm that is
// not a permutation, a quantization block that disagrees with the
// tensors, an unknown method), naming the tensor or the field.
func TestPackRefusesBrokenQuantized(t *testing.T) {
	rtn := quantizedStories(t, t.TempDir(), wquant.MethodRTN, false)
	gptq := quantizedStories(t, t.TempDir(), wquant.MethodGPTQ, true)
	const w = "model.layers.1.mlp.down_proj"
	f16 := func(v float32) func([]byte) {
		return func(b []byte) { binary.LittleEndian.PutUint16(b[2:], safetensors.F16FromFloat32(v)) }
	}
	var permName string
	for _, c := range []struct {
		name, src string
		edit      func(d string)
		want      string
	}{
		{"scale NaN", rtn, func(d string) { patchTensor(t, d, w+".scales", f16(float32(math.NaN()))) }, "want finite and > 0"},
		{"scale Inf", rtn, func(d string) { patchTensor(t, d, w+".scales", f16(float32(math.Inf(1)))) }, "want finite and > 0"},
		{"scale 0", rtn, func(d string) { patchTensor(t, d, w+".scales", f16(0)) }, "want finite and > 0"},
		{"scale negative", rtn, func(d string) { patchTensor(t, d, w+".scales", f16(-0.5)) }, "want finite and > 0"},
		{"zero NaN", rtn, func(d string) { patchTensor(t, d, w+".qzeros", f16(float32(math.NaN()))) }, "zero-point"},
		{"perm", gptq, func(d string) {
			patchTensor(t, d, permName, func(b []byte) { copy(b[0:4], b[4:8]) })
		}, "permutation"},
		{"lost entry", rtn, func(d string) {
			patchConfig(t, d, func(q map[string]any) { delete(q["tensors"].(map[string]any), w+".weight") })
		}, "disagree"},
		{"lost perm flag", gptq, func(d string) {
			patchConfig(t, d, func(q map[string]any) {
				delete(q["tensors"].(map[string]any)[strings.TrimSuffix(permName, ".perm")+".weight"].(map[string]any), "perm")
			})
		}, "disagree"},
		{"lost tensors key", rtn, func(d string) { patchConfig(t, d, func(q map[string]any) { delete(q, "tensors") }) }, ""},
		{"symmetric flipped", rtn, func(d string) {
			patchConfig(t, d, func(q map[string]any) {
				q["tensors"].(map[string]any)[w+".weight"].(map[string]any)["symmetric"] = true
			})
		}, "disagree"},
		{"method awq", rtn, func(d string) { patchConfig(t, d, func(q map[string]any) { q["method"] = "awq" }) }, `"awq"`},
	} {
		if c.src == gptq && permName == "" {
			ck, err := safetensors.OpenDir(gptq)
			if err != nil {
				t.Fatal(err)
			}
			for _, n := range ck.Names() {
				if strings.HasSuffix(n, ".perm") {
					permName = n
					break
				}
			}
			ck.Close()
			if permName == "" {
				t.Fatal("act-order GPTQ checkpoint has no .perm tensor")
			}
		}
		d := copyDir(t, c.src)
		c.edit(d)
		a, err := FromCheckpoint(d, FromOptions{LmpackVersion: "test"})
		if err == nil {
			a.Close()
			t.Errorf("%s: packed", c.name)
			continue
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q in the error", c.name, err, c.want)
		}
	}
	// The unedited checkpoints pack.
	for _, src := range []string{rtn, gptq} {
		a, err := FromCheckpoint(src, FromOptions{LmpackVersion: "test"})
		if err != nil {
			t.Fatal(err)
		}
		a.Close()
	}
}

// TestVerifySemantics: Verify reports what a loader would refuse even
// when every checksum matches: an invalid model description, clip ratios
// outside (0, 1], a missing rotation, an unknown cache, windows beyond
// max_position_embeddings, an unknown weights method, a NaN scale.
func TestVerifySemantics(t *testing.T) {
	dir := t.TempDir()
	model := shared.Path(t, "stories260K-hf")
	calib := filepath.Join(dir, "calib.safetensors")
	if _, err := calibrate.Run(t.Context(), calibrate.Options{Model: model, Data: shared.Path(t, "tinystories-valid", "calib.txt"),
		Tokens: 1024, Ctx: 256, Out: calib, Threads: 1, Version: "test"}); err != nil {
		t.Fatal(err)
	}
	rot := filepath.Join(dir, "rot.safetensors")
	if _, err := oscar.QuantizeKV(t.Context(), oscar.KVOptions{Model: model, Calib: calib, Method: oscar.Method,
		ClipK: oscar.DefaultClipK, ClipV: oscar.DefaultClipV, Out: rot, Version: "test"}); err != nil {
		t.Fatal(err)
	}
	qdir := quantizedStories(t, t.TempDir(), wquant.MethodRTN, false)
	build := func(src string, opt FromOptions, edit func(a *Artifact)) string {
		t.Helper()
		opt.LmpackVersion = "test"
		a, err := FromCheckpoint(src, opt)
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		edit(a)
		p := filepath.Join(t.TempDir(), "x.lmpk")
		if _, err := Write(p, a, WriteOptions{}); err != nil {
			t.Fatal(err)
		}
		return p
	}
	kv := FromOptions{KVRotations: rot}
	for _, c := range []struct {
		name string
		src  string
		opt  FromOptions
		edit func(a *Artifact)
		want string
	}{
		{"heads 0", model, kv, func(a *Artifact) { a.Manifest.Model.Layers[1].NumAttentionHeads = 0 }, "manifest model"},
		{"clip_k 1.5", model, kv, func(a *Artifact) { a.Manifest.KV.ClipK[2] = 1.5 }, "ratio 1.5"},
		{"clip_v 0", model, kv, func(a *Artifact) { a.Manifest.KV.ClipV[0] = 0 }, "ratio 0"},
		{"clip count", model, kv, func(a *Artifact) { a.Manifest.KV.ClipK = a.Manifest.KV.ClipK[1:] }, "ratios"},
		{"unknown cache", model, FromOptions{KVCache: "kivi2"}, func(a *Artifact) { a.Manifest.KV.Cache = "int3-magic" }, "int3-magic"},
		{"windows", model, FromOptions{KVCache: "kivi2"}, func(a *Artifact) { a.Manifest.KV.Sink = 99999999999999 }, "max_position_embeddings"},
		{"method awq", qdir, FromOptions{}, func(a *Artifact) { a.Manifest.WeightsMethod = "awq" }, `"awq"`},
		{"arch GPT2", model, FromOptions{}, func(a *Artifact) { a.Manifest.Model.Architecture = "GPT2LMHeadModel" }, `"GPT2LMHeadModel"`},
		{"rope_scaling yarn", model, FromOptions{}, func(a *Artifact) {
			a.Manifest.Model.RoPEScaling = &RoPEScaling{Type: "yarn", Factor: 4}
		}, `rope_scaling type "yarn"`},
		{"rope_scaling factor", model, FromOptions{}, func(a *Artifact) {
			a.Manifest.Model.RoPEScaling = &RoPEScaling{Type: "linear", Factor: -1}
		}, "factor -1: want > 0"},
		{"max_position_embeddings -5", model, FromOptions{}, func(a *Artifact) { a.Manifest.Model.MaxPositionEmbeddings = -5 }, "max_position_embeddings -5"},
		{"scale NaN", qdir, FromOptions{}, func(a *Artifact) {
			i := slices.IndexFunc(a.Sections, func(s Section) bool { return s.Name == "model.layers.3.self_attn.o_proj.scales" })
			b := slices.Clone(a.Sections[i].Data)
			binary.LittleEndian.PutUint16(b[6:], 0x7e00) // fp16 NaN
			a.Sections[i].Data = b
		}, "want finite and > 0"},
	} {
		p := build(c.src, c.opt, c.edit)
		rep, err := Verify(p)
		if err == nil || rep == nil || rep.OK || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: verify %v (report %+v), want an error with %q", c.name, err, rep, c.want)
		}
		if c.name == "scale NaN" {
			continue // the loader finds it at first use (section CRCs are checked lazily)
		}
		// What run and serve load (Description, KVCache) refuses it too.
		r, err := Open(p)
		if err != nil {
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s: Open: %v, want an error with %q", c.name, err, c.want)
			}
			continue
		}
		d, derr := r.Description()
		method, opt, kerr := r.KVCache()
		if derr == nil && kerr == nil && method != "" {
			_, kerr = kvcache.New(method, kvcache.LayersOf(d), 1, opt) // the engine's cache
		}
		if lerr := errors.Join(derr, kerr); lerr == nil || !strings.Contains(lerr.Error(), c.want) {
			t.Errorf("%s: loading: %v, want an error with %q", c.name, lerr, c.want)
		}
		r.Close()
	}
	for _, src := range []string{model, qdir} {
		if _, err := Verify(build(src, FromOptions{}, func(*Artifact) {})); err != nil {
			t.Errorf("%s: %v", src, err)
		}
	}
	if _, err := Verify(build(model, kv, func(*Artifact) {})); err != nil {
		t.Errorf("with rotations: %v", err)
	}
}
