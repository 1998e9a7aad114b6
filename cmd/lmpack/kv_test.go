package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/internal/shared"
)

// TestKVTableStories260K is issue #3's acceptance run: calibrate
// stories260K on calib.txt, compute OSCAR rotations, and evaluate on
// heldout.txt at --ctx 512 with every token quantized (no windows),
// --kv fp32,int2-naive,quarot2,kivi2,oscar2,oscars2,int4. It pins the
// table's columns and rows, the bits/element of the fixed-size methods
// (head_dim 8: fp16 scale and zero cost 32/8 bits), and that oscar2's
// ΔPPL is below int2-naive's and quarot2's. The whole held-out file runs
// unless -short (then 16 windows).
func TestKVTableStories260K(t *testing.T) {
	t.Parallel()
	model := modelDir(t)
	dir := t.TempDir()
	calib := filepath.Join(dir, "calib.safetensors")
	rot := filepath.Join(dir, "rot.safetensors")
	wantOK(t, lmpack(t, nil, "calibrate", model, "--data", shared.Path(t, "tinystories-valid", "calib.txt"), "--tokens", "16384", "-o", calib))
	wantOK(t, lmpack(t, nil, "quantize", "kv", model, "--calib", calib, "-o", rot))
	args := []string{"eval", model, "--data", shared.Path(t, "tinystories-valid", "heldout.txt"), "--ctx", "512",
		"--kv", "fp32,int2-naive,quarot2,kivi2,oscar2,oscars2,int4", "--kv-rotations", rot, "--json", "--plot", filepath.Join(dir, "kv.svg"),
		"--kv-protocol", "fake-quant"}
	if testing.Short() {
		args = append(args, "--max-windows", "16")
	}
	r := lmpack(t, nil, args...)
	wantOK(t, r)
	var raw struct {
		Rows []map[string]any `json:"rows"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &raw); err != nil {
		t.Fatalf("eval --json: %v\n%s", err, r.stdout)
	}
	cols := []string{"kv", "bits_per_element", "kv_bytes", "perplexity", "delta_ppl", "kl", "top1_agreement", "tokens_per_second"}
	var names []string
	row := map[string]map[string]any{}
	for _, rw := range raw.Rows {
		for _, c := range cols {
			if _, ok := rw[c]; !ok {
				t.Fatalf("row %v lacks column %q", rw["kv"], c)
			}
		}
		names = append(names, rw["kv"].(string))
		row[rw["kv"].(string)] = rw
	}
	if want := []string{"fp32", "int2-naive", "quarot2", "kivi2", "oscar2", "oscars2", "int4"}; !slices.Equal(names, want) {
		t.Fatalf("rows %v, want %v", names, want)
	}
	num := func(kv, c string) float64 { return row[kv][c].(float64) }
	for kv, bits := range map[string]float64{"fp32": 32, "int2-naive": 4, "quarot2": 6, "oscar2": 6, "int4": 8} {
		if got := num(kv, "bits_per_element"); got != bits {
			t.Errorf("%s: %g bits/element, want %g", kv, got, bits)
		}
		// KV bytes = bits/8 × 2 (K and V) × 512 tokens × 5 layers × 32.
		if got, want := num(kv, "kv_bytes"), bits/8*2*512*5*32; got != want {
			t.Errorf("%s: kv_bytes %g, want %g", kv, got, want)
		}
	}
	if num("fp32", "delta_ppl") != 0 || num("fp32", "kl") != 0 || num("fp32", "top1_agreement") != 1 {
		t.Errorf("fp32 row is not the reference: %v", row["fp32"])
	}
	if !testing.Short() {
		// The plain eval of heldout.txt (same windows) gives 5.7894.
		if p := num("fp32", "perplexity"); p < 5.789 || p > 5.790 {
			t.Errorf("fp32 perplexity %.4f, want 5.7894", p)
		}
	}
	o, n, q := num("oscar2", "delta_ppl"), num("int2-naive", "delta_ppl"), num("quarot2", "delta_ppl")
	t.Logf("ΔPPL: oscar2 %.3f, int2-naive %.3f, quarot2 %.3f, kivi2 %.3f, oscars2 %.3f, int4 %.3f",
		o, n, q, num("kivi2", "delta_ppl"), num("oscars2", "delta_ppl"), num("int4", "delta_ppl"))
	if !(o < n && o < q) {
		t.Errorf("oscar2 ΔPPL %.3f is not below int2-naive %.3f and quarot2 %.3f", o, n, q)
	}
	svg, err := os.ReadFile(filepath.Join(dir, "kv.svg"))
	// 7 rows in each of the KL and ΔPPL panels, 7 methods in the legend.
	markers := strings.Count(string(svg), "<circle") + strings.Count(string(svg), "<rect x=") + strings.Count(string(svg), "<polygon")
	if err != nil || !strings.HasPrefix(string(svg), "<svg") || markers != 21 {
		t.Errorf("plot: %v\n%.200s", err, svg)
	}
	// The text table prints the same rows under its header.
	r = lmpack(t, nil, "eval", model, "--data", shared.Path(t, "tinystories-valid", "heldout.txt"), "--ctx", "512", "--max-windows", "2",
		"--kv", "fp32,oscar2", "--kv-rotations", rot, "--kv-window", "64,256", "--kv-layers")
	wantOK(t, r)
	for _, want := range []string{"protocol decode (prompt 0, chunk 1): 2 windows of 512 tokens",
		"kv             bits@512 bits@32768 bits_read kv_bytes fp16/query perplexity     ΔPPL      KL  top-1 tokens/s", "\noscar2 ", "\noscar2+w64,256 ", "0-63", "256-510", "per-layer relative error"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("table lacks %q:\n%s", want, r.stdout)
		}
	}
}

// TestKVFlagErrors: bad --kv flags are refused before any work.
func TestKVFlagErrors(t *testing.T) {
	t.Parallel()
	model, data := modelDir(t), valText(t)
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--kv", "fp32,int3"}, `--kv "int3": want known methods`},
		{[]string{"--kv", "fp32,fp32"}, `--kv "fp32": want each method once (listed twice)`},
		{[]string{"--kv", "oscar2"}, "--kv-rotations: want an OSCAR rotation file for the oscar kinds in --kv"},
		{[]string{"--kv", "fp32", "--kv-window", "64"}, `--kv-window "64": want SINK,RECENT`},
		{[]string{"--kv", "fp32", "--plot", "x.jpg"}, "want a .svg or .png"},
		{[]string{"--kv-layers"}, "need --kv LIST"},
		{[]string{"--kv", "oscar2", "--kv-rotations", data}, "rotation"},
		{[]string{"--kv", "fp16", "--kv-protocol", "oneshot"}, `--kv-protocol "oneshot": want decode or fake-quant`},
		{[]string{"--kv", "fp16", "--kv-prompt", "63"}, "--kv-prompt 63: want in [0, --ctx − 2 = 62]"},
		{[]string{"--kv", "fp16", "--kv-chunk", "0"}, "--kv-chunk 0: want >= 1"},
		{[]string{"--kv", "int4", "--kv-protocol", "fake-quant", "--kv-window", "4,8"}, "--kv-window \"4,8\": want no fp16 windows with --kv-protocol fake-quant"},
		{[]string{"--kv", "fp16", "--kv-serving-ctx", "-1"}, "--kv-serving-ctx -1: want >= 0"},
		{[]string{"--kv-protocol", "decode"}, "--kv-protocol needs --kv LIST"},
		{[]string{"--kv-prompt", "-1"}, "--kv-prompt -1: want in [0, --ctx − 2 = 62]"},
	}
	for _, c := range cases {
		r := lmpack(t, nil, append([]string{"eval", model, "--data", data, "--ctx", "64", "--max-windows", "1"}, c.args...)...)
		wantError(t, r, c.want)
	}
}

// TestOutputsNeverOverwriteInputs: -o and --plot refuse an input file or
// a path inside the model directory, before any work.
func TestOutputsNeverOverwriteInputs(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	data := filepath.Join(dir, "calib.txt")
	b, err := os.ReadFile(shared.Path(t, "tinystories-valid", "calib.txt"))
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(data, b, 0o444)
	model := brokenDir(t, origSafetensors(t))
	calib := filepath.Join(dir, "c.safetensors")
	wantError(t, lmpack(t, nil, "calibrate", model, "--data", data, "--tokens", "1024", "-o", data), "is the input", "refusing to overwrite an input")
	wantError(t, lmpack(t, nil, "calibrate", model, "--data", data, "--tokens", "1024", "-o", filepath.Join(model, "c.st")), "inside the model directory")
	wantOK(t, lmpack(t, nil, "calibrate", model, "--data", data, "--tokens", "1024", "-o", calib))
	wantError(t, lmpack(t, nil, "quantize", "kv", model, "--calib", calib, "-o", calib), "is the input")
	wantError(t, lmpack(t, nil, "eval", model, "--data", data, "--kv", "fp32", "--plot", filepath.Join(dir, "nodir", "p.svg")), "does not exist")
	if got, _ := os.ReadFile(data); string(got) != string(b) {
		t.Fatal("the data file was modified")
	}
}
