package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/calibrate"
	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/internal/shared"
	"github.com/lmpack/lmpack/model"
)

// TestCalibrateExperts: `lmpack calibrate` on the MoE model writes the
// expert statistics; with --calibrate-all-experts every expert's Hessians
// come from every token while the routing counts stay those of the
// model's own routing; --min-expert-tokens reports experts below it; the
// report prints the routing table, one row per layer with the counts the
// file holds.
func TestCalibrateExperts(t *testing.T) {
	moe := shared.Path(t, "stories260K-moe-hf")
	dir := t.TempDir()
	routed, all := filepath.Join(dir, "r.safetensors"), filepath.Join(dir, "a.safetensors")
	r := lmpack(t, nil, "calibrate", moe, "--data", calibText(t), "--tokens", "256", "--ctx", "128", "--threads", "1", "-o", routed)
	wantOK(t, r)
	if !strings.Contains(r.stdout, "expert statistics for 5 MoE layers") {
		t.Errorf("stdout lacks the expert report:\n%s", r.stdout)
	}
	report := r.stdout
	// Every expert is below 1000 tokens of 256: all 20 reported.
	r = lmpack(t, nil, "calibrate", moe, "--data", calibText(t), "--tokens", "256", "--ctx", "128", "--threads", "1",
		"--calibrate-all-experts", "--min-expert-tokens", "1000", "-o", all)
	wantOK(t, r)
	if !strings.Contains(r.stdout, "20 experts routed fewer than 1000 tokens") || !strings.Contains(r.stdout, "layer 4 expert 3:") {
		t.Errorf("stdout lacks the sparse-expert report:\n%s", r.stdout)
	}
	a, err := calibrate.Read(routed, model.Expect{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := calibrate.Read(all, model.Expect{})
	if err != nil {
		t.Fatal(err)
	}
	if len(a.Experts) != 5 || len(b.Experts) != 5 {
		t.Fatalf("%d and %d expert layers, want 5", len(a.Experts), len(b.Experts))
	}
	if !strings.Contains(report, "tokens routed per expert (top-k):\nlayer      e0      e1      e2      e3  min/mean\n") {
		t.Errorf("stdout lacks the routing table header:\n%s", report)
	}
	for l, el := range a.Experts {
		row := fmt.Sprintf("%5d", el.Layer)
		var sum, lo int64 = 0, -1
		for _, s := range el.Experts {
			row += fmt.Sprintf(" %7d", s.Routed)
			sum += s.Routed
			if lo < 0 || s.Routed < lo {
				lo = s.Routed
			}
		}
		row += fmt.Sprintf("  %8.2f\n", float64(lo)*4/float64(sum))
		if !strings.Contains(report, "\n"+row) {
			t.Errorf("layer %d: routing row %q not in stdout:\n%s", l, row, report)
		}
	}
	for l := range a.Experts {
		var sum int64
		for e, s := range a.Experts[l].Experts {
			sb := b.Experts[l].Experts[e]
			sum += s.Routed
			if s.Samples != s.Routed || sb.Routed != s.Routed || sb.Samples != 256 {
				t.Errorf("layer %d expert %d: routed %d/%d samples %d/%d; want equal routing, all-experts samples 256", l, e, s.Routed, sb.Routed, s.Samples, sb.Samples)
			}
		}
		if sum != 512 {
			t.Errorf("layer %d: %d routed tokens, want 256·top-2 = 512", l, sum)
		}
	}
	wantError(t, lmpack(t, nil, "calibrate", moe, "--data", calibText(t), "--min-expert-tokens", "-1", "-o", filepath.Join(dir, "x")), "--min-expert-tokens -1: want >= 0")
}

// TestCalibrateExpertMemory: --max-expert-memory of one MoE layer's
// statistics collects them in 5 passes and writes the same bytes as the
// default (one pass on this small model); a budget below one layer and a
// negative one are refused naming the flag or the bytes needed.
func TestCalibrateExpertMemory(t *testing.T) {
	moe := shared.Path(t, "stories260K-moe-hf")
	d, err := arch.Load(moe)
	if err != nil {
		t.Fatal(err)
	}
	one := calibrate.ExpertLayerBytes(d, 0)
	dir := t.TempDir()
	ref, split := filepath.Join(dir, "ref.safetensors"), filepath.Join(dir, "split.safetensors")
	args := []string{"calibrate", moe, "--data", calibText(t), "--tokens", "256", "--ctx", "128", "--threads", "1"}
	r := lmpack(t, nil, append(args, "-o", ref)...)
	wantOK(t, r)
	if !strings.Contains(r.stdout, "expert statistics for 5 MoE layers in 1 pass;") {
		t.Errorf("default budget: stdout lacks the single pass:\n%s", r.stdout)
	}
	r = lmpack(t, nil, append(args, "--max-expert-memory", strconv.FormatInt(one, 10), "-o", split)...)
	wantOK(t, r)
	if !strings.Contains(r.stdout, "expert statistics for 5 MoE layers in 5 passes;") || !strings.Contains(r.stderr, "passes=5") {
		t.Errorf("one-layer budget: output lacks the 5 passes:\n%s\n%s", r.stdout, r.stderr)
	}
	a, err := os.ReadFile(ref)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(split)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) {
		t.Errorf("5-pass file (%d bytes) differs from the 1-pass file (%d bytes)", len(b), len(a))
	}
	wantError(t, lmpack(t, nil, append(args, "--max-expert-memory", strconv.FormatInt(one-1, 10), "-o", filepath.Join(dir, "x"))...),
		strconv.FormatInt(one, 10)+" bytes MoE layer 0 needs")
	wantError(t, lmpack(t, nil, append(args, "--max-expert-memory", "-1", "-o", filepath.Join(dir, "x"))...),
		"--max-expert-memory -1: want bytes >= 0")
}
