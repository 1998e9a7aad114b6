package calibrate

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/internal/shared"
	"github.com/lmpack/lmpack/model"
)

// TestExpertPasses: ExpertLayerBytes follows its formula from the model's
// shapes, and ExpertPasses groups consecutive MoE layers greedily under
// the budget and refuses a budget below one layer, naming the bytes.
func TestExpertPasses(t *testing.T) {
	d := openEngine(t, "stories260K-moe-hf").Desc
	L := len(d.Layers)
	H := int64(d.HiddenSize)
	var all []int
	for l := range d.Layers {
		mo := d.Layers[l].MoE
		if mo == nil {
			t.Fatalf("layer %d is not MoE", l)
		}
		all = append(all, l)
		I := int64(mo.Experts[0].IntermediateSize)
		E := int64(len(mo.Experts))
		if want := 8 * ((E+1)*H*H + E*I*I + 2*E*I*H); ExpertLayerBytes(d, l) != want {
			t.Errorf("layer %d: ExpertLayerBytes %d, want %d", l, ExpertLayerBytes(d, l), want)
		}
	}
	if ExpertLayerBytes(d, -1) != 0 || ExpertLayerBytes(d, L) != 0 {
		t.Errorf("out-of-range layers need %d and %d bytes, want 0", ExpertLayerBytes(d, -1), ExpertLayerBytes(d, L))
	}
	one := ExpertLayerBytes(d, 0)
	for _, c := range []struct {
		budget int64
		want   [][]int
	}{
		{0, [][]int{all}},
		{int64(L) * one, [][]int{all}},
		{one, [][]int{{0}, {1}, {2}, {3}, {4}}},
		{2*one + one/2, [][]int{{0, 1}, {2, 3}, {4}}},
		{3 * one, [][]int{{0, 1, 2}, {3, 4}}},
	} {
		g, err := ExpertPasses(d, c.budget)
		if err != nil || !reflect.DeepEqual(g, c.want) {
			t.Errorf("budget %d: groups %v, %v; want %v", c.budget, g, err, c.want)
		}
	}
	_, err := ExpertPasses(d, one-1)
	if err == nil || !strings.Contains(err.Error(), strconv.FormatInt(one, 10)+" bytes MoE layer 0 needs") {
		t.Errorf("budget %d: error %v, want one naming the %d bytes needed", one-1, err, one)
	}
	dense := openEngine(t, "stories260K-hf").Desc
	if g, err := ExpertPasses(dense, one); g != nil || err != nil {
		t.Errorf("dense model: %v, %v; want no groups", g, err)
	}
}

// TestRunExpertPasses: on stories260K-moe-hf, Run with a budget of one
// layer (5 passes) or two layers (3 passes) writes a file byte-identical
// to the unlimited single pass, reports the same routing counts (every
// layer's summing to tokens × top-2), reports and logs the passes, counts the
// progress over every pass, and leaves no temporary file; a budget below
// one layer fails naming the bytes needed and writes nothing.
func TestRunExpertPasses(t *testing.T) {
	mdir := shared.Path(t, "stories260K-moe-hf")
	data := shared.Path(t, "tinystories-valid", "calib.txt")
	d := openEngine(t, "stories260K-moe-hf").Desc
	one := ExpertLayerBytes(d, 0)
	dir := t.TempDir()
	const tokens = 160
	run := func(name string, budget int64, all bool) (string, *Summary, string, int, int) {
		t.Helper()
		out := filepath.Join(dir, name)
		var logs bytes.Buffer
		var last, total int
		s, err := Run(context.Background(), Options{Model: mdir, Data: data, Tokens: tokens, Ctx: 64, Out: out, Threads: 1,
			Version: "test", AllExperts: all, MaxExpertBytes: budget, Logger: slog.New(slog.NewTextHandler(&logs, nil)),
			Progress: func(done, tot int) { last, total = done, tot }})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return out, s, logs.String(), last, total
	}
	for _, all := range []bool{false, true} {
		ref, s0, log0, _, total0 := run("ref-"+strconv.FormatBool(all), 0, all)
		if s0.ExpertPasses != 1 || s0.ExpertLayers != 5 || total0 != 3*tokens || !strings.Contains(log0, "passes=1") {
			t.Errorf("unlimited: %d passes, %d layers, progress total %d; want 1, 5, %d; log:\n%s", s0.ExpertPasses, s0.ExpertLayers, total0, 3*tokens, log0)
		}
		if len(s0.Routing) != 5 {
			t.Fatalf("unlimited: routing of %d layers, want 5", len(s0.Routing))
		}
		for l, r := range s0.Routing {
			var sum int64
			for _, n := range r.Routed {
				sum += n
			}
			if r.Layer != l || len(r.Routed) != 4 || sum != 2*tokens {
				t.Errorf("routing %d: layer %d, %d experts, %d tokens; want layer %d, 4 experts, %d", l, r.Layer, len(r.Routed), sum, l, 2*tokens)
			}
		}
		want, err := os.ReadFile(ref)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			budget int64
			passes int
		}{{one, 5}, {2 * one, 3}} {
			name := "b" + strconv.FormatInt(c.budget, 10) + "-" + strconv.FormatBool(all)
			out, s, log, last, total := run(name, c.budget, all)
			if s.ExpertPasses != c.passes || s.ExpertLayers != 5 || !reflect.DeepEqual(s.SparseExperts, s0.SparseExperts) || !reflect.DeepEqual(s.Routing, s0.Routing) {
				t.Errorf("%s: %d passes, %d layers, sparse %v; want %d, 5, %v", name, s.ExpertPasses, s.ExpertLayers, s.SparseExperts, c.passes, s0.SparseExperts)
			}
			if w := (2 + c.passes) * tokens; last != w || total != w {
				t.Errorf("%s: progress ended at %d of %d, want %d of %d", name, last, total, w, w)
			}
			if !strings.Contains(log, "passes="+strconv.Itoa(c.passes)) || strings.Count(log, "expert statistics pass") != c.passes {
				t.Errorf("%s: log lacks the %d passes:\n%s", name, c.passes, log)
			}
			got, err := os.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("%s: %d bytes differ from the single pass's %d bytes", name, len(got), len(want))
			}
			if _, err := Read(out, model.Expect{Desc: d}); err != nil {
				t.Errorf("%s: %v", name, err)
			}
		}
	}
	out := filepath.Join(dir, "small")
	_, err := Run(context.Background(), Options{Model: mdir, Data: data, Tokens: tokens, Ctx: 64, Out: out, Threads: 1, MaxExpertBytes: one - 1})
	if err == nil || !strings.Contains(err.Error(), strconv.FormatInt(one, 10)+" bytes MoE layer 0 needs") {
		t.Errorf("budget %d: error %v, want one naming the %d bytes needed", one-1, err, one)
	}
	// Cancelled during the third expert pass: an error, no output, and
	// the pass files are removed.
	cctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, err = Run(cctx, Options{Model: mdir, Data: data, Tokens: tokens, Ctx: 64, Out: out, Threads: 1, MaxExpertBytes: one,
		Progress: func(done, _ int) {
			if done > 4*tokens {
				cancel()
			}
		}})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled in an expert pass: error %v, want context.Canceled", err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") || e.Name() == "small" {
			t.Errorf("left behind: %s", e.Name())
		}
	}
}
