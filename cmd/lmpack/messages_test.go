package main

import (
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/formats/safetensors"
)

// TestUserMessages: mistakes get a message in the user's terms, naming
// the file and what was expected (and never a Go identifier): each case
// runs one command and checks the error line for want and the absence of
// notWant.
func TestUserMessages(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	model := modelDir(t)
	recipe := writeRecipe(t, 1024, "5", "0")
	noConfig := brokenDir(t, origSafetensors(t))
	if err := os.Remove(filepath.Join(noConfig, "config.json")); err != nil {
		t.Fatal(err)
	}
	// A checkpoint with a NaN in one weight.
	nanDir := brokenDir(t, origSafetensors(t))
	const nanTensor = "model.layers.2.self_attn.q_proj.weight"
	{
		ck, err := safetensors.OpenDir(nanDir)
		if err != nil {
			t.Fatal(err)
		}
		info, file, err := ck.Info(nanTensor)
		ck.Close()
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		off := 8 + int64(binary.LittleEndian.Uint64(b)) + info.Begin
		binary.LittleEndian.PutUint32(b[off+4*3:], math.Float32bits(float32(math.NaN())))
		if err := os.WriteFile(file, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out := func(name string) string { return filepath.Join(t.TempDir(), name) }
	cases := []struct {
		name    string
		args    []string
		want    []string
		notWant []string
	}{
		{"compress without config.json", []string{"compress", noConfig, "--recipe", recipe, "-o", out("c.lmpk")},
			[]string{noConfig, "is not a model directory", "no config.json"}, []string{"fingerprint", "stat "}},
		{"recipe not UTF-8", []string{"compress", model, "--recipe", write("bom.yaml", []byte{0xff, 0xfe}), "-o", out("c.lmpk")},
			[]string{"bom.yaml", "not valid UTF-8", "offset 0"}, []string{"empty recipe"}},
		{"calibrate: [1,2]", []string{"compress", model, "--recipe", write("list.yaml", []byte("calibrate: [1,2]\n")), "-o", out("c.lmpk")},
			[]string{"line 1: calibrate: want a section of keys, not the list [1, 2]"}, []string{`not ""`}},
		{"--min-expert-tokens -1", []string{"calibrate", model, "--data", valText(t), "-o", out("c.calib"), "--min-expert-tokens", "-1"},
			[]string{"--min-expert-tokens -1: want >= 0 tokens (0: the default, 16)"}, []string{"Default"}},
		{"moe_min_tokens -1", []string{"compress", model, "--recipe",
			write("moe.yaml", []byte("quantize:\n  weights:\n    method: rtn\n    bits: 4\n    moe_budget: 2.5\n    moe_min_tokens: -1\n")), "-o", out("c.lmpk")},
			[]string{"line 6: quantize.weights.moe_min_tokens -1: want >= 0 tokens (0: the default, 16)"}, []string{"Default", "calibrate."}},
		{"max_delta_ppl_pct .inf", []string{"compress", model, "--recipe", writeRecipe(t, 1024, ".inf", "0"), "-o", out("c.lmpk")},
			[]string{"eval.max_delta_ppl_pct +Inf: want a finite percentage >= 0"}, nil},
		{"max_delta_ppl_pct .nan", []string{"compress", model, "--recipe", writeRecipe(t, 1024, ".nan", "0"), "-o", out("c.lmpk")},
			[]string{"eval.max_delta_ppl_pct NaN: want a finite percentage >= 0"}, nil},
		{"max_kl .inf", []string{"compress", model, "--recipe", writeRecipe(t, 1024, "5", ".inf"), "-o", out("c.lmpk")},
			[]string{"eval.max_kl +Inf: want a finite KL >= 0"}, nil},
		{"prune --calib text", []string{"prune", model, "--calib", valText(t), "-o", out("p"), "--layers", "1"},
			[]string{valText(t), "not a safetensors file"}, nil},
		{"verify a directory", []string{"verify", model}, []string{model + " is a directory; verify takes an .lmpk artifact file"}, []string{"read "}},
		{"pack NaN source", []string{"pack", nanDir, "-o", out("n.lmpk")},
			[]string{filepath.Join(nanDir, "model.safetensors"), `tensor "` + nanTensor + `"`, "element 3 (row-major) is NaN"}, []string{"n.lmpk"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			r := lmpack(t, nil, c.args...)
			wantError(t, r, c.want...)
			for _, w := range c.notWant {
				if strings.Contains(r.stderr, w) {
					t.Errorf("stderr has %q:\n%s", w, r.stderr)
				}
			}
		})
	}
}
