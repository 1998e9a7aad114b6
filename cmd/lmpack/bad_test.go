package main

// Bad input: broken checkpoints, configs, data files and flags. Every case
// must exit 1 with one "lmpack: ..." line naming the file, the tensor or
// flag and what was expected, and never panic. Broken model directories
// are built in t.TempDir() from the shared stories260K-hf files.

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/internal/shared"
)

// sideFiles are the non-weight files of stories260K-hf copied into each
// broken model directory.
var sideFiles = []string{"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model"}

// brokenDir returns a new directory holding stories260K-hf's config and
// tokenizer files and, as model.safetensors, the bytes st (nil: none).
func brokenDir(t *testing.T, st []byte) string {
	t.Helper()
	dir := t.TempDir()
	for _, f := range sideFiles {
		b, err := os.ReadFile(shared.Path(t, "stories260K-hf", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if st != nil {
		if err := os.WriteFile(filepath.Join(dir, "model.safetensors"), st, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// origSafetensors returns the bytes of the shared model.safetensors.
func origSafetensors(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile(shared.Path(t, "stories260K-hf", "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// origTensors reads every tensor of the shared model.safetensors into
// WriteTensors (data copied), in name order.
func origTensors(t *testing.T) []safetensors.WriteTensor {
	t.Helper()
	f, err := safetensors.Open(shared.Path(t, "stories260K-hf", "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []safetensors.WriteTensor
	for _, ti := range f.Tensors() {
		ten, err := f.Tensor(ti.Name)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, safetensors.WriteTensor{Name: ti.Name, DType: ti.DType, Shape: slices.Clone(ti.Shape), Data: slices.Clone(ten.Data)})
	}
	if len(out) != 48 {
		t.Fatalf("shared model.safetensors has %d tensors, SOURCE.md says 48", len(out))
	}
	return out
}

// writeTensorsDir writes tensors as model.safetensors of a new broken dir.
func writeTensorsDir(t *testing.T, tensors []safetensors.WriteTensor) string {
	t.Helper()
	dir := brokenDir(t, nil)
	if err := safetensors.WriteFile(filepath.Join(dir, "model.safetensors"), tensors, map[string]string{"format": "pt"}); err != nil {
		t.Fatal(err)
	}
	return dir
}

// splitFile splits safetensors bytes into the JSON header (as generic
// entries) and the data section.
func splitFile(t *testing.T, b []byte) (map[string]map[string]any, []byte) {
	t.Helper()
	n := binary.LittleEndian.Uint64(b)
	hdr := map[string]map[string]any{}
	if err := json.Unmarshal(b[8:8+n], &hdr); err != nil {
		t.Fatal(err)
	}
	return hdr, b[8+n:]
}

// joinFile builds safetensors bytes from a header (padded with spaces to a
// multiple of 8) and a data section; nothing is validated.
func joinFile(t *testing.T, hdr map[string]map[string]any, data []byte) []byte {
	t.Helper()
	h, err := json.Marshal(hdr)
	if err != nil {
		t.Fatal(err)
	}
	for len(h)%8 != 0 {
		h = append(h, ' ')
	}
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(h)))
	out = append(out, h...)
	return append(out, data...)
}

// offsets returns an entry's data_offsets.
func offsets(t *testing.T, e map[string]any) (int64, int64) {
	t.Helper()
	o, ok := e["data_offsets"].([]any)
	if !ok || len(o) != 2 {
		t.Fatalf("bad data_offsets in %v", e)
	}
	return int64(o[0].(float64)), int64(o[1].(float64))
}

// tensorsByOffset returns the tensor names of a header sorted by offset.
func tensorsByOffset(t *testing.T, hdr map[string]map[string]any) []string {
	t.Helper()
	var names []string
	for n := range hdr {
		if n != "__metadata__" {
			names = append(names, n)
		}
	}
	slices.SortFunc(names, func(a, b string) int {
		x, _ := offsets(t, hdr[a])
		y, _ := offsets(t, hdr[b])
		return int(x - y)
	})
	return names
}

// commands are the three subcommands that open a model, with arguments
// that would succeed on a good model.
func commands(t *testing.T) map[string][]string {
	return map[string][]string{
		"eval":    {"eval", "MODEL", "--data", valText(t), "--ctx", "64", "--max-windows", "1"},
		"run":     {"run", "MODEL", "--max-tokens", "4"},
		"inspect": {"inspect", "MODEL"},
	}
}

func withModel(args []string, model string) []string {
	out := slices.Clone(args)
	for i, a := range out {
		if a == "MODEL" {
			out[i] = model
		}
	}
	return out
}

// TestBadCheckpoint: broken model.safetensors files fail eval, run and
// inspect alike with a message naming the file and the tensor.
func TestBadCheckpoint(t *testing.T) {
	t.Parallel()
	orig := origSafetensors(t)
	hdr, data := splitFile(t, orig)
	hdrLen := int64(binary.LittleEndian.Uint64(orig))
	byOff := tensorsByOffset(t, hdr)
	last := byOff[len(byOff)-1]
	first, second := byOff[0], byOff[1]
	_, firstEnd := offsets(t, hdr[first])

	type tc struct {
		name string
		file func() []byte
		want []string
	}
	cases := []tc{
		{"truncated in data", func() []byte { return orig[:len(orig)-100] },
			[]string{"model.safetensors", fmt.Sprintf("tensor %q", last), "past the data section of " + fmt.Sprint(int64(len(data))-100) + " bytes"}},
		{"truncated in header", func() []byte { return orig[:8+hdrLen/2] },
			[]string{"model.safetensors", fmt.Sprintf("header length %d runs past the end of the file (%d bytes after the length field)", hdrLen, hdrLen/2)}},
		{"shorter than length field", func() []byte { return orig[:5] },
			[]string{"model.safetensors", "file is 5 bytes, shorter than the 8-byte header length"}},
		{"header length past EOF", func() []byte {
			b := slices.Clone(orig)
			binary.LittleEndian.PutUint64(b, uint64(len(b)))
			return b
		}, []string{"model.safetensors", fmt.Sprintf("header length %d runs past the end of the file", len(orig))}},
		{"header length huge", func() []byte {
			b := slices.Clone(orig)
			binary.LittleEndian.PutUint64(b, 1<<62)
			return b
		}, []string{"model.safetensors", fmt.Sprintf("header length %d exceeds the limit", uint64(1)<<62)}},
		{"overlapping offsets", func() []byte {
			h, d := splitFile(t, orig)
			b, e := offsets(t, h[second])
			h[second]["data_offsets"] = []int64{b - 4, e - 4}
			return joinFile(t, h, d)
		}, []string{"model.safetensors", fmt.Sprintf("tensor %q", second), "overlap", fmt.Sprintf("tensor %q, which ends at %d", first, firstEnd)}},
		{"shape larger than bytes", func() []byte {
			h, d := splitFile(t, orig)
			h["model.norm.weight"]["shape"] = []int{128}
			return joinFile(t, h, d)
		}, []string{"model.safetensors", `tensor "model.norm.weight"`, "hold 256 bytes but F32 [128] needs 512"}},
		{"dtype F16 over F32 bytes", func() []byte {
			h, d := splitFile(t, orig)
			h["model.layers.1.input_layernorm.weight"]["dtype"] = "F16"
			return joinFile(t, h, d)
		}, []string{"model.safetensors", `tensor "model.layers.1.input_layernorm.weight"`, "hold 256 bytes but F16 [64] needs 128"}},
		{"unknown dtype", func() []byte {
			h, d := splitFile(t, orig)
			h["model.norm.weight"]["dtype"] = "F31"
			return joinFile(t, h, d)
		}, []string{"model.safetensors", `tensor "model.norm.weight"`, `unknown dtype "F31"`}},
		{"header not JSON", func() []byte {
			b := slices.Clone(orig)
			copy(b[8:], "[not json")
			return b
		}, []string{"model.safetensors", "header does not start with '{'"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			dir := brokenDir(t, c.file())
			for name, args := range commands(t) {
				r := lmpack(t, nil, withModel(args, dir)...)
				t.Run(name, func(t *testing.T) {
					wantError(t, r, append([]string{"malformed safetensors data"}, c.want...)...)
				})
			}
		})
	}
}

// TestBadWeights: well-formed files whose tensors do not fit the config,
// or hold NaN/Inf, fail at load (eval, run); inspect reads headers only.
func TestBadWeights(t *testing.T) {
	t.Parallel()
	const missing = "model.layers.2.mlp.up_proj.weight"
	modify := func(f func([]safetensors.WriteTensor) []safetensors.WriteTensor) string {
		return writeTensorsDir(t, f(origTensors(t)))
	}
	setF32 := func(ts []safetensors.WriteTensor, name string, i int, v float32) []safetensors.WriteTensor {
		for k := range ts {
			if ts[k].Name == name {
				binary.LittleEndian.PutUint32(ts[k].Data[4*i:], math.Float32bits(v))
				return ts
			}
		}
		t.Fatalf("no tensor %q", name)
		return nil
	}
	type tc struct {
		name       string
		dir        string
		want       []string
		inspectErr []string // nil: inspect must succeed
	}
	cases := []tc{
		{"missing tensor", modify(func(ts []safetensors.WriteTensor) []safetensors.WriteTensor {
			return slices.DeleteFunc(ts, func(w safetensors.WriteTensor) bool { return w.Name == missing })
		}), []string{"bad weights", fmt.Sprintf("%q", missing), "tensor not found"},
			[]string{fmt.Sprintf("tensor %q named by config.json is missing from the checkpoint", missing)}},
		{"shape mismatch", modify(func(ts []safetensors.WriteTensor) []safetensors.WriteTensor {
			for k := range ts {
				if ts[k].Name == "model.layers.0.self_attn.q_proj.weight" {
					ts[k].Shape = []int{32, 128}
				}
			}
			return ts
		}), []string{"bad weights", "model.safetensors", `tensor "model.layers.0.self_attn.q_proj.weight"`, "shape [32 128], want [64 64]"},
			[]string{"model.safetensors", `tensor "model.layers.0.self_attn.q_proj.weight"`, "shape [32 128], want [64 64] from config.json"}},
		{"NaN", modify(func(ts []safetensors.WriteTensor) []safetensors.WriteTensor {
			return setF32(ts, "model.layers.3.self_attn.v_proj.weight", 77, float32(math.NaN()))
		}), []string{"bad weights", "model.safetensors", `tensor "model.layers.3.self_attn.v_proj.weight"`, "element 77 is NaN", "at load"}, nil},
		{"Inf", modify(func(ts []safetensors.WriteTensor) []safetensors.WriteTensor {
			return setF32(ts, "model.norm.weight", 63, float32(math.Inf(-1)))
		}), []string{"bad weights", "model.safetensors", `tensor "model.norm.weight"`, "element 63 is Inf", "at load"}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			for name, args := range commands(t) {
				r := lmpack(t, nil, withModel(args, c.dir)...)
				t.Run(name, func(t *testing.T) {
					if name != "inspect" {
						wantError(t, r, c.want...)
						return
					}
					if c.inspectErr != nil {
						wantError(t, r, c.inspectErr...)
						return
					}
					wantOK(t, r)
					if !strings.Contains(r.stdout, "parameters:    260032") {
						t.Errorf("inspect output:\n%s", r.stdout)
					}
				})
			}
		})
	}
}

// TestBadConfig: config.json problems name config.json and what is
// supported or expected.
func TestBadConfig(t *testing.T) {
	t.Parallel()
	withConfig := func(edit func(map[string]any)) string {
		dir := brokenDir(t, origSafetensors(t))
		p := filepath.Join(dir, "config.json")
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		var cfg map[string]any
		if err := json.Unmarshal(b, &cfg); err != nil {
			t.Fatal(err)
		}
		edit(cfg)
		if b, err = json.Marshal(cfg); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	supported := []string{"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MixtralForCausalLM"}
	noConfig := brokenDir(t, origSafetensors(t))
	if err := os.Remove(filepath.Join(noConfig, "config.json")); err != nil {
		t.Fatal(err)
	}
	noWeights := brokenDir(t, nil)
	cases := []struct {
		name string
		dir  string
		want []string
	}{
		{"unknown architecture", withConfig(func(c map[string]any) {
			c["architectures"] = []string{"GPT2LMHeadModel"}
			c["model_type"] = "gpt2"
		}), append([]string{"config.json", `"GPT2LMHeadModel"`, "unsupported architecture", "supported:"}, supported...)},
		{"no architectures", withConfig(func(c map[string]any) { delete(c, "architectures") }),
			append([]string{"config.json", `no "architectures" entry`}, supported...)},
		{"zero hidden size", withConfig(func(c map[string]any) { c["hidden_size"] = 0 }),
			[]string{"config.json", "hidden_size 0: want > 0"}},
		{"no config.json", noConfig, []string{noConfig, "is not a model directory", "no config.json", "*.safetensors weights"}},
		{"pre-quantized", withConfig(func(c map[string]any) { c["quantization_config"] = map[string]any{"quant_method": "gptq", "bits": 4} }),
			[]string{"config.json", `quantization_config (quant_method "gptq")`, "not supported"}},
		{"bos out of range", withConfig(func(c map[string]any) { c["bos_token_id"] = 99999 }),
			[]string{"config.json", "bos_token_id 99999: want an id in [0, vocab_size 512)"}},
		{"layers not an integer", withConfig(func(c map[string]any) { c["num_hidden_layers"] = 5.5 }),
			[]string{"config.json", "field num_hidden_layers: got JSON number 5.5, want an integer"}},
		{"no weights", noWeights, []string{noWeights, "no safetensors weights", "model.safetensors"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			for name, args := range commands(t) {
				r := lmpack(t, nil, withModel(args, c.dir)...)
				t.Run(name, func(t *testing.T) { wantError(t, r, c.want...) })
			}
		})
	}
}

// TestBadDataFile: eval's --data must be a readable, non-empty UTF-8 text
// at least one window long; the message names the file.
func TestBadDataFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	empty := write("empty.txt", nil)
	latin1 := write("latin1.txt", []byte("Once upon a time, caf\xe9 au lait.\n"))
	short := write("short.txt", []byte("Once upon a time.\n"))
	model := modelDir(t)
	cases := []struct {
		name string
		data string
		want []string
	}{
		{"empty", empty, []string{"data file " + empty + " is empty"}},
		{"not UTF-8", latin1, []string{"data file " + latin1 + " is not valid UTF-8", "first bad byte at offset 21"}},
		{"missing", filepath.Join(dir, "nope.txt"), []string{filepath.Join(dir, "nope.txt"), "no such file"}},
		{"directory", dir, []string{dir, "is a directory"}},
		{"shorter than a window", short, []string{"data file " + short, "text shorter than one window", "window 64"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			r := lmpack(t, nil, "eval", model, "--data", c.data, "--ctx", "64")
			wantError(t, r, c.want...)
		})
	}
}

// TestBadFlags: invalid flag values and arguments are rejected before any
// work, naming the flag and the accepted range.
func TestBadFlags(t *testing.T) {
	t.Parallel()
	model := modelDir(t)
	data := valText(t)
	noSuch := filepath.Join(t.TempDir(), "no", "such", "model")
	cfgFile := shared.Path(t, "stories260K-hf", "config.json")
	cases := []struct {
		name string
		args []string
		want []string
	}{
		{"eval ctx 1", []string{"eval", model, "--data", data, "--ctx", "1"}, []string{"--ctx 1: want >= 2"}},
		{"eval ctx past max positions", []string{"eval", model, "--data", data, "--ctx", "1024"}, []string{"--ctx 1024", "max_position_embeddings 512"}},
		{"eval negative max-windows", []string{"eval", model, "--data", data, "--max-windows", "-1"}, []string{"--max-windows -1: want >= 0"}},
		{"eval missing data", []string{"eval", model}, []string{"--data FILE is required"}},
		{"eval ctx not a number", []string{"eval", model, "--data", data, "--ctx", "big"}, []string{`invalid argument "big" for "--ctx"`}},
		{"eval no model", []string{"eval", "--data", data}, []string{"accepts 1 arg(s), received 0"}},
		{"run max-tokens 0", []string{"run", model, "--max-tokens", "0"}, []string{"--max-tokens 0: want > 0"}},
		{"run top-p 2", []string{"run", model, "--top-p", "2"}, []string{"--top-p 2: want in (0, 1]"}},
		{"run negative temperature", []string{"run", model, "--temperature", "-1"}, []string{"--temperature -1: want a finite value >= 0"}},
		{"run unknown flag", []string{"run", model, "--bogus"}, []string{"unknown flag: --bogus"}},
		{"log-format xml eval", []string{"--log-format", "xml", "eval", model, "--data", data}, []string{`--log-format "xml": want text or json`}},
		{"log-format xml run", []string{"run", model, "--log-format", "xml"}, []string{`--log-format "xml": want text or json`}},
		{"log-format xml inspect", []string{"inspect", model, "--log-format", "xml"}, []string{`--log-format "xml": want text or json`}},
		{"eval model does not exist", []string{"eval", noSuch, "--data", data}, []string{noSuch, "no such directory"}},
		{"run model does not exist", []string{"run", noSuch}, []string{noSuch, "no such directory"}},
		{"inspect model does not exist", []string{"inspect", noSuch}, []string{noSuch, "no such directory"}},
		{"inspect bad id", []string{"inspect", "not--an/id"}, []string{`"not--an/id"`, "not a Hugging Face id"}},
		{"inspect model is a file", []string{"inspect", cfgFile}, []string{cfgFile, "is a file; want a model directory"}},
		{"unknown command", []string{"quantize-everything"}, []string{`unknown command "quantize-everything"`}},
		{"run top-p 0", []string{"run", model, "--top-p", "0"}, []string{"--top-p 0: want in (0, 1]"}},
		{"run temperature NaN", []string{"run", model, "--temperature", "nan"}, []string{"--temperature NaN: want a finite value >= 0"}},
		{"run temperature Inf", []string{"run", model, "--temperature", "inf"}, []string{"--temperature +Inf: want a finite value >= 0"}},
		{"run top-p NaN", []string{"run", model, "--top-p", "nan"}, []string{"--top-p NaN: want in (0, 1]"}},
		{"run threads -1", []string{"run", model, "--threads", "-1"}, []string{"--threads -1: want 0 (all cores) to 1024"}},
		{"eval threads huge", []string{"eval", model, "--data", data, "--threads", "1000000000"}, []string{"--threads 1000000000: want 0 (all cores) to 1024"}},
		{"eval kv-chunk holds the window", []string{"eval", model, "--data", data, "--ctx", "256", "--kv", "int4", "--kv-chunk", "1000"}, []string{"--kv-chunk 1000: want < --ctx − 1 = 255 without a prompt"}},
		{"serve kv-window without kv", []string{"serve", model, "--kv-window", "16,64", "--port", "0"}, []string{"--kv-window 16,64 without --kv: the default fp32 cache has no windows"}},
		// Measurement-only flags of quantize kv without the measurement.
		{"quantize kv window without search", []string{"quantize", "kv", model, "--calib", data, "-o", filepath.Join(t.TempDir(), "r.st"), "--kv-window", "4,16"}, []string{"--kv-window applies to the error measurement of --clip-search or --kv-bits"}},
		{"quantize kv search-tokens without search", []string{"quantize", "kv", model, "--calib", data, "-o", filepath.Join(t.TempDir(), "r.st"), "--search-tokens", "256"}, []string{"--search-tokens applies to the error measurement"}},
		{"quantize kv serving ctx without kv-bits", []string{"quantize", "kv", model, "--calib", data, "-o", filepath.Join(t.TempDir(), "r.st"), "--clip-search", "--kv-serving-ctx", "4096"}, []string{"--kv-serving-ctx is the context at which --kv-bits counts"}},
		// As eval refuses a data file that is not UTF-8 (TestBadDataFile).
		{"run prompt not UTF-8", []string{"run", model, "--prompt", "caf\xe9 au lait", "--max-tokens", "4"}, []string{"prompt is not valid UTF-8", "first bad byte at offset 3"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			wantError(t, lmpack(t, nil, c.args...), c.want...)
		})
	}
}

// TestConfigDisagreesWithWeights: a config.json describing fewer layers
// than the checkpoint holds is refused by run and eval (it would run and
// give wrong text), naming the first tensor it does not describe.
func TestConfigDisagreesWithWeights(t *testing.T) {
	t.Parallel()
	dir := brokenDir(t, origSafetensors(t))
	p := filepath.Join(dir, "config.json")
	b, _ := os.ReadFile(p)
	var cfg map[string]any
	json.Unmarshal(b, &cfg)
	cfg["num_hidden_layers"] = 4
	b, _ = json.Marshal(cfg)
	os.WriteFile(p, b, 0o644)
	for _, args := range [][]string{{"run", dir, "--max-tokens", "4"}, {"eval", dir, "--data", valText(t), "--ctx", "64", "--max-windows", "1"}} {
		wantError(t, lmpack(t, nil, args...), "9 tensors config.json does not describe", `"model.layers.4.`, "disagree")
	}
}

// TestIntegerWeights: an I8 weight is refused at load, naming the tensor
// and its dtype, instead of being read as plain numbers.
func TestIntegerWeights(t *testing.T) {
	t.Parallel()
	ts := origTensors(t)
	for i := range ts {
		if ts[i].Name == "model.layers.1.mlp.down_proj.weight" {
			ts[i] = safetensors.WriteTensor{Name: ts[i].Name, DType: safetensors.I8, Shape: ts[i].Shape, Data: make([]byte, 64*172)}
		}
	}
	dir := writeTensorsDir(t, ts)
	wantError(t, lmpack(t, nil, "run", dir, "--max-tokens", "4"), `tensor "model.layers.1.mlp.down_proj.weight"`, "dtype I8, want a float dtype")
}

// TestOverflowAtFirstUse: finite weights whose forward pass overflows
// (a final norm of 3e38) make run and eval fail with a message saying the
// NaN/Inf was detected at first use, instead of printing garbage.
func TestOverflowAtFirstUse(t *testing.T) {
	t.Parallel()
	ts := origTensors(t)
	for i := range ts {
		if ts[i].Name == "model.norm.weight" {
			v := make([]float32, 64)
			for j := range v {
				v[j] = 3e38
			}
			ts[i] = safetensors.FromFloat32(ts[i].Name, []int{64}, v)
		}
	}
	dir := writeTensorsDir(t, ts)
	wantError(t, lmpack(t, nil, "run", dir, "--max-tokens", "4", "--temperature", "0"), "step 0", "first use")
	wantError(t, lmpack(t, nil, "eval", dir, "--data", valText(t), "--ctx", "64", "--max-windows", "1"), "window 0", "non-finite logits", "first use")
}

// TestFIFOData: a named pipe as --data or as config.json is refused
// instead of blocking forever.
func TestFIFOData(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	fifo := filepath.Join(dir, "data.txt")
	mkfifo(t, fifo)
	wantError(t, lmpack(t, nil, "eval", modelDir(t), "--data", fifo), fifo, "not a regular file")
	m := brokenDir(t, origSafetensors(t))
	os.Remove(filepath.Join(m, "config.json"))
	mkfifo(t, filepath.Join(m, "config.json"))
	wantError(t, lmpack(t, nil, "inspect", m), "config.json", "not a regular file")
	// An artifact that is a FIFO or a device: verify, run and export
	// refuse it before opening it (open(2) on a FIFO blocks until a
	// writer comes; /dev/zero reads without end).
	art := filepath.Join(dir, "model.lmpk")
	mkfifo(t, art)
	for _, f := range []string{art, "/dev/zero"} {
		wantError(t, lmpack(t, nil, "verify", f), f, "not a regular file")
		wantError(t, lmpack(t, nil, "run", f, "--max-tokens", "1"), f, "not a regular file")
		wantError(t, lmpack(t, nil, "export", f, "--format", "gguf", "-o", filepath.Join(dir, "x.gguf")), f, "not a regular file")
	}
}

// TestLocalPathTypo: "dir/missing" where dir exists locally is reported as
// a missing directory, not looked up as a hub id.
func TestLocalPathTypo(t *testing.T) {
	t.Parallel()
	work := t.TempDir()
	os.Mkdir(filepath.Join(work, "models"), 0o755)
	cmd := exec.Command(lmpackBin, "inspect", "models/llama")
	cmd.Dir = work
	cmd.Env = isolatedEnv(t)
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), `MODEL "models/llama": no such directory`) {
		t.Fatalf("exit %v, output %s", err, out)
	}
}

// TestWriteErrors: output that cannot be written (a full disk) is an error
// in text mode too.
func TestWriteErrors(t *testing.T) {
	t.Parallel()
	full, err := os.OpenFile("/dev/full", os.O_WRONLY, 0)
	if err != nil {
		t.Skip("no /dev/full on this system")
	}
	defer full.Close()
	for _, args := range [][]string{{"inspect", modelDir(t)}, {"eval", modelDir(t), "--data", valText(t), "--ctx", "64", "--max-windows", "1"}} {
		cmd := exec.Command(lmpackBin, args...)
		cmd.Env = isolatedEnv(t)
		cmd.Stdout = full
		var stderr strings.Builder
		cmd.Stderr = &stderr
		err := cmd.Run()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(stderr.String(), "no space left on device") {
			t.Errorf("lmpack %v > /dev/full: %v, stderr %s", args, err, stderr.String())
		}
	}
}

// TestJSONErrorLine: with --log-format json the final error is a JSON log
// line too.
func TestJSONErrorLine(t *testing.T) {
	t.Parallel()
	r := lmpack(t, nil, "--log-format", "json", "run", modelDir(t), "--top-p", "3")
	if r.code != 1 {
		t.Fatalf("exit %d", r.code)
	}
	lines := jsonLogLines(t, r.stderr)
	if len(lines) == 0 || lines[len(lines)-1]["level"] != "ERROR" || !strings.Contains(fmt.Sprint(lines[len(lines)-1]["msg"]), "--top-p 3") {
		t.Fatalf("stderr: %s", r.stderr)
	}
}

// TestHugeSizes: absurd sizes in config.json fail as shape mismatches or
// memory refusals with exit 1, never as an allocator crash.
func TestHugeSizes(t *testing.T) {
	t.Parallel()
	edit := func(k string, v any) string {
		dir := brokenDir(t, origSafetensors(t))
		p := filepath.Join(dir, "config.json")
		b, _ := os.ReadFile(p)
		var cfg map[string]any
		json.Unmarshal(b, &cfg)
		cfg[k] = v
		b, _ = json.Marshal(cfg)
		os.WriteFile(p, b, 0o644)
		return dir
	}
	huge := edit("intermediate_size", int64(1)<<45)
	wantError(t, lmpack(t, nil, "run", huge, "--max-tokens", "4"), `tensor "model.layers.0.mlp.gate_proj.weight"`, "shape [172 64], want [35184372088832 64]")
	long := edit("max_position_embeddings", int64(1)<<40)
	wantError(t, lmpack(t, nil, "run", long, "--max-tokens", "1000000000", "--ignore-eos"), "KV cache", "GiB", "memory available")
}
