package oscar

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/lmpack/lmpack/calibrate"
	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/internal/shared"
	"github.com/lmpack/lmpack/model"
)

var (
	calibOnce sync.Once
	calibPath string
	calibErr  error
)

// calibFile runs calibrate.Run once on stories260K (2048 tokens of
// calib.txt, windows of 512) and returns the file.
func calibFile(t *testing.T) string {
	t.Helper()
	dir := shared.Path(t, "stories260K-hf")
	data := shared.Path(t, "tinystories-valid", "calib.txt")
	calibOnce.Do(func() {
		tmp, err := os.MkdirTemp("", "oscar-test-")
		if err != nil {
			calibErr = err
			return
		}
		calibPath = filepath.Join(tmp, "calib.safetensors")
		_, calibErr = calibrate.Run(context.Background(), calibrate.Options{Model: dir, Data: data, Tokens: 2048, Ctx: 512, Out: calibPath, Threads: 1})
	})
	if calibErr != nil {
		t.Fatal(calibErr)
	}
	return calibPath
}

func TestMain(m *testing.M) {
	code := m.Run()
	if calibPath != "" {
		os.RemoveAll(filepath.Dir(calibPath))
	}
	os.Exit(code)
}

func modelInfo(t *testing.T, name string) (string, *arch.Description, string) {
	t.Helper()
	dir, d, ck, err := model.Open(context.Background(), shared.Path(t, name), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	fp, err := model.Fingerprint(dir, ck)
	if err != nil {
		t.Fatal(err)
	}
	return dir, d, fp
}

// TestQuantizeKV: calibrate then QuantizeKV on stories260K writes a file
// whose rotations are orthogonal, equal float32(Rotation(C_Q)) and
// float32(Rotation(C_S)) of the calibration, carry the clip ratios and both
// fingerprints; the model check refuses the MoE model.
func TestQuantizeKV(t *testing.T) {
	cal := calibFile(t)
	dir, d, fp := modelInfo(t, "stories260K-hf")
	out := filepath.Join(t.TempDir(), "rot.safetensors")
	s, err := QuantizeKV(context.Background(), KVOptions{Model: dir, Calib: cal, ClipK: DefaultClipK, ClipV: DefaultClipV, Out: out, Version: "v-test"})
	if err != nil {
		t.Fatal(err)
	}
	if s.Layers != 5 || s.MaxOrthogonalityError > 1e-10 {
		t.Errorf("summary %+v", s)
	}
	t.Logf("largest eigenvalue share of trace(C_Q) per layer: %.3f", s.KeyEigenvalueShare)
	rot, h, err := ReadFile(out, model.Expect{ModelFingerprint: fp, Desc: d})
	if err != nil {
		t.Fatal(err)
	}
	cb, _ := os.ReadFile(cal)
	sum := sha256.Sum256(cb)
	if h.Kind != Kind || h.Method != "oscar" || h.FormatVersion != 1 || h.ModelFingerprint != fp || h.CalibrationFingerprint != hex.EncodeToString(sum[:]) || h.LmpackVersion != "v-test" {
		t.Errorf("header %+v", h)
	}
	c, err := calibrate.Read(cal, model.Expect{ModelFingerprint: fp, Desc: d})
	if err != nil {
		t.Fatal(err)
	}
	for l := range d.Layers {
		if rot.ClipK[l] != 0.96 || rot.ClipV[l] != 0.92 {
			t.Errorf("layer %d: clip %g, %g", l, rot.ClipK[l], rot.ClipV[l])
		}
		for _, x := range []struct {
			r   []float32
			cov []float64
		}{{rot.K[l], c.OSCAR[l].CQ}, {rot.V[l], c.OSCAR[l].CS}} {
			if e := Orthogonality(x.r, 8); e > 1e-6 {
				t.Errorf("layer %d: float32 rotation max|RRᵀ−I| = %.3g", l, e)
			}
			want, _, err := Rotation(x.cov, 8)
			if err != nil {
				t.Fatal(err)
			}
			for i := range want {
				if x.r[i] != float32(want[i]) {
					t.Fatalf("layer %d: element %d = %g, want %g", l, i, x.r[i], float32(want[i]))
				}
			}
		}
	}

	// Another model: the calibration and the rotation file are refused.
	moeDir, moeDesc, moeFP := modelInfo(t, "stories260K-moe-hf")
	_, err = QuantizeKV(context.Background(), KVOptions{Model: moeDir, Calib: cal, ClipK: 0.96, ClipV: 0.92, Out: filepath.Join(t.TempDir(), "x")})
	if !errors.Is(err, model.ErrModelMismatch) || !strings.Contains(err.Error(), fp) || !strings.Contains(err.Error(), moeFP) {
		t.Errorf("calibration of another model: %v", err)
	}
	_, _, err = ReadFile(out, model.Expect{ModelFingerprint: moeFP, Desc: moeDesc})
	if !errors.Is(err, model.ErrModelMismatch) || !strings.Contains(err.Error(), fp) || !strings.Contains(err.Error(), moeFP) || !strings.Contains(err.Error(), out) {
		t.Errorf("rotation file of another model: %v", err)
	}

	// Same inputs, same bytes.
	out2 := filepath.Join(t.TempDir(), "rot2.safetensors")
	if _, err := QuantizeKV(context.Background(), KVOptions{Model: dir, Calib: cal, Method: "oscar", ClipK: DefaultClipK, ClipV: DefaultClipV, Out: out2, Version: "v-test"}); err != nil {
		t.Fatal(err)
	}
	b1, _ := os.ReadFile(out)
	b2, _ := os.ReadFile(out2)
	if !slices.Equal(b1, b2) {
		t.Error("two runs on the same inputs wrote different bytes")
	}
}

func TestQuantizeKVOptions(t *testing.T) {
	cal := calibFile(t)
	dir := shared.Path(t, "stories260K-hf")
	tmp := t.TempDir()
	ok := KVOptions{Model: dir, Calib: cal, ClipK: 0.96, ClipV: 0.92, Out: filepath.Join(tmp, "r.safetensors")}
	for _, c := range []struct {
		name string
		mod  func(*KVOptions)
		want string
	}{
		{"method", func(o *KVOptions) { o.Method = "quarot" }, `Method "quarot": want "oscar"`},
		{"clip_k 0", func(o *KVOptions) { o.ClipK = 0 }, "ClipK 0: want a ratio in (0, 1]"},
		{"clip_v > 1", func(o *KVOptions) { o.ClipV = 1.5 }, "ClipV 1.5"},
		{"clip NaN", func(o *KVOptions) { o.ClipK = math.NaN() }, "ClipK NaN"},
		{"no calib", func(o *KVOptions) { o.Calib = "" }, "Calib: want a calibration file"},
		{"calib missing", func(o *KVOptions) { o.Calib = filepath.Join(tmp, "none.safetensors") }, "none.safetensors"},
		{"calib is the model", func(o *KVOptions) { o.Calib = filepath.Join(dir, "model.safetensors") }, "not an lmpack calibration file"},
		{"out dir missing", func(o *KVOptions) { o.Out = filepath.Join(tmp, "no", "r") }, "no such file or directory"},
	} {
		o := ok
		c.mod(&o)
		if _, err := QuantizeKV(context.Background(), o); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
	if _, err := os.Stat(ok.Out); !errors.Is(err, os.ErrNotExist) {
		t.Error("a failed run wrote the output")
	}
}

// TestReadFileBad: broken rotation files are refused naming the file and
// the tensor or field.
func TestReadFileBad(t *testing.T) {
	cal := calibFile(t)
	dir, d, fp := modelInfo(t, "stories260K-hf")
	tmp := t.TempDir()
	good := filepath.Join(tmp, "good.safetensors")
	if _, err := QuantizeKV(context.Background(), KVOptions{Model: dir, Calib: cal, ClipK: 0.96, ClipV: 0.92, Out: good}); err != nil {
		t.Fatal(err)
	}
	gf, err := safetensors.Open(good)
	if err != nil {
		t.Fatal(err)
	}
	defer gf.Close()
	var hdr RotationHeader
	json.Unmarshal([]byte(gf.Metadata()["lmpack"]), &hdr)
	tensors := func() []safetensors.WriteTensor {
		var ts []safetensors.WriteTensor
		for _, ti := range gf.Tensors() {
			x, _ := gf.Tensor(ti.Name)
			v, _ := x.Float32()
			ts = append(ts, safetensors.FromFloat32(ti.Name, ti.Shape, v))
		}
		sort.Slice(ts, func(i, j int) bool { return ts[i].Name < ts[j].Name })
		return ts
	}
	write := func(p string, ts []safetensors.WriteTensor, h any) {
		md := map[string]string{}
		if s, ok := h.(string); ok {
			md["lmpack"] = s
		} else if h != nil {
			b, _ := json.Marshal(h)
			md["lmpack"] = string(b)
		}
		if err := safetensors.WriteFile(p, ts, md); err != nil {
			t.Fatal(err)
		}
	}
	edit := func(name string, f func([]float32)) func(string) {
		return func(p string) {
			ts := tensors()
			for i := range ts {
				if ts[i].Name == name {
					x, _ := gf.Tensor(name)
					v, _ := x.Float32()
					f(v)
					ts[i] = safetensors.FromFloat32(name, ts[i].Shape, v)
				}
			}
			write(p, ts, hdr)
		}
	}
	goodBytes, _ := os.ReadFile(good)
	for _, c := range []struct {
		name     string
		make     func(string)
		sentinel error
		want     []string
	}{
		{"truncated", func(p string) { os.WriteFile(p, goodBytes[:len(goodBytes)-1], 0o644) }, safetensors.ErrFormat, nil},
		{"nan", edit("oscar.layers.3.r_v", func(v []float32) { v[10] = float32(math.NaN()) }), ErrBadRotation, []string{`"oscar.layers.3.r_v"`, "row 1, column 2", "NaN"}},
		{"not orthogonal", edit("oscar.layers.1.r_k", func(v []float32) { v[0] *= 1.01 }), ErrBadRotation, []string{`"oscar.layers.1.r_k"`, "not orthogonal"}},
		{"wrong shape", func(p string) {
			ts := tensors()
			ts[0].Shape = []int{4, 16}
			write(p, ts, hdr)
		}, ErrBadRotation, []string{`"oscar.layers.0.r_k"`, "shape [4 16], want [8 8]"}},
		{"wrong dtype", func(p string) {
			ts := tensors()
			ts[2], _ = safetensors.FromFloat32As(ts[2].Name, safetensors.BF16, ts[2].Shape, make([]float32, 64))
			write(p, ts, hdr)
		}, ErrBadRotation, []string{`"oscar.layers.1.r_k"`, "dtype BF16, want F32"}},
		{"missing tensor", func(p string) {
			ts := tensors()
			write(p, append(ts[:3:3], safetensors.FromFloat32("oscar.layers.9.r_v", []int{8, 8}, make([]float32, 64)), ts[4], ts[5], ts[6], ts[7], ts[8], ts[9]), hdr)
		}, ErrBadRotation, []string{`"oscar.layers.1.r_v"`, "not found"}},
		{"clip out of range", func(p string) {
			h := hdr
			h.ClipV = slices.Clone(h.ClipV)
			h.ClipV[4] = 1.2
			write(p, tensors(), h)
		}, ErrBadRotation, []string{"layer 4", "clip_v 1.2"}},
		{"clip count", func(p string) {
			h := hdr
			h.ClipK = h.ClipK[:4]
			write(p, tensors(), h)
		}, ErrBadRotation, []string{"4 clip_k ratios, want one per layer (5)"}},
		{"4-bit clip out of range", func(p string) {
			h := hdr
			h.ClipK4 = []float64{1, 1, 0.9, 0, 1}
			write(p, tensors(), h)
		}, ErrBadRotation, []string{"layer 3", "clip_k4 0"}},
		{"8-bit clip negative", func(p string) {
			h := hdr
			h.ClipV8 = []float64{1, 1, 0.9, 1, -0.5}
			write(p, tensors(), h)
		}, ErrBadRotation, []string{"layer 4", "clip_v8 -0.5"}},
		{"8-bit clip count", func(p string) {
			h := hdr
			h.ClipK8 = []float64{1, 1}
			write(p, tensors(), h)
		}, ErrBadRotation, []string{"2 clip_k8 ratios, want one per layer (5)"}},
		{"width not 2, 4 or 8", func(p string) {
			h := mixedHeader(hdr)
			h.BitsV[2] = 3
			write(p, tensors(), h)
		}, ErrBadRotation, []string{"layer 2", "bits_v 3", "2, 4 or 8"}},
		{"width count", func(p string) {
			h := mixedHeader(hdr)
			h.BitsK = h.BitsK[:3]
			write(p, tensors(), h)
		}, ErrBadRotation, []string{"3 bits_k widths, want one per layer (5)"}},
		{"bits_k without bits_v", func(p string) {
			h := mixedHeader(hdr)
			h.BitsV = nil
			write(p, tensors(), h)
		}, ErrBadRotation, []string{"bits_k has 5 and bits_v 0"}},
		{"widths without a budget", func(p string) {
			h := mixedHeader(hdr)
			h.KVBits = 0
			write(p, tensors(), h)
		}, ErrBadRotation, []string{"kv_bits 0"}},
		{"calibration file", func(p string) { os.WriteFile(p, mustRead(t, cal), 0o644) }, ErrNotRotation, []string{`kind "lmpack-calibration"`}},
		{"no metadata", func(p string) { write(p, tensors(), nil) }, ErrNotRotation, nil},
		{"other method", func(p string) {
			h := hdr
			h.Method = "quarot"
			write(p, tensors(), h)
		}, ErrNotRotation, []string{`method "quarot"`}},
		{"newer version", func(p string) {
			h := hdr
			h.FormatVersion = 7
			write(p, tensors(), h)
		}, ErrVersion, []string{"format_version 7"}},
		{"older lmpack's fingerprint", func(p string) {
			h := hdr
			h.ModelFingerprint = strings.Repeat("0a", 32)
			write(p, tensors(), h)
		}, ErrRotationModelMismatch, []string{strings.Repeat("0a", 32), fp, "made by an older lmpack", "re-run lmpack calibrate and lmpack quantize kv"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := filepath.Join(tmp, strings.ReplaceAll(c.name, " ", "_"))
			c.make(p)
			_, _, err := ReadFile(p, model.Expect{ModelFingerprint: fp, Desc: d})
			if err == nil {
				t.Fatal("accepted")
			}
			if !errors.Is(err, c.sentinel) || !strings.Contains(err.Error(), p) {
				t.Errorf("%v: want %v naming %s", err, c.sentinel, p)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%v: want it to mention %q", err, w)
				}
			}
		})
	}
}

func mustRead(t *testing.T, p string) []byte {
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// mixedHeader is h (5 layers) with per-layer widths and their budget.
func mixedHeader(h RotationHeader) RotationHeader {
	h.BitsK, h.BitsV = []int{2, 4, 8, 2, 2}, []int{4, 2, 2, 8, 2}
	h.KVBits, h.KVServingCtx, h.KVSink, h.KVRecent = 3, 32768, 16, 64
	return h
}

// The new header fields (4- and 8-bit clip ratios, per-layer widths and
// their budget) survive WriteFile and ReadFile, and reach Rotations.
func TestFileRoundTripWidthsAndClips(t *testing.T) {
	cal := calibFile(t)
	_, d, fp := modelInfo(t, "stories260K-hf")
	c, err := calibrate.Read(cal, model.Expect{ModelFingerprint: fp, Desc: d})
	if err != nil {
		t.Fatal(err)
	}
	layers, err := Compute(c.OSCAR)
	if err != nil {
		t.Fatal(err)
	}
	h := mixedHeader(RotationHeader{ModelFingerprint: fp, CalibrationFingerprint: "cafe", LmpackVersion: "test",
		ClipK: []float64{0.96, 0.95, 0.94, 0.93, 0.92}, ClipV: []float64{0.92, 0.9, 0.88, 0.86, 0.85},
		ClipK4: []float64{1, 0.99, 0.98, 1, 0.97}, ClipV4: []float64{0.99, 1, 1, 0.98, 1},
		ClipK8: []float64{1, 1, 0.999, 1, 1}, ClipV8: []float64{1, 0.995, 1, 1, 1}})
	p := filepath.Join(t.TempDir(), "r.safetensors")
	if err := WriteFile(p, h, layers); err != nil {
		t.Fatal(err)
	}
	r, got, err := ReadFile(p, model.Expect{ModelFingerprint: fp, Desc: d})
	if err != nil {
		t.Fatal(err)
	}
	want := h
	want.Kind, want.FormatVersion, want.Method = Kind, FormatVersion, Method
	gj, _ := json.Marshal(got)
	wj, _ := json.Marshal(want)
	if string(gj) != string(wj) {
		t.Errorf("header read back\n%s\nwant\n%s", gj, wj)
	}
	for _, x := range []struct {
		name      string
		got, want any
	}{{"ClipK", r.ClipK, h.ClipK}, {"ClipV4", r.ClipV4, h.ClipV4}, {"ClipK8", r.ClipK8, h.ClipK8}, {"BitsK", r.BitsK, h.BitsK}, {"BitsV", r.BitsV, h.BitsV}} {
		if fmt.Sprint(x.got) != fmt.Sprint(x.want) {
			t.Errorf("Rotations.%s = %v, want %v", x.name, x.got, x.want)
		}
	}
	// WriteFile refuses what ReadFile would refuse.
	bad := h
	bad.BitsK = []int{2, 4, 16, 2, 2}
	if err := WriteFile(filepath.Join(t.TempDir(), "bad.safetensors"), bad, layers); !errors.Is(err, ErrBadRotation) || !strings.Contains(err.Error(), "layer 2: bits_k 16") {
		t.Errorf("WriteFile with a 16-bit width: %v", err)
	}
}
