package export

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/calibrate"
	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/internal/field"
	"github.com/lmpack/lmpack/internal/shared"
	"github.com/lmpack/lmpack/model"
	"github.com/lmpack/lmpack/pack"
	"github.com/lmpack/lmpack/prune"
	"github.com/lmpack/lmpack/quantize/oscar"
	"github.com/lmpack/lmpack/quantize/wquant"
	"github.com/lmpack/lmpack/runtime"
)

// ctCalib writes a small calibration file (512 tokens, windows of 128)
// of modelDir.
func ctCalib(t *testing.T, modelDir, dir string) string {
	t.Helper()
	return benchCalib(t, modelDir, dir)
}

func benchCalib(t testing.TB, modelDir, dir string) string {
	t.Helper()
	out := filepath.Join(dir, "calib.safetensors")
	if _, err := calibrate.Run(t.Context(), calibrate.Options{Model: modelDir, Data: shared.Path(t, "tinystories-valid", "calib.txt"),
		Tokens: 512, Ctx: 128, Out: out, Threads: 1, Version: "test"}); err != nil {
		t.Fatal(err)
	}
	return out
}

// synthLlama writes a random Llama checkpoint (seeded) with hidden 256,
// intermediate 512, 4 heads of head_dim 64, 2 KV heads, 2 layers and
// stories260K's tokenizer, so that group 128 is a real group on every
// weight. extra is merged into config.json; layer shapes follow it.
func synthLlama(t *testing.T, dir string, extra map[string]any) string {
	t.Helper()
	cfg := map[string]any{
		"architectures": []string{"LlamaForCausalLM"}, "model_type": "llama",
		"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
		"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
		"vocab_size": 512, "max_position_embeddings": 512, "rms_norm_eps": 1e-5,
		"rope_theta": 10000.0, "tie_word_embeddings": false, "bos_token_id": 1, "eos_token_id": 2,
		"torch_dtype": "float32",
	}
	for k, v := range extra {
		cfg[k] = v
	}
	b, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	d, err := arch.Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(7, 15))
	var ts []safetensors.WriteTensor
	for name, sh := range d.TensorShapes() {
		n := 1
		for _, s := range sh {
			n *= s
		}
		w := make([]float32, n)
		for i := range w {
			if len(sh) == 1 {
				w[i] = 1 + 0.1*float32(rng.NormFloat64())
			} else {
				w[i] = 0.05 * float32(rng.NormFloat64())
			}
		}
		ts = append(ts, safetensors.FromFloat32(name, sh, w))
	}
	if err := safetensors.WriteFile(filepath.Join(dir, "model.safetensors"), ts, nil); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"} {
		src, err := os.ReadFile(shared.Path(t, "stories260K-hf", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), src, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func ctQuantize(t *testing.T, modelDir, calib, out, method string, bits, group int, sym, actOrder bool) string {
	t.Helper()
	if _, err := wquant.Run(t.Context(), wquant.Options{Model: modelDir, Calib: calib, Out: out, Method: method,
		Bits: bits, GroupSize: group, Symmetric: sym, ActOrder: actOrder, Threads: 1, Version: "test"}); err != nil {
		t.Fatal(err)
	}
	return out
}

// f16 converts IEEE 754 binary16 bits to float32 (written here from the
// IEEE format, not taken from the code under test).
func f16(h uint16) float32 {
	sign := float32(1)
	if h&0x8000 != 0 {
		sign = -1
	}
	e := int(h>>10) & 0x1f
	m := float64(h & 0x3ff)
	switch e {
	case 0:
		return sign * float32(math.Ldexp(m, -24))
	case 31:
		if m == 0 {
			return sign * float32(math.Inf(1))
		}
		return float32(math.NaN())
	}
	return sign * float32(math.Ldexp(1+m/1024, e-15))
}

// ctArgsJSON is a config group's "weights" as the test reads it.
type ctArgsJSON struct {
	NumBits   int     `json:"num_bits"`
	Type      string  `json:"type"`
	Symmetric bool    `json:"symmetric"`
	GroupSize *int    `json:"group_size"`
	Strategy  string  `json:"strategy"`
	ActOrder  *string `json:"actorder"`
	Dynamic   bool    `json:"dynamic"`
	Observer  string  `json:"observer"`
}

// ctUnpack decodes the compressed-tensors weight prefix of the export in
// ck as its documentation (compressed-tensors pack_to_int32 /
// unpack_from_int32, QuantizationArgs, dequantize) describes it: unsigned
// values packed 32/bits per int32, value i in bits [i·bits, (i+1)·bits),
// along the input dimension for weight_packed and along the output
// dimension for weight_zero_point; signed value = unsigned − 2^(bits−1);
// w[r, c] = (q[r, c] − zp[r, g]) · scale[r, g] with g = g_idx[c] when
// weight_g_idx exists, else c / group_size (group) or 0 (channel).
func ctUnpack(t *testing.T, ck *safetensors.Checkpoint, prefix string, a ctArgsJSON) []float32 {
	t.Helper()
	get := func(suffix string, dt safetensors.DType) *safetensors.Tensor {
		x, err := ck.Tensor(prefix + suffix)
		if err != nil {
			t.Fatalf("%s%s: %v", prefix, suffix, err)
		}
		if x.DType != dt {
			t.Fatalf("%s%s: dtype %s, want %s", prefix, suffix, x.DType, dt)
		}
		return x
	}
	shape := get(".weight_shape", safetensors.I64)
	if !slices.Equal(shape.Shape, []int{2}) {
		t.Fatalf("%s.weight_shape shape %v", prefix, shape.Shape)
	}
	rows := int(int64(binary.LittleEndian.Uint64(shape.Data)))
	cols := int(int64(binary.LittleEndian.Uint64(shape.Data[8:])))
	bits := a.NumBits
	pf := 32 / bits
	off := int32(1) << (bits - 1)
	mask := uint32(1)<<bits - 1
	packed := get(".weight_packed", safetensors.I32)
	if !slices.Equal(packed.Shape, []int{rows, (cols + pf - 1) / pf}) {
		t.Fatalf("%s.weight_packed shape %v for [%d %d]", prefix, packed.Shape, rows, cols)
	}
	word := func(t *safetensors.Tensor, i int) uint32 { return binary.LittleEndian.Uint32(t.Data[4*i:]) }
	q := func(r, c int) int32 {
		w := word(packed, r*packed.Shape[1]+c/pf)
		return int32(w>>(uint(c%pf)*uint(bits))&mask) - off
	}
	scale := get(".weight_scale", safetensors.F16)
	ng := scale.Shape[1]
	if scale.Shape[0] != rows {
		t.Fatalf("%s.weight_scale shape %v", prefix, scale.Shape)
	}
	switch a.Strategy {
	case "channel":
		if ng != 1 || a.GroupSize != nil {
			t.Fatalf("%s: channel strategy with scale shape %v, group_size %v", prefix, scale.Shape, a.GroupSize)
		}
	case "group":
		if a.GroupSize == nil || ng != cols / *a.GroupSize {
			t.Fatalf("%s: group strategy with scale shape %v, group_size %v", prefix, scale.Shape, a.GroupSize)
		}
	default:
		t.Fatalf("%s: strategy %q", prefix, a.Strategy)
	}
	sc := func(r, g int) float32 { return f16(binary.LittleEndian.Uint16(scale.Data[2*(r*ng+g):])) }
	zp := func(r, g int) int32 { return 0 }
	if !a.Symmetric {
		z := get(".weight_zero_point", safetensors.I32)
		if !slices.Equal(z.Shape, []int{(rows + pf - 1) / pf, ng}) {
			t.Fatalf("%s.weight_zero_point shape %v", prefix, z.Shape)
		}
		zp = func(r, g int) int32 {
			w := word(z, (r/pf)*ng+g)
			return int32(w>>(uint(r%pf)*uint(bits))&mask) - off
		}
	} else if _, err := ck.Tensor(prefix + ".weight_zero_point"); err == nil {
		t.Fatalf("%s: symmetric with a weight_zero_point", prefix)
	}
	group := func(c int) int {
		if a.Strategy == "channel" {
			return 0
		}
		return c / *a.GroupSize
	}
	if a.ActOrder != nil {
		gi := get(".weight_g_idx", safetensors.I32)
		if !slices.Equal(gi.Shape, []int{cols}) {
			t.Fatalf("%s.weight_g_idx shape %v", prefix, gi.Shape)
		}
		group = func(c int) int { return int(int32(word(gi, c))) }
	} else if _, err := ck.Tensor(prefix + ".weight_g_idx"); err == nil {
		t.Fatalf("%s: weight_g_idx without actorder", prefix)
	}
	out := make([]float32, rows*cols)
	for r := 0; r < rows; r++ {
		for c := 0; c < cols; c++ {
			g := group(c)
			out[r*cols+c] = float32(q(r, c)-zp(r, g)) * sc(r, g)
		}
	}
	return out
}

// ctConfig reads the export's config.json.
func ctReadConfig(t *testing.T, dir string) map[string]json.RawMessage {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

type ctQC struct {
	QuantMethod  string `json:"quant_method"`
	Format       string `json:"format"`
	ConfigGroups map[string]struct {
		Targets           []string        `json:"targets"`
		Weights           ctArgsJSON      `json:"weights"`
		InputActivations  json.RawMessage `json:"input_activations"`
		OutputActivations json.RawMessage `json:"output_activations"`
	} `json:"config_groups"`
	Ignore             []string        `json:"ignore"`
	KVCacheScheme      json.RawMessage `json:"kv_cache_scheme"`
	QuantizationStatus string          `json:"quantization_status"`
	Version            string          `json:"version"`
}

// checkCTExport checks the export at out of the quantized checkpoint
// qdir: config.json field by field (every other key unchanged), and every
// quantized weight decoded by ctUnpack equal bit for bit to lmpack's
// dequantized weight (runtime.WithQuant); float tensors byte-equal.
// It returns the number of act-order weights seen.
func checkCTExport(t *testing.T, qdir, out string, wantKV bool) int {
	t.Helper()
	d, ck, err := model.OpenDir(qdir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	src := ctReadConfig(t, qdir)
	got := ctReadConfig(t, out)
	if _, ok := got[arch.QuantKey]; ok {
		t.Errorf("config.json keeps %s", arch.QuantKey)
	}
	for k, v := range src {
		if k == arch.QuantKey {
			continue
		}
		var a, b any
		json.Unmarshal(v, &a)
		json.Unmarshal(got[k], &b)
		if fmt.Sprint(a) != fmt.Sprint(b) {
			t.Errorf("config.json %q: %s, source %s", k, got[k], v)
		}
	}
	var qc ctQC
	if err := json.Unmarshal(got["quantization_config"], &qc); err != nil {
		t.Fatalf("quantization_config: %v (%s)", err, got["quantization_config"])
	}
	if qc.QuantMethod != "compressed-tensors" || qc.Format != "pack-quantized" || qc.QuantizationStatus != "compressed" || qc.Version == "" {
		t.Errorf("quantization_config header %+v", qc)
	}
	if !slices.Contains(qc.Ignore, "lm_head") {
		t.Errorf("ignore %v lacks lm_head", qc.Ignore)
	}
	if wantKV != (string(qc.KVCacheScheme) != "null") {
		t.Errorf("kv_cache_scheme %s, want present %v", qc.KVCacheScheme, wantKV)
	}
	// The config group of each module.
	// (A module's own name matches before the class target "Linear".)
	linear := 0
	for _, g := range qc.ConfigGroups {
		if string(g.InputActivations) != "null" || string(g.OutputActivations) != "null" {
			t.Errorf("group activations %s %s, want null", g.InputActivations, g.OutputActivations)
		}
		if slices.Contains(g.Targets, "Linear") {
			linear++
		}
	}
	if len(d.Quant.Tensors) > 0 && linear != 1 {
		t.Errorf("%d config groups target Linear, want 1", linear)
	}
	groupOf := func(mod string) (ctArgsJSON, bool) {
		for _, g := range qc.ConfigGroups {
			if slices.Contains(g.Targets, mod) {
				return g.Weights, true
			}
		}
		for _, g := range qc.ConfigGroups {
			if slices.Equal(g.Targets, []string{"Linear"}) && !slices.Contains(qc.Ignore, mod) {
				return g.Weights, true
			}
		}
		return ctArgsJSON{}, false
	}
	ex, err := safetensors.OpenDir(out)
	if err != nil {
		t.Fatal(err)
	}
	defer ex.Close()
	lm := runtime.WithQuant(d, ck)
	acts := 0
	shapes := d.TensorShapes()
	for _, n := range d.TensorNames() {
		mod := strings.TrimSuffix(n, ".weight")
		tq, isQ := d.Quant.Tensors[n]
		if !isQ {
			if slices.Contains(qc.Ignore, mod) == false && len(shapes[n]) == 2 && n != d.Embedding {
				t.Errorf("float weight %s is not in ignore %v", n, qc.Ignore)
			}
			want, err := ck.Tensor(n)
			if err != nil {
				if n == d.LMHead && d.TieWordEmbeddings {
					continue
				}
				t.Fatal(err)
			}
			g, err := ex.Tensor(n)
			if err != nil || g.DType != want.DType || !bytes.Equal(g.Data, want.Data) {
				t.Errorf("float tensor %s differs (%v)", n, err)
			}
			continue
		}
		a, ok := groupOf(mod)
		if !ok {
			t.Fatalf("%s: no config group targets it", mod)
		}
		wantStrat, wantGroup := "group", tq.GroupSize
		if tq.GroupSize == shapes[n][1] {
			wantStrat, wantGroup = "channel", 0
		}
		gs := 0
		if a.GroupSize != nil {
			gs = *a.GroupSize
		}
		if a.NumBits != tq.Bits || a.Type != "int" || a.Symmetric != tq.Symmetric || a.Strategy != wantStrat || gs != wantGroup ||
			a.Dynamic || a.Observer == "" || (a.ActOrder != nil) != tq.Perm || (a.ActOrder != nil && *a.ActOrder != "group") {
			t.Fatalf("%s: config group weights %+v (actorder %v) for %+v", mod, a, a.ActOrder, tq)
		}
		if tq.Perm {
			acts++
		}
		if _, err := ex.Tensor(n); err == nil {
			t.Errorf("%s: the float weight is also written", n)
		}
		wt, err := lm.Tensor(n)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := wt.Float32()
		gotW := ctUnpack(t, ex, mod, a)
		for i := range want {
			if math.Float32bits(want[i]) != math.Float32bits(gotW[i]) {
				t.Fatalf("%s element %d: decoded %v, lmpack %v", n, i, gotW[i], want[i])
			}
		}
	}
	return acts
}

// sameTree fails unless directories a and b hold the same files with the
// same bytes.
func sameTree(t *testing.T, a, b string) {
	t.Helper()
	read := func(root string) map[string][]byte {
		m := map[string][]byte{}
		filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
			if err == nil && e.Type().IsRegular() {
				rel, _ := filepath.Rel(root, p)
				m[rel], _ = os.ReadFile(p)
			}
			return nil
		})
		return m
	}
	ma, mb := read(a), read(b)
	if len(ma) != len(mb) {
		t.Fatalf("%d files vs %d", len(ma), len(mb))
	}
	for k, v := range ma {
		if !bytes.Equal(v, mb[k]) {
			t.Fatalf("%s differs between runs", k)
		}
	}
}

// TestCompressedTensorsDecodesExactly is issue 15's compressed-tensors
// acceptance: checkpoints quantized by wquant (RTN, and GPTQ with
// act-order) at 4 and 8 bits, group 32, group 128 and per channel,
// symmetric and asymmetric, exported and decoded by ctUnpack, equal
// lmpack's dequantized weights bit for bit; config.json is checked field
// by field; a second export is byte-identical; tokenizer files are copied.
func TestCompressedTensorsDecodesExactly(t *testing.T) {
	s260 := shared.Path(t, "stories260K-hf")
	t1m := shared.Path(t, "tiny1m-hf")
	root := t.TempDir()
	synth := synthLlama(t, filepath.Join(root, "synth"), nil)
	// Depth-pruned: stories260K without block 2 (lmpack prune, list:2).
	depthDir := filepath.Join(root, "depth")
	if _, err := prune.Run(t.Context(), prune.Options{Model: s260, Out: depthDir, Method: "list:2", Threads: 1}); err != nil {
		t.Fatal(err)
	}
	models := map[string]string{"s260": s260, "t1m": t1m, "synth": synth, "depth": depthDir,
		"moe": shared.Path(t, "stories260K-moe-hf"), "qwen3moe": shared.Path(t, "qwen3moe-2m-hf")}
	calibs := map[string]string{}
	for name, dir := range models {
		cd := filepath.Join(root, "calib-"+name)
		os.MkdirAll(cd, 0o755)
		calibs[name] = ctCalib(t, dir, cd)
	}
	cases := []struct {
		model, method string
		bits, group   int
		sym, act      bool
	}{
		{"s260", wquant.MethodRTN, 4, 32, true, false},
		{"s260", wquant.MethodRTN, 8, 0, false, false},
		{"t1m", wquant.MethodRTN, 8, 32, false, false},
		{"t1m", wquant.MethodRTN, 4, 0, true, false},
		{"synth", wquant.MethodRTN, 4, 128, false, false},
		{"synth", wquant.MethodRTN, 8, 128, true, false},
		{"s260", wquant.MethodGPTQ, 4, 32, false, true},
		{"synth", wquant.MethodGPTQ, 8, 128, true, true},
		{"synth", wquant.MethodGPTQ, 4, 128, false, true},
		{"depth", wquant.MethodRTN, 4, 32, false, false},
		{"moe", wquant.MethodRTN, 4, 32, true, false},
		{"qwen3moe", wquant.MethodRTN, 8, 64, false, false},
	}
	for _, tc := range cases {
		name := fmt.Sprintf("%s-%s-%db-g%d-sym%v-act%v", tc.model, tc.method, tc.bits, tc.group, tc.sym, tc.act)
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join(root, name)
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			qdir := ctQuantize(t, models[tc.model], calibs[tc.model], filepath.Join(dir, "q"), tc.method, tc.bits, tc.group, tc.sym, tc.act)
			out := filepath.Join(dir, "ct")
			rep, err := CompressedTensors(t.Context(), qdir, CTOptions{Out: out})
			if err != nil {
				t.Fatal(err)
			}
			acts := checkCTExport(t, qdir, out, false)
			if tc.model == "depth" {
				if n := string(ctReadConfig(t, out)["num_hidden_layers"]); n != "4" {
					t.Fatalf("depth-pruned export: num_hidden_layers %s, want 4", n)
				}
			}
			if tc.act && acts == 0 {
				t.Fatalf("act-order case exported no act-order weight")
			}
			if !tc.act && acts != 0 {
				t.Fatalf("%d act-order weights without act-order", acts)
			}
			if rep.Format != FormatCompressedTensors || rep.Counts()[ModeExact] != len(rep.Tensors) || rep.BitsPerWeight <= 0 || rep.Bytes <= 0 {
				t.Fatalf("report %+v", rep)
			}
			for _, f := range []string{"tokenizer.json", "tokenizer_config.json", "model.safetensors.index.json"} {
				if _, err := os.Stat(filepath.Join(out, f)); err != nil {
					t.Errorf("%s: %v", f, err)
				}
			}
			out2 := filepath.Join(dir, "ct2")
			if _, err := CompressedTensors(t.Context(), qdir, CTOptions{Out: out2}); err != nil {
				t.Fatal(err)
			}
			sameTree(t, out, out2)
			t.Logf("%s: %.3f bits per weight, %d bytes, %d act-order weights; warnings %q", name, rep.BitsPerWeight, rep.Bytes, acts, rep.Warnings)
		})
	}
}

// noLeftovers fails when dir holds anything but the names in keep.
func noLeftovers(t *testing.T, dir string, keep ...string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if !slices.Contains(keep, e.Name()) {
			t.Errorf("%s left behind in %s", e.Name(), dir)
		}
	}
}

// TestCompressedTensorsRefuses: 2- and 3-bit weights, a width-pruned
// model, an existing output and options without Out are refused with an
// error naming the reason, and nothing is left behind.
func TestCompressedTensorsRefuses(t *testing.T) {
	s260 := shared.Path(t, "stories260K-hf")
	root := t.TempDir()
	calib := ctCalib(t, s260, root)
	for _, bits := range []int{2, 3} {
		qdir := ctQuantize(t, s260, calib, filepath.Join(root, fmt.Sprintf("q%d", bits)), wquant.MethodRTN, bits, 32, false, false)
		od := t.TempDir()
		_, err := CompressedTensors(t.Context(), qdir, CTOptions{Out: filepath.Join(od, "ct")})
		if !errors.Is(err, ErrCTUnsupported) || !strings.Contains(err.Error(), fmt.Sprintf("%d-bit", bits)) || !strings.Contains(err.Error(), "vLLM") {
			t.Fatalf("%d bits: %v", bits, err)
		}
		noLeftovers(t, od)
	}

	// Width-pruned: layer 1 keeps 2 of 4 heads and 256 of 512 FFN rows.
	wp := synthLlama(t, filepath.Join(root, "wp"), map[string]any{"layer_configs": []map[string]int{
		{"num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 512},
		{"num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 256}}})
	od := t.TempDir()
	_, err := CompressedTensors(t.Context(), wp, CTOptions{Out: filepath.Join(od, "ct")})
	if !errors.Is(err, ErrCTUnsupported) || !strings.Contains(err.Error(), "width-pruned") || !strings.Contains(err.Error(), "layer 1") {
		t.Fatalf("width-pruned: %v", err)
	}
	noLeftovers(t, od)

	// A checkpoint width-pruned by lmpack prune (4 head groups, a quarter
	// of every FFN), then quantized.
	pdir := filepath.Join(root, "pruned")
	if _, err := prune.Run(t.Context(), prune.Options{Model: s260, Calib: calib, Out: pdir, HeadGroups: 4, HeadMethod: prune.HeadProxy,
		FFNRatio: 0.25, NoRefit: true, Threads: 1}); err != nil {
		t.Fatal(err)
	}
	pq := ctQuantize(t, pdir, ctCalib(t, pdir, t.TempDir()), filepath.Join(root, "pruned-q"), wquant.MethodRTN, 4, 32, true, false)
	for _, m := range []string{pdir, pq} {
		_, err = CompressedTensors(t.Context(), m, CTOptions{Out: filepath.Join(od, "ct")})
		if !errors.Is(err, ErrCTUnsupported) || !strings.Contains(err.Error(), "width-pruned") {
			t.Fatalf("prune width output %s: %v", m, err)
		}
		noLeftovers(t, od)
	}

	// Uniform layer_configs (every layer as the top level) is no pruning.
	up := synthLlama(t, filepath.Join(root, "up"), map[string]any{"layer_configs": []map[string]int{
		{"num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 512},
		{"num_attention_heads": 4, "num_key_value_heads": 2}}})
	if _, err := CompressedTensors(t.Context(), up, CTOptions{Out: filepath.Join(od, "up")}); err != nil {
		t.Fatalf("uniform layer_configs: %v", err)
	}
	if _, ok := ctReadConfig(t, filepath.Join(od, "up"))["layer_configs"]; ok {
		t.Errorf("uniform layer_configs kept")
	}

	// An existing output (a file) is left as it was.
	ex := filepath.Join(od, "exists")
	os.WriteFile(ex, []byte("keep"), 0o644)
	_, err = CompressedTensors(t.Context(), s260, CTOptions{Out: ex})
	if err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Fatalf("existing output: %v", err)
	}
	if b, _ := os.ReadFile(ex); string(b) != "keep" {
		t.Fatalf("existing output overwritten: %q", b)
	}
	noLeftovers(t, od, "exists", "up")

	var fe *field.Error
	if _, err := CompressedTensors(t.Context(), s260, CTOptions{}); !errors.As(err, &fe) || fe.Field != "Out" {
		t.Fatalf("no Out: %v", err)
	}
	if err := (&CTOptions{Out: "x", Threads: -1}).Validate(); !errors.As(err, &fe) || fe.Field != "Threads" {
		t.Fatalf("Threads -1: %v", err)
	}
}

// TestCompressedTensorsArtifactKV: an artifact with an oscar2 KV cache
// (INT2 codes with OSCAR rotations) is refused, naming the scheme, with
// nothing left behind; with DropKV its weights export exactly and the
// report says the scheme was left out. The weights of that artifact
// (a 4-bit group-32 checkpoint) decode to lmpack's dequantized weights.
func TestCompressedTensorsArtifactKV(t *testing.T) {
	s260 := shared.Path(t, "stories260K-hf")
	root := t.TempDir()
	calib := ctCalib(t, s260, root)
	qdir := ctQuantize(t, s260, calib, filepath.Join(root, "q"), wquant.MethodRTN, 4, 32, false, false)
	qcal := filepath.Join(root, "qcal")
	os.MkdirAll(qcal, 0o755)
	rot := filepath.Join(root, "rot.safetensors")
	if _, err := oscar.QuantizeKV(t.Context(), oscar.KVOptions{Model: qdir, Calib: ctCalib(t, qdir, qcal), Method: oscar.Method,
		ClipK: oscar.DefaultClipK, ClipV: oscar.DefaultClipV, Out: rot, Version: "test"}); err != nil {
		t.Fatal(err)
	}
	a, err := pack.FromCheckpoint(qdir, pack.FromOptions{KVRotations: rot, LmpackVersion: "test"})
	if err != nil {
		t.Fatal(err)
	}
	art := filepath.Join(root, "m.lmpk")
	_, err = pack.Write(art, a, pack.WriteOptions{})
	a.Close()
	if err != nil {
		t.Fatal(err)
	}
	od := t.TempDir()
	_, err = CompressedTensors(t.Context(), art, CTOptions{Out: filepath.Join(od, "ct")})
	if !errors.Is(err, ErrCTUnsupported) || !strings.Contains(err.Error(), `"oscar2"`) || !strings.Contains(err.Error(), "DropKV") {
		t.Fatalf("oscar2 artifact: %v", err)
	}
	noLeftovers(t, od)
	out := filepath.Join(od, "ct")
	rep, err := CompressedTensors(t.Context(), art, CTOptions{Out: out, DropKV: true})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(rep.Warnings, func(w string) bool { return strings.Contains(w, "oscar2") && strings.Contains(w, "left out") }) {
		t.Fatalf("warnings %q do not say the KV scheme was left out", rep.Warnings)
	}
	checkCTExport(t, qdir, out, false)
	if _, err := os.Stat(filepath.Join(out, "tokenizer.json")); err != nil {
		t.Errorf("artifact's tokenizer.json: %v", err)
	}
	// The artifact's export equals the checkpoint's.
	out2 := filepath.Join(od, "ck")
	if _, err := CompressedTensors(t.Context(), qdir, CTOptions{Out: out2}); err != nil {
		t.Fatal(err)
	}
	ea, _ := safetensors.OpenDir(out)
	eb, _ := safetensors.OpenDir(out2)
	defer ea.Close()
	defer eb.Close()
	if !slices.Equal(ea.Names(), eb.Names()) {
		t.Fatalf("tensor names differ: %d vs %d", len(ea.Names()), len(eb.Names()))
	}
	for _, n := range ea.Names() {
		x, _ := ea.Tensor(n)
		y, _ := eb.Tensor(n)
		if !bytes.Equal(x.Data, y.Data) {
			t.Fatalf("%s differs between the artifact's and the checkpoint's export", n)
		}
	}
}

// kvObs records max |k| and max |v| per layer.
type kvObs struct{ k, v []float64 }

func (o *kvObs) QKV(layer, pos, n int, q, k, v []float32) {
	for _, x := range k {
		o.k[layer] = max(o.k[layer], math.Abs(float64(x)))
	}
	for _, x := range v {
		o.v[layer] = max(o.v[layer], math.Abs(float64(x)))
	}
}

// TestCompressedTensorsKVScales: with KVCalib the export has an FP8
// kv_cache_scheme (num_bits 8, type float, strategy tensor) and per-layer
// self_attn.k_scale/v_scale equal to max|K|/448 and max|V|/448 over the
// calibration file's token ids, run through the quantized model.
func TestCompressedTensorsKVScales(t *testing.T) {
	s260 := shared.Path(t, "stories260K-hf")
	root := t.TempDir()
	calib := ctCalib(t, s260, root)
	qdir := ctQuantize(t, s260, calib, filepath.Join(root, "q"), wquant.MethodRTN, 4, 32, true, false)
	out := filepath.Join(root, "ct")
	rep, err := CompressedTensors(t.Context(), qdir, CTOptions{Out: out, KVCalib: calib, Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	checkCTExport(t, qdir, out, true)
	var qc struct {
		KV struct {
			NumBits  int    `json:"num_bits"`
			Type     string `json:"type"`
			Strategy string `json:"strategy"`
			Dynamic  bool   `json:"dynamic"`
		} `json:"kv_cache_scheme"`
	}
	json.Unmarshal(ctReadConfig(t, out)["quantization_config"], &qc)
	if qc.KV.NumBits != 8 || qc.KV.Type != "float" || qc.KV.Strategy != "tensor" || qc.KV.Dynamic {
		t.Fatalf("kv_cache_scheme %+v", qc.KV)
	}
	// Independent maxima: the quantized model on the calibration tokens.
	l, err := model.Load(t.Context(), qdir, model.LoadOptions{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, err := calibrate.Read(calib, model.Expect{})
	if err != nil {
		t.Fatal(err)
	}
	nl := len(l.Desc.Layers)
	o := &kvObs{k: make([]float64, nl), v: make([]float64, nl)}
	l.Model.SetObserver(o)
	cache := l.Model.NewCache(c.Header.Ctx)
	logits := make([]float32, l.Desc.VocabSize)
	for i := 0; i+c.Header.Ctx <= len(c.TokenIDs); i += c.Header.Ctx {
		cache.Truncate(0)
		if err := l.Model.Forward(t.Context(), c.TokenIDs[i:i+c.Header.Ctx], cache, logits, false); err != nil {
			t.Fatal(err)
		}
	}
	ex, err := safetensors.OpenDir(out)
	if err != nil {
		t.Fatal(err)
	}
	defer ex.Close()
	for i := 0; i < nl; i++ {
		for _, kv := range []struct {
			name string
			max  float64
		}{{"k_scale", o.k[i]}, {"v_scale", o.v[i]}} {
			x, err := ex.Tensor(fmt.Sprintf("model.layers.%d.self_attn.%s", i, kv.name))
			if err != nil {
				t.Fatal(err)
			}
			got := math.Float32frombits(binary.LittleEndian.Uint32(x.Data))
			if x.DType != safetensors.F32 || len(x.Shape) != 0 || kv.max <= 0 || got != float32(kv.max/448) {
				t.Fatalf("layer %d %s: %v %v = %v, want max %v / 448 = %v", i, kv.name, x.DType, x.Shape, got, kv.max, float32(kv.max/448))
			}
		}
	}
	if !slices.ContainsFunc(rep.Warnings, func(w string) bool { return strings.Contains(w, "second moments") }) {
		t.Errorf("warnings %q do not say which statistic was used", rep.Warnings)
	}
}

// TestCompressedTensorsFloat: a float checkpoint exports as a stock
// Hugging Face directory (no quantization_config, tensors byte-equal,
// a warning that nothing is quantized); with KVCalib it gets a
// quantization_config holding only the FP8 kv_cache_scheme.
func TestCompressedTensorsFloat(t *testing.T) {
	s260 := shared.Path(t, "stories260K-hf")
	root := t.TempDir()
	out := filepath.Join(root, "ct")
	rep, err := CompressedTensors(t.Context(), s260, CTOptions{Out: out})
	if err != nil {
		t.Fatal(err)
	}
	cfg := ctReadConfig(t, out)
	if _, ok := cfg["quantization_config"]; ok {
		t.Fatalf("float export has quantization_config %s", cfg["quantization_config"])
	}
	// stories260K is tied and stores an lm_head.weight copy, which is said
	// and left out.
	if len(rep.Warnings) != 2 || !strings.Contains(rep.Warnings[0], "no quantized weights") || !strings.Contains(rep.Warnings[1], "lm_head.weight is a stored copy") {
		t.Fatalf("warnings %q", rep.Warnings)
	}
	ck, err := safetensors.OpenDir(s260)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	ex, err := safetensors.OpenDir(out)
	if err != nil {
		t.Fatal(err)
	}
	defer ex.Close()
	if want := slices.DeleteFunc(ck.Names(), func(n string) bool { return n == "lm_head.weight" }); !slices.Equal(want, ex.Names()) {
		t.Fatalf("names %v, want %v", ex.Names(), ck.Names())
	}
	for _, n := range ex.Names() {
		a, _ := ck.Tensor(n)
		b, _ := ex.Tensor(n)
		if a.DType != b.DType || !bytes.Equal(a.Data, b.Data) {
			t.Fatalf("%s differs", n)
		}
	}
	calib := ctCalib(t, s260, root)
	out2 := filepath.Join(root, "kv")
	if _, err := CompressedTensors(t.Context(), s260, CTOptions{Out: out2, KVCalib: calib, Threads: 1}); err != nil {
		t.Fatal(err)
	}
	var qc ctQC
	if err := json.Unmarshal(ctReadConfig(t, out2)["quantization_config"], &qc); err != nil {
		t.Fatal(err)
	}
	if qc.QuantMethod != "compressed-tensors" || len(qc.ConfigGroups) != 0 || string(qc.KVCacheScheme) == "null" || len(qc.KVCacheScheme) == 0 {
		t.Fatalf("KV-only quantization_config %+v", qc)
	}
}
