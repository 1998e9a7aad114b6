package wquant

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/calibrate"
	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/internal/engine"
	"github.com/lmpack/lmpack/internal/shared"
	"github.com/lmpack/lmpack/model"
	"github.com/lmpack/lmpack/quantize/weights"
	"github.com/lmpack/lmpack/runtime"
)

// The quantized checkpoint run by the runtime gives the logits of the
// original model with every target weight replaced in memory by its
// independently computed RTN dequantization (RTN does not depend on the
// calibration inputs, so the reference needs no pipeline).
func TestQuantizedCheckpointMatchesFakeQuant(t *testing.T) {
	calib := calibFile(t)
	for _, tc := range []struct {
		bits, group int
		sym         bool
	}{{4, 32, false}, {3, 64, true}, {2, 0, false}} {
		out := filepath.Join(t.TempDir(), "q")
		rep, err := Run(context.Background(), Options{Model: model260K(t), Calib: calib, Out: out, Method: MethodRTN,
			Bits: tc.bits, GroupSize: tc.group, Symmetric: tc.sym, Threads: 1})
		if err != nil {
			t.Fatal(err)
		}
		qe, err := engine.Open(context.Background(), out, engine.Options{Threads: 1, DequantizeWeights: true})
		if err != nil {
			t.Fatal(err)
		}
		if qe.Desc.Quant == nil || len(qe.Desc.Quant.Tensors) != 35 {
			t.Fatalf("quantization block %+v, want 35 tensors", qe.Desc.Quant)
		}
		dir, d, ck, err := model.Open(context.Background(), model260K(t), nil)
		if err != nil {
			t.Fatal(err)
		}
		targets, _ := Targets(d)
		ov := &overlay{base: ck, repl: map[string][]float32{}, rows: map[string][2]int{}}
		var bits int64
		for _, tg := range targets {
			tt, _ := ck.Tensor(tg.Name)
			w, _ := tt.Float32()
			g := effectiveGroup(tc.group, tg.Cols)
			q, err := weights.QuantizeRTN(w, tg.Rows, tg.Cols, weights.Options{Bits: tc.bits, GroupSize: g, Symmetric: tc.sym})
			if err != nil {
				t.Fatal(err)
			}
			dq := make([]float32, len(w))
			q.Dequantize(dq)
			ov.repl[tg.Name], ov.rows[tg.Name] = dq, [2]int{tg.Rows, tg.Cols}
			bits += StorageBits(tg.Rows, tg.Cols, tc.bits, g, tc.sym, false)
		}
		fm, err := runtime.NewCPU().Load(context.Background(), d, ov, runtime.LoadOptions{Threads: 1})
		if err != nil {
			t.Fatal(err)
		}
		ids := heldoutIDs(t, qe)[:200]
		diff := maxAbsDiff(logits(t, qe.Model, ids), logits(t, fm, ids))
		t.Logf("%d bits group %d sym %v: max |logit diff| %.3g, %.4f bpw, %d -> %d bytes", tc.bits, tc.group, tc.sym, diff, rep.BitsPerWeight, rep.BytesBefore, rep.BytesAfter)
		if diff > 1e-5 {
			t.Errorf("%d bits: quantized checkpoint logits differ from the fake-quantized model by %g", tc.bits, diff)
		}
		if want := float64(bits) / float64(rep.Params); rep.BitsPerWeight != want {
			t.Errorf("report bpw %v, want %v from StorageBits", rep.BitsPerWeight, want)
		}
		// The stored bytes are what the report says: the shards' tensor data.
		var stored int64
		for _, n := range qe.Checkpoint.Names() {
			info, _, _ := qe.Checkpoint.Info(n)
			stored += info.End - info.Begin
		}
		if stored != rep.BytesAfter {
			t.Errorf("checkpoint holds %d bytes of tensor data, report says %d", stored, rep.BytesAfter)
		}
		fm.Close()
		qe.Close()
		ck.Close()
		_ = dir
	}
}

// The storage tensors of a GPTQ act-order result (permutation, groups)
// read back through the runtime's reader to the same dequantized matrix.
func TestStorageRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	rows, cols := 24, 128
	w := make([]float32, rows*cols)
	for i := range w {
		w[i] = float32(rng.NormFloat64())
	}
	x := make([]float32, 256*cols)
	for i := range x {
		x[i] = float32(rng.NormFloat64() * (1 + float64(i%cols)/16))
	}
	h := weights.NewHessian(cols)
	if err := h.Add(x, 256); err != nil {
		t.Fatal(err)
	}
	for _, o := range []weights.GPTQOptions{
		{Options: weights.Options{Bits: 3, GroupSize: 32}, ActOrder: true},
		{Options: weights.Options{Bits: 4, GroupSize: 64, Symmetric: true}, ActOrder: true},
		{Options: weights.Options{Bits: 2, GroupSize: 0}},
		{Options: weights.Options{Bits: 1, GroupSize: 32}},
		{Options: weights.Options{Bits: 1, GroupSize: 0}},
	} {
		q, err := weights.QuantizeGPTQ(w, rows, cols, h, o)
		if err != nil {
			t.Fatal(err)
		}
		name := "model.layers.0.mlp.up_proj.weight"
		path := filepath.Join(t.TempDir(), "m.safetensors")
		if err := safetensors.WriteFile(path, storageTensors(name, q), nil); err != nil {
			t.Fatal(err)
		}
		f, err := safetensors.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		got, _, err := runtime.ReadQuantized(f, name, arch.TensorQuant{Bits: q.Bits, GroupSize: q.GroupSize, Symmetric: q.Symmetric, Perm: q.Perm != nil})
		if err != nil {
			t.Fatal(err)
		}
		a, b := make([]float32, rows*cols), make([]float32, rows*cols)
		q.Dequantize(a)
		got.Dequantize(b)
		if d := maxAbsDiff(a, b); d != 0 {
			t.Errorf("%+v: read back differs by %g", o, d)
		}
		if (q.Perm != nil) != (o.ActOrder && o.GroupSize > 0) {
			t.Errorf("%+v: perm %v", o, q.Perm != nil)
		}
		f.Close()
	}
}

// mutSource edits one tensor of a checkpoint on the fly.
type mutSource struct {
	base runtime.TensorSource
	name string
	edit func(*safetensors.Tensor) *safetensors.Tensor // nil result: missing
}

func (m *mutSource) Tensor(name string) (*safetensors.Tensor, error) {
	t, err := m.base.Tensor(name)
	if err != nil || name != m.name {
		return t, err
	}
	c := *t
	c.Data = append([]byte(nil), t.Data...)
	r := m.edit(&c)
	if r == nil {
		return nil, safetensors.ErrMissingTensor
	}
	return r, nil
}

func TestCorruptQuantizedTensors(t *testing.T) {
	out := filepath.Join(t.TempDir(), "q")
	if _, err := Run(context.Background(), Options{Model: model260K(t), Calib: calibFile(t), Out: out, Method: MethodRTN, Bits: 4, GroupSize: 32, Threads: 1}); err != nil {
		t.Fatal(err)
	}
	d, err := arch.Load(out)
	if err != nil {
		t.Fatal(err)
	}
	ck, err := safetensors.OpenDir(out)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	p := "model.layers.2.self_attn.k_proj"
	for _, tc := range []struct {
		name, want string
		edit       func(*safetensors.Tensor) *safetensors.Tensor
	}{
		{p + ".qweight", "is missing", func(*safetensors.Tensor) *safetensors.Tensor { return nil }},
		{p + ".scales", "is missing", func(*safetensors.Tensor) *safetensors.Tensor { return nil }},
		{p + ".qzeros", "is missing", func(*safetensors.Tensor) *safetensors.Tensor { return nil }},
		{p + ".qweight", "shape [32 31]", func(t *safetensors.Tensor) *safetensors.Tensor {
			t.Shape = []int{32, 31}
			t.Data = t.Data[:32*31]
			return t
		}},
		{p + ".qweight", "dtype I8", func(t *safetensors.Tensor) *safetensors.Tensor { t.DType = safetensors.I8; return t }},
		{p + ".scales", "scale [1, 0] is NaN", func(t *safetensors.Tensor) *safetensors.Tensor {
			t.Data[4], t.Data[5] = 0x00, 0x7e // row 1 group 0 (2 groups per row)
			return t
		}},
		{p + ".scales", "scale [0, 1] is 0", func(t *safetensors.Tensor) *safetensors.Tensor {
			t.Data[2], t.Data[3] = 0, 0
			return t
		}},
		{p + ".qzeros", "zero-point [0, 0] is 16", func(t *safetensors.Tensor) *safetensors.Tensor {
			t.Data[0], t.Data[1] = 0x00, 0x4c // 16.0 > 15
			return t
		}},
	} {
		_, err := runtime.NewCPU().Load(context.Background(), d, &mutSource{base: ck, name: tc.name, edit: tc.edit}, runtime.LoadOptions{Threads: 1})
		if err == nil || !errors.Is(err, runtime.ErrBadWeights) || !strings.Contains(err.Error(), tc.name) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s (%s): got %v", tc.name, tc.want, err)
		} else {
			t.Logf("%s: %v", tc.name, err)
		}
	}
}

func TestRunBadInput(t *testing.T) {
	calib := calibFile(t)
	mdir := model260K(t)
	tmp := t.TempDir()
	exists := filepath.Join(tmp, "exists")
	if err := os.Mkdir(exists, 0o755); err != nil {
		t.Fatal(err)
	}
	// A calibration file of another model, and one without token ids.
	other := filepath.Join(t.TempDir(), "moe.safetensors")
	if _, err := calibrate.Run(context.Background(), calibrate.Options{Model: shared.Path(t, "stories260K-moe-hf"), Data: shared.Path(t, "tinystories-valid", "calib.txt"),
		Tokens: 256, Ctx: 128, Out: other, Threads: 1}); err != nil {
		t.Fatal(err)
	}
	c, err := calibrate.Read(calib, model.Expect{})
	if err != nil {
		t.Fatal(err)
	}
	c.Header.Statistics = slices.DeleteFunc(slices.Clone(c.Header.Statistics), func(s string) bool { return s == calibrate.StatTokens })
	c.TokenIDs = nil
	noTokens := filepath.Join(t.TempDir(), "notokens.safetensors")
	if err := calibrate.Write(noTokens, c); err != nil {
		t.Fatal(err)
	}
	ok := Options{Model: mdir, Calib: calib, Out: filepath.Join(tmp, "q"), Method: MethodRTN, Bits: 4, GroupSize: 32, Threads: 1}
	for _, tc := range []struct {
		name string
		mod  func(*Options)
		is   error
		want string
	}{
		{"method", func(o *Options) { o.Method = "awq" }, ErrOptions, `Method "awq"`},
		{"bits", func(o *Options) { o.Bits = 5 }, ErrOptions, "Bits 5"},
		{"group", func(o *Options) { o.GroupSize = 48 }, ErrOptions, "GroupSize 48"},
		{"both", func(o *Options) { o.TargetBPW = 3 }, ErrOptions, "exactly one"},
		{"actorder rtn", func(o *Options) { o.ActOrder = true }, ErrOptions, "ActOrder: want Method gptq"},
		{"out exists", func(o *Options) { o.Out = exists }, ErrOutput, "already exists"},
		{"out in model", func(o *Options) { o.Out = filepath.Join(mdir, "q") }, ErrOutput, "inside"},
		{"moe budget on a dense model", func(o *Options) { o.MoEBudget = 2.5 }, ErrOptions, "is a dense model"},
		{"negative moe budget", func(o *Options) { o.MoEBudget = -1 }, ErrOptions, "MoEBudget -1"},
		{"moe budget with target", func(o *Options) { o.Bits, o.GroupSize, o.TargetBPW, o.MoEBudget = 0, 0, 3, 2.5 }, ErrOptions, "not TargetBPW"},
		{"moe weighting", func(o *Options) { o.MoEWeighting = "grad" }, ErrOptions, `MoEWeighting "grad"`},
		{"moe solver", func(o *Options) { o.MoESolver = "ilp" }, ErrOptions, `MoESolver "ilp"`},
		{"budget too small", func(o *Options) { o.Bits, o.GroupSize, o.TargetBPW = 0, 0, 2.0 }, ErrOptions, "below the smallest the choices allow, 2.4237"},
		{"other model's calibration", func(o *Options) { o.Calib = other }, model.ErrModelMismatch, "another model"},
		{"no token ids", func(o *Options) { o.Calib = noTokens }, ErrCalibration, "no calibration token ids"},
	} {
		o := ok
		tc.mod(&o)
		_, err := Run(context.Background(), o)
		if err == nil || (tc.is != nil && !errors.Is(err, tc.is)) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want %v containing %q", tc.name, err, tc.is, tc.want)
		}
	}
	if _, err := os.Stat(filepath.Join(tmp, "q")); !os.IsNotExist(err) {
		t.Errorf("a failed run left %s behind", filepath.Join(tmp, "q"))
	}
	if ents, _ := os.ReadDir(tmp); len(ents) != 1 {
		t.Errorf("temp dirs left behind: %v", ents)
	}
}

// TrueSequential changes only what its staging changes: q/k/v see the same
// Hessian (the block's input) either way, so their codes are identical;
// o_proj's Hessian comes from the block with quantized q/k/v, so its codes
// differ.
func TestTrueSequential(t *testing.T) {
	calib := calibFile(t)
	dirs := [2]string{}
	for i, ts := range []bool{false, true} {
		dirs[i] = filepath.Join(t.TempDir(), "q")
		if _, err := Run(context.Background(), Options{Model: model260K(t), Calib: calib, Out: dirs[i], Method: MethodGPTQ, Bits: 3, GroupSize: 64,
			TrueSequential: ts, Threads: 1}); err != nil {
			t.Fatal(err)
		}
	}
	a, err := safetensors.OpenDir(dirs[0])
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := safetensors.OpenDir(dirs[1])
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	same := func(name string) bool {
		x, err1 := a.Tensor(name)
		y, err2 := b.Tensor(name)
		if err1 != nil || err2 != nil {
			t.Fatal(err1, err2)
		}
		return string(x.Data) == string(y.Data)
	}
	for _, n := range []string{"q_proj", "k_proj", "v_proj"} {
		if !same("model.layers.0.self_attn." + n + ".qweight") {
			t.Errorf("layer 0 %s codes differ with TrueSequential", n)
		}
	}
	if same("model.layers.0.self_attn.o_proj.qweight") || same("model.layers.0.mlp.down_proj.qweight") {
		t.Error("layer 0 o_proj / down_proj codes identical with and without TrueSequential")
	}
}

// The format and the runtime take per-tensor widths for MoE expert
// weights too (for the GEMQ stage): a stories260K-moe-hf checkpoint with
// two experts' weights stored quantized at different widths (written here
// with the format's writer) runs with the logits of the model with those
// weights dequantized in memory.
func TestQuantizedExpertTensors(t *testing.T) {
	src := shared.Path(t, "stories260K-moe-hf")
	d, err := arch.Load(src)
	if err != nil {
		t.Fatal(err)
	}
	ck, err := safetensors.OpenDir(src)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	quant := map[string]weights.Options{
		d.Layers[0].MoE.Experts[1].Up:   {Bits: 2, GroupSize: 32},
		d.Layers[3].MoE.Experts[2].Down: {Bits: 3, GroupSize: 0, Symmetric: true},
	}
	out := t.TempDir()
	ov := &overlay{base: ck, repl: map[string][]float32{}, rows: map[string][2]int{}}
	qcfg := &arch.Quantization{Format: arch.QuantFormat, Version: arch.QuantVersion, Method: "rtn", Tensors: map[string]arch.TensorQuant{}}
	var ts []safetensors.WriteTensor
	for _, n := range ck.Names() {
		tt, _ := ck.Tensor(n)
		o, ok := quant[n]
		if !ok {
			ts = append(ts, safetensors.WriteTensor{Name: n, DType: tt.DType, Shape: tt.Shape, Data: tt.Data})
			continue
		}
		w, _ := tt.Float32()
		q, err := weights.QuantizeRTN(w, tt.Shape[0], tt.Shape[1], o)
		if err != nil {
			t.Fatal(err)
		}
		ts = append(ts, storageTensors(n, q)...)
		qcfg.Tensors[n] = arch.TensorQuant{Bits: q.Bits, GroupSize: q.GroupSize, Symmetric: q.Symmetric}
		dq := make([]float32, len(w))
		q.Dequantize(dq)
		ov.repl[n], ov.rows[n] = dq, [2]int{tt.Shape[0], tt.Shape[1]}
	}
	slices.SortFunc(ts, func(a, b safetensors.WriteTensor) int { return strings.Compare(a.Name, b.Name) })
	if err := safetensors.WriteFile(filepath.Join(out, "model.safetensors"), ts, nil); err != nil {
		t.Fatal(err)
	}
	cfg, err := quantConfig(filepath.Join(src, "config.json"), qcfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(out, "config.json"), cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := copySideFiles(src, out); err != nil {
		t.Fatal(err)
	}
	qe, err := engine.Open(context.Background(), out, engine.Options{Threads: 1, DequantizeWeights: true})
	if err != nil {
		t.Fatal(err)
	}
	defer qe.Close()
	fm, err := runtime.NewCPU().Load(context.Background(), d, ov, runtime.LoadOptions{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer fm.Close()
	om, err := runtime.NewCPU().Load(context.Background(), d, ck, runtime.LoadOptions{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer om.Close()
	ids := heldoutIDs(t, qe)[:128]
	ql := logits(t, qe.Model, ids)
	if diff := maxAbsDiff(ql, logits(t, fm, ids)); diff > 1e-5 {
		t.Errorf("quantized experts: logits differ from the fake-quantized model by %g", diff)
	}
	// And the quantization is visible: the logits moved from the float model's.
	if diff := maxAbsDiff(ql, logits(t, om, ids)); diff < 1e-3 {
		t.Errorf("quantized experts: logits within %g of the float model; were the quantized tensors used?", diff)
	} else {
		t.Logf("max |logit change| from quantizing two experts' weights: %.4g", diff)
	}
}
