package prune

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/calibrate"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/internal/shared"
	"github.com/lmpack/lmpack/model"
	"github.com/lmpack/lmpack/prune/depth"
)

// copyModel copies stories260K's top-level files into a fresh directory
// so that tests may put things inside it.
func copyModel(t *testing.T) string {
	t.Helper()
	src := shared.Path(t, "stories260K-hf", "model.safetensors")
	dir := t.TempDir()
	ents, err := os.ReadDir(filepath.Dir(src))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.IsDir() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(filepath.Dir(src), e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestListPlanStories(t *testing.T) {
	model := shared.Path(t, "stories260K-hf")
	out := filepath.Join(t.TempDir(), "pruned")
	r, err := Run(context.Background(), Options{Model: model, Out: out, Method: "list:2"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(r.Kept, []int{0, 1, 3, 4}) || r.LayersAfter != 4 || len(r.Removed) != 1 || r.Removed[0].Layer != 2 {
		t.Errorf("report %+v", r)
	}
	orig, err := safetensors.OpenDir(model)
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()
	got, err := safetensors.OpenDir(out)
	if err != nil {
		t.Fatal(err)
	}
	defer got.Close()
	// Independent expectation: every original tensor, layer 2's dropped,
	// layers 3 and 4 renamed 2 and 3.
	want := map[string]string{}
	var pBefore, pAfter, bBefore, bAfter int64
	for _, name := range orig.Names() {
		tt, _ := orig.Tensor(name)
		n := int64(1)
		for _, s := range tt.Shape {
			n *= int64(s)
		}
		bBefore += int64(len(tt.Data))
		if name == "lm_head.weight" {
			// stories260K ties lm_head to the embedding: the stored copy
			// is not a parameter (as lmpack inspect counts).
			n = 0
		}
		pBefore += n
		newName := name
		switch {
		case strings.HasPrefix(name, "model.layers.2."):
			continue
		case strings.HasPrefix(name, "model.layers.3."):
			newName = "model.layers.2." + strings.TrimPrefix(name, "model.layers.3.")
		case strings.HasPrefix(name, "model.layers.4."):
			newName = "model.layers.3." + strings.TrimPrefix(name, "model.layers.4.")
		}
		want[newName] = name
		pAfter += n
		bAfter += int64(len(tt.Data))
	}
	if len(got.Names()) != len(want) {
		t.Fatalf("%d tensors, want %d", len(got.Names()), len(want))
	}
	for newName, name := range want {
		a, err := got.Tensor(newName)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := orig.Tensor(name)
		if a.DType != b.DType || !slices.Equal(a.Shape, b.Shape) || !bytes.Equal(a.Data, b.Data) {
			t.Errorf("%s is not a byte copy of %s", newName, name)
		}
	}
	if r.Before != (Sizes{pBefore, bBefore}) || r.After != (Sizes{pAfter, bAfter}) {
		t.Errorf("sizes %+v -> %+v, want %d/%d -> %d/%d", r.Before, r.After, pBefore, bBefore, pAfter, bAfter)
	}
	// One stories260K block: q and o 64×64, k and v 32×64 (4 KV heads of
	// 8), gate, up and down 172×64, two RMSNorm weights of 64.
	if perLayer := pBefore - pAfter; perLayer != 2*64*64+2*32*64+3*172*64+2*64 {
		t.Errorf("one layer has %d parameters", perLayer)
	}
	t.Logf("params %d -> %d, bytes %d -> %d", pBefore, pAfter, bBefore, bAfter)
	var cfg map[string]any
	b, _ := os.ReadFile(filepath.Join(out, "config.json"))
	if err := json.Unmarshal(b, &cfg); err != nil || cfg["num_hidden_layers"] != 4.0 || cfg["hidden_size"] != 64.0 || cfg["model_type"] != "llama" {
		t.Errorf("config.json: %v %v", err, cfg)
	}
	for _, f := range []string{"tokenizer.json", "tokenizer_config.json", "generation_config.json", "special_tokens_map.json", "tokenizer.model"} {
		a, err1 := os.ReadFile(filepath.Join(out, f))
		b, err2 := os.ReadFile(filepath.Join(model, f))
		if err1 != nil || err2 != nil || !bytes.Equal(a, b) {
			t.Errorf("%s not copied: %v %v", f, err1, err2)
		}
	}
	if _, err := os.Stat(filepath.Join(out, "reference")); err == nil {
		t.Errorf("subdirectory copied")
	}
}

func TestBadRequests(t *testing.T) {
	mdir := copyModel(t)
	snapshot := func() map[string][]byte {
		m := map[string][]byte{}
		ents, _ := os.ReadDir(mdir)
		for _, e := range ents {
			b, _ := os.ReadFile(filepath.Join(mdir, e.Name()))
			m[e.Name()] = b
		}
		return m
	}
	before := snapshot()
	tmp := t.TempDir()
	old := filepath.Join(tmp, "old.safetensors")
	// A calibration file of this model without the lorp statistic.
	ck, err := safetensors.OpenDir(mdir)
	if err != nil {
		t.Fatal(err)
	}
	fp, err := model.Fingerprint(mdir, ck)
	ck.Close()
	if err != nil {
		t.Fatal(err)
	}
	if err := calibrate.Write(old, &calibrate.Calibration{Header: calibrate.Header{ModelFingerprint: fp, Tokens: 8, Ctx: 8}}); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(tmp, "other.safetensors")
	if err := calibrate.Write(other, &calibrate.Calibration{Header: calibrate.Header{ModelFingerprint: "00", Tokens: 8, Ctx: 8}}); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(tmp, "out")
	for i, c := range []struct {
		opt  Options
		is   error
		text string
	}{
		{Options{Method: "lorp", Layers: 1, Calib: old, Out: out}, ErrNoStatistic, "lacks lorp.similarity: re-run lmpack calibrate"},
		{Options{Method: "lorp", Layers: 1, Calib: other, Out: out}, model.ErrModelMismatch, "another model"},
		{Options{Method: "list:2", Out: filepath.Join(mdir, "sub")}, ErrOutput, "inside"},
		{Options{Method: "list:2", Out: mdir}, ErrOutput, "model directory"},
		{Options{Method: "list:0", Out: out}, depth.ErrProtectedLayer, "protected"},
		{Options{Method: "list:4", Out: out}, depth.ErrProtectedLayer, "protected"},
		{Options{Method: "list:7", Out: out}, depth.ErrLayerRange, "outside"},
		{Options{Method: "list:1,2,3,4", Out: out}, depth.ErrTooManyLayers, "too many"},
		{Options{Method: "list:x", Out: out}, ErrOptions, `Method "list:x": want list:L1,L2,... (comma-separated layer indices)`},
		{Options{Method: "lorp", Layers: 1, Out: out}, ErrOptions, "Calib: want a calibration file"},
		{Options{Method: "magic", Out: out}, ErrOptions, "want lorp"},
	} {
		c.opt.Model = mdir
		_, err := Run(context.Background(), c.opt)
		if !errors.Is(err, c.is) || !strings.Contains(err.Error(), c.text) {
			t.Errorf("case %d %+v: %v; want %v containing %q", i, c.opt, err, c.is, c.text)
		}
	}
	if _, err := os.Stat(out); err == nil {
		t.Errorf("output created by a failed run")
	}
	after := snapshot()
	if fmt.Sprint(len(before)) != fmt.Sprint(len(after)) {
		t.Errorf("model directory changed: %d -> %d entries", len(before), len(after))
	}
	for k, v := range before {
		if !bytes.Equal(after[k], v) {
			t.Errorf("%s changed", k)
		}
	}
}

// TestConfigDisagrees: a config.json that disagrees with the weights is
// refused before anything is written, even for list: (no calibration).
func TestConfigDisagrees(t *testing.T) {
	for _, c := range []struct{ from, to, want string }{
		{`"num_hidden_layers": 5`, `"num_hidden_layers": 6`, `"model.layers.5.`},
		{`"num_hidden_layers": 5`, `"num_hidden_layers": 4`, "config.json does not describe"},
		{`"intermediate_size": 172`, `"intermediate_size": 160`, "config.json implies [64 160]"},
	} {
		model := copyModel(t)
		cfg := filepath.Join(model, "config.json")
		b, err := os.ReadFile(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(b, []byte(c.from)) {
			t.Fatalf("config.json lacks %s", c.from)
		}
		if err := os.WriteFile(cfg, bytes.Replace(b, []byte(c.from), []byte(c.to), 1), 0o644); err != nil {
			t.Fatal(err)
		}
		out := filepath.Join(t.TempDir(), "out")
		_, err = Run(context.Background(), Options{Model: model, Method: "list:2", Out: out})
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), model) {
			t.Errorf("%s: %v; want an error naming %s and %q", c.to, err, model, c.want)
		}
		if _, err := os.Stat(out); err == nil {
			t.Errorf("%s: output written", c.to)
		}
	}
	// list: given with an agreeing ratio is accepted; a disagreeing one is not.
	model := copyModel(t)
	if _, err := Run(context.Background(), Options{Model: model, Method: "list:1", LayerRatio: 0.2, Out: filepath.Join(t.TempDir(), "o")}); err != nil {
		t.Errorf("list:1 with ratio 0.2 (1 of 5): %v", err)
	}
	if _, err := Run(context.Background(), Options{Model: model, Method: "list:1", LayerRatio: 0.4, Out: filepath.Join(t.TempDir(), "o")}); !errors.Is(err, ErrOptions) {
		t.Errorf("list:1 with ratio 0.4 (2 of 5): %v, want ErrOptions", err)
	}
}

func TestLayerBudget(t *testing.T) {
	for _, c := range []struct {
		n    int
		r    float64
		L    int
		want int
		bad  bool
	}{
		{1, 0, 5, 1, false}, {0, 0.2, 5, 1, false}, {0, 0.25, 36, 9, false}, {0, 0.01, 5, 1, false},
		{1, 0.2, 5, 0, true}, {0, 0, 5, 0, true}, {0, 1, 5, 0, true}, {0, -0.1, 5, 0, true}, {-1, 0, 5, 0, true},
	} {
		got, err := LayerBudget(c.n, c.r, c.L)
		if (err != nil) != c.bad || got != c.want {
			t.Errorf("LayerBudget(%d, %v, %d) = %d, %v", c.n, c.r, c.L, got, err)
		}
	}
}
