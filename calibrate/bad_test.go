package calibrate

import (
	"encoding/json"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/internal/shared"
	"github.com/lmpack/lmpack/model"
)

const testFP = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// synthetic returns a valid calibration for d's layers with seeded random
// symmetric matrices.
func synthetic(d *arch.Description) *Calibration {
	r := rand.New(rand.NewPCG(1, 2))
	c := &Calibration{Header: Header{ModelFingerprint: testFP, DataFingerprint: testFP, Tokens: 100, Ctx: 50, LmpackVersion: "t"}}
	for _, l := range d.Layers {
		n := l.HeadDim
		sym := func() []float64 {
			m := make([]float64, n*n)
			for i := 0; i < n; i++ {
				for j := i; j < n; j++ {
					m[i*n+j] = r.NormFloat64()
					m[j*n+i] = m[i*n+j]
				}
			}
			return m
		}
		c.OSCAR = append(c.OSCAR, OSCARLayer{HeadDim: n, CQ: sym(), CS: sym()})
	}
	return c
}

// writeRaw writes tensors and the header h (marshalled; a string is used
// as is) without Write's checks.
func writeRaw(t *testing.T, path string, ts []safetensors.WriteTensor, h any) {
	t.Helper()
	md := map[string]string{}
	switch h := h.(type) {
	case nil:
	case string:
		md[model.MetadataKey] = h
	default:
		b, _ := json.Marshal(h)
		md[model.MetadataKey] = string(b)
	}
	if err := safetensors.WriteFile(path, ts, md); err != nil {
		t.Fatal(err)
	}
}

// rawTensors returns c's tensors as Write would store them.
func rawTensors(c *Calibration) []safetensors.WriteTensor {
	var ts []safetensors.WriteTensor
	for l, ly := range c.OSCAR {
		ts = append(ts,
			safetensors.WriteTensor{Name: OSCARTensorName(l, "c_q"), DType: safetensors.F64, Shape: []int{ly.HeadDim, ly.HeadDim}, Data: f64Bytes(ly.CQ)},
			safetensors.WriteTensor{Name: OSCARTensorName(l, "c_s"), DType: safetensors.F64, Shape: []int{ly.HeadDim, ly.HeadDim}, Data: f64Bytes(ly.CS)})
	}
	return ts
}

func validHeader() Header {
	return Header{FormatVersion: 1, Kind: Kind, ModelFingerprint: testFP, DataFingerprint: testFP, Tokens: 100, Ctx: 50, Statistics: []string{"oscar"}}
}

// TestReadBad: every kind of broken calibration file is refused with the
// sentinel and a message naming the file and the tensor or field.
func TestReadBad(t *testing.T) {
	d, err := arch.Load(shared.Path(t, "stories260K-hf"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	good := filepath.Join(dir, "good.safetensors")
	c := synthetic(d)
	if err := Write(good, c); err != nil {
		t.Fatal(err)
	}
	got, err := Read(good, model.Expect{ModelFingerprint: testFP, Desc: d})
	if err != nil {
		t.Fatal(err)
	}
	for l := range c.OSCAR {
		if relErr(got.OSCAR[l].CQ, c.OSCAR[l].CQ) != 0 || relErr(got.OSCAR[l].CS, c.OSCAR[l].CS) != 0 {
			t.Fatalf("layer %d does not round-trip exactly", l)
		}
	}
	goodBytes, _ := os.ReadFile(good)

	type tc struct {
		name     string
		make     func(path string)
		sentinel error
		want     []string
	}
	cases := []tc{
		{"truncated", func(p string) { os.WriteFile(p, goodBytes[:len(goodBytes)-9], 0o644) }, safetensors.ErrFormat, nil},
		{"header only", func(p string) { os.WriteFile(p, goodBytes[:4], 0o644) }, safetensors.ErrFormat, nil},
		{"nan", func(p string) {
			ts := rawTensors(c)
			m := append([]float64(nil), c.OSCAR[2].CS...)
			m[3*8+5] = math.NaN()
			ts[5].Data = f64Bytes(m)
			writeRaw(t, p, ts, validHeader())
		}, ErrBadStatistic, []string{`"oscar.layers.2.c_s"`, "row 3, column 5", "NaN"}},
		{"inf", func(p string) {
			ts := rawTensors(c)
			m := append([]float64(nil), c.OSCAR[0].CQ...)
			m[0] = math.Inf(-1)
			ts[0].Data = f64Bytes(m)
			writeRaw(t, p, ts, validHeader())
		}, ErrBadStatistic, []string{`"oscar.layers.0.c_q"`, "-Inf"}},
		{"wrong shape", func(p string) {
			ts := rawTensors(c)
			ts[2].Shape = []int{4, 16}
			writeRaw(t, p, ts, validHeader())
		}, ErrBadStatistic, []string{`"oscar.layers.1.c_q"`, "shape [4 16], want [8 8]"}},
		{"wrong square size", func(p string) {
			ts := rawTensors(c)
			ts[3] = safetensors.WriteTensor{Name: ts[3].Name, DType: safetensors.F64, Shape: []int{4, 4}, Data: f64Bytes(make([]float64, 16))}
			writeRaw(t, p, ts, validHeader())
		}, ErrBadStatistic, []string{`"oscar.layers.1.c_s"`, "want [8 8]"}},
		{"wrong dtype", func(p string) {
			ts := rawTensors(c)
			ts[4] = safetensors.FromFloat32(ts[4].Name, []int{8, 8}, make([]float32, 64))
			writeRaw(t, p, ts, validHeader())
		}, ErrBadStatistic, []string{`"oscar.layers.2.c_q"`, "dtype F32, want F64"}},
		{"missing tensor", func(p string) {
			ts := rawTensors(c)
			writeRaw(t, p, append(ts[:7:7], ts[8:]...), validHeader())
		}, ErrBadStatistic, []string{`"oscar.layers.3.c_s"`, "not found"}},
		{"extra layer", func(p string) {
			c6 := synthetic(d)
			c6.OSCAR = append(c6.OSCAR, c6.OSCAR[0])
			writeRaw(t, p, rawTensors(c6), validHeader())
		}, ErrBadStatistic, []string{"6 layers, the model has 5"}},
		{"no metadata", func(p string) { writeRaw(t, p, rawTensors(c), nil) }, ErrNotCalibration, []string{`no "lmpack" metadata`}},
		{"bad json", func(p string) { writeRaw(t, p, rawTensors(c), "{not json") }, ErrNotCalibration, []string{"not a valid header"}},
		{"other kind", func(p string) {
			h := validHeader()
			h.Kind = "lmpack-kv-rotation"
			writeRaw(t, p, rawTensors(c), h)
		}, ErrNotCalibration, []string{`kind "lmpack-kv-rotation", want "lmpack-calibration"`}},
		{"newer version", func(p string) {
			h := validHeader()
			h.FormatVersion = 2
			writeRaw(t, p, rawTensors(c), h)
		}, ErrVersion, []string{"format_version 2"}},
		{"zero tokens", func(p string) {
			h := validHeader()
			h.Tokens = 0
			writeRaw(t, p, rawTensors(c), h)
		}, ErrNotCalibration, []string{"tokens 0"}},
		{"other model", func(p string) {
			h := validHeader()
			h.ModelFingerprint = model.FingerprintTag + strings.Repeat("f", 64)
			writeRaw(t, p, rawTensors(c), h)
		}, model.ErrModelMismatch, []string{strings.Repeat("f", 64), testFP, "calibration file is from another model"}},
		{"older lmpack's fingerprint", func(p string) {
			h := validHeader()
			h.ModelFingerprint = strings.Repeat("e", 64)
			writeRaw(t, p, rawTensors(c), h)
		}, model.ErrModelMismatch, []string{strings.Repeat("e", 64), testFP, "made by an older lmpack", "re-run lmpack calibrate"}},
		{"token outside the vocabulary", func(p string) {
			h := validHeader()
			h.Statistics = append(h.Statistics, StatTokens)
			ids := make([]int, h.Tokens)
			ids[7] = d.VocabSize
			tt, err := tokensTensor(p, ids)
			if err != nil {
				t.Fatal(err)
			}
			writeRaw(t, p, append(rawTensors(c), tt), h)
		}, ErrBadStatistic, []string{`"calibration.tokens"`, "position 7", "outside the vocabulary"}},
		{"token count differs from the header", func(p string) {
			h := validHeader()
			h.Statistics = append(h.Statistics, StatTokens)
			tt, err := tokensTensor(p, make([]int, h.Tokens-1))
			if err != nil {
				t.Fatal(err)
			}
			writeRaw(t, p, append(rawTensors(c), tt), h)
		}, ErrBadStatistic, []string{`"calibration.tokens"`, "want I32 [100]"}},
		{"similarity above 1", func(p string) {
			h := validHeader()
			h.Statistics = append(h.Statistics, StatLoRP)
			S := make([]float64, 36)
			for i := range 6 {
				S[i*6+i] = 1
			}
			S[1*6+2], S[2*6+1] = 5, 5
			writeRaw(t, p, append(rawTensors(c), safetensors.WriteTensor{Name: SimilarityTensor, DType: safetensors.F64, Shape: []int{6, 6}, Data: f64Bytes(S)}), h)
		}, ErrBadStatistic, []string{`"lorp.similarity"`, "element (1, 2) is 5", "outside [-1, 1]"}},
		{"statistic listed, no tensors", func(p string) { writeRaw(t, p, nil, validHeader()) }, ErrBadStatistic, []string{"0 layers, the model has 5"}},
	}
	for _, k := range cases {
		t.Run(k.name, func(t *testing.T) {
			p := filepath.Join(dir, strings.ReplaceAll(k.name, " ", "_")+".safetensors")
			k.make(p)
			_, err := Read(p, model.Expect{ModelFingerprint: testFP, Desc: d})
			if err == nil {
				t.Fatal("accepted")
			}
			if !errors.Is(err, k.sentinel) || !strings.Contains(err.Error(), p) {
				t.Errorf("error %v: want %v naming %s", err, k.sentinel, p)
			}
			for _, w := range k.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %v: want it to mention %q", err, w)
				}
			}
		})
	}

	// Unknown statistics are listed and ignored.
	p := filepath.Join(dir, "future.safetensors")
	h := validHeader()
	h.Statistics = append(h.Statistics, "layer_similarity")
	writeRaw(t, p, append(rawTensors(c), safetensors.WriteTensor{Name: "layer_similarity.s", DType: safetensors.F64, Shape: []int{5, 5}, Data: f64Bytes(make([]float64, 25))}), h)
	got, err = Read(p, model.Expect{Desc: d})
	if err != nil || !got.Has("layer_similarity") || len(got.OSCAR) != 5 {
		t.Errorf("file with an extra statistic: %v", err)
	}
}

// TestWriteRefuses: Write checks what it writes.
func TestWriteRefuses(t *testing.T) {
	p := filepath.Join(t.TempDir(), "c.safetensors")
	c := &Calibration{Header: validHeader(), OSCAR: []OSCARLayer{{HeadDim: 2, CQ: []float64{1, 0, 0, 1}, CS: []float64{1, math.NaN(), 0, 1}}}}
	if err := Write(p, c); !errors.Is(err, ErrBadStatistic) || !strings.Contains(err.Error(), `"oscar.layers.0.c_s"`) {
		t.Errorf("NaN: %v", err)
	}
	c.OSCAR[0].CS = []float64{1, 0, 0}
	if err := Write(p, c); !errors.Is(err, ErrBadStatistic) || !strings.Contains(err.Error(), "3 values for head_dim 2") {
		t.Errorf("short matrix: %v", err)
	}
	if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("refused writes left %s", p)
	}
}
