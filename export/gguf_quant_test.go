package export

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/gguf"
	"github.com/lmpack/lmpack/internal/shared"
	"github.com/lmpack/lmpack/pack"
	"github.com/lmpack/lmpack/quantize/weights"
	"github.com/lmpack/lmpack/runtime"
)

// lmpackValues returns lmpack's dequantized values of weight name of the
// checkpoint dir (runtime.WithQuant, what lmpack run computes with).
func lmpackValues(t *testing.T, dir, name string) []float32 {
	t.Helper()
	d, err := arch.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	src := openSourceT(t, dir)
	tt, err := runtime.WithQuant(d, src.tensors).Tensor(name)
	if err != nil {
		t.Fatal(err)
	}
	v, err := tt.Float32()
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func openSourceT(t *testing.T, path string) *source {
	s, err := openSource(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.close() })
	return s
}

// TestGGUFExactQuant exports lmpack checkpoints of stories260K quantized
// symmetric 8-bit group 32, symmetric 4-bit group 32 and asymmetric 4-bit
// group 32 and checks that every quantized weight is written as Q8_0,
// Q4_0 and Q4_1 and decodes (gguf.Dequantize, llama.cpp's arithmetic) to
// exactly lmpack's dequantized weights, rows of q/k un-permuted; down_proj
// (172 columns, not a multiple of 32) stays float.
func TestGGUFExactQuant(t *testing.T) {
	src := shared.Path(t, "stories260K-hf")
	for _, c := range []struct {
		name string
		o    weights.Options
		want gguf.Type
	}{
		{"q8_0", weights.Options{Bits: 8, GroupSize: 32, Symmetric: true}, gguf.TypeQ8_0},
		{"q4_0", weights.Options{Bits: 4, GroupSize: 32, Symmetric: true}, gguf.TypeQ4_0},
		{"q4_1", weights.Options{Bits: 4, GroupSize: 32}, gguf.TypeQ4_1},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := writeQuantCheckpoint(t, src, func(name string, rows, cols int) *weights.Options {
				if cols%32 != 0 {
					return nil
				}
				return &c.o
			})
			rep, out := exportGGUF(t, dir, GGUFOptions{})
			f := openGGUF(t, out)
			rows := map[string]TensorRow{}
			for _, r := range rep.Tensors {
				rows[r.Name] = r
			}
			checked := 0
			for i := 0; i < 5; i++ {
				for _, p := range [][2]string{{"attn_q", "self_attn.q_proj"}, {"attn_k", "self_attn.k_proj"}, {"attn_v", "self_attn.v_proj"}, {"attn_output", "self_attn.o_proj"}, {"ffn_gate", "mlp.gate_proj"}, {"ffn_up", "mlp.up_proj"}} {
					g := "blk." + string(rune('0'+i)) + "." + p[0] + ".weight"
					h := "model.layers." + string(rune('0'+i)) + "." + p[1] + ".weight"
					ti, _ := f.Tensor(g)
					if ti == nil || ti.Type != c.want {
						t.Fatalf("%s: %+v, want type %v", g, ti, c.want)
					}
					if r := rows[g]; r.Mode != ModeExact && !(c.want == gguf.TypeQ4_1 && r.Mode == ModeRequantized) {
						t.Errorf("%s: mode %q (%s), want exact", g, r.Mode, r.Reason)
					}
					data, _ := f.TensorData(g)
					sh := ti.Shape()
					got, err := gguf.Dequantize(ti.Type, data, sh[1])
					if err != nil {
						t.Fatal(err)
					}
					want := lmpackValues(t, dir, h)
					if p[0] == "attn_q" || p[0] == "attn_k" {
						want = permuteRows(want, sh[0], ropePerm(sh[0]/8, 8))
					}
					if c.want == gguf.TypeQ4_1 && rows[g].Mode == ModeRequantized {
						// m = −scale·zero rounded to fp16: within half an fp16
						// ulp of m per value.
						for k := range got {
							if d := got[k] - want[k]; d > 1e-3 || d < -1e-3 {
								t.Fatalf("%s[%d]: %v, lmpack %v", g, k, got[k], want[k])
							}
						}
					} else if !slices.Equal(got, want) {
						t.Errorf("%s does not decode to lmpack's dequantized %s exactly", g, h)
					}
					checked++
				}
				ti, _ := f.Tensor("blk." + string(rune('0'+i)) + ".ffn_down.weight")
				if ti.Type != gguf.TypeF32 {
					t.Errorf("ffn_down %d: %v, want F32 (float in the checkpoint)", i, ti.Type)
				}
			}
			t.Logf("%s: modes %v, %.3f bits per weight", c.name, rep.Counts(), rep.BitsPerWeight)
			if checked != 30 {
				t.Errorf("%d tensors checked", checked)
			}
			if _, ok := f.Get("general.quantization_version"); !ok {
				t.Error("general.quantization_version missing")
			}
			// Byte-identical across runs.
			_, out2 := exportGGUF(t, dir, GGUFOptions{})
			a, _ := os.ReadFile(out)
			b, _ := os.ReadFile(out2)
			if !bytes.Equal(a, b) {
				t.Error("two exports of the same checkpoint differ")
			}
		})
	}
}

// TestGGUFMixedExperts exports stories260K-moe-hf with expert 0's
// gate/up at 8 bits and the others' at 4 bits: refused without
// AllowRequant (naming the tensor and leaving nothing behind), and with
// it written as Q8_0 (the widest) that decodes to every expert's lmpack
// values (4-bit codes fit Q8_0 exactly).
func TestGGUFMixedExperts(t *testing.T) {
	src := shared.Path(t, "stories260K-moe-hf")
	dir := writeQuantCheckpoint(t, src, func(name string, rows, cols int) *weights.Options {
		if !strings.Contains(name, ".experts.") || cols%32 != 0 {
			return nil
		}
		if strings.Contains(name, ".experts.0.") {
			return &weights.Options{Bits: 8, GroupSize: 32, Symmetric: true}
		}
		return &weights.Options{Bits: 4, GroupSize: 32, Symmetric: true}
	})
	outDir := t.TempDir()
	out := filepath.Join(outDir, "m.gguf")
	rep, err := GGUF(context.Background(), dir, GGUFOptions{Out: out})
	if err == nil || !strings.Contains(err.Error(), "blk.0.ffn_gate_exps.weight") || !strings.Contains(err.Error(), "--allow-requant") {
		t.Fatalf("mixed expert widths: %v, want a refusal naming blk.0.ffn_gate_exps.weight and --allow-requant", err)
	}
	if rep == nil || rep.Counts()[ModeRefused] != 10 { // gate and up of 5 layers
		t.Errorf("report %+v, want 10 refused rows", rep)
	} else {
		var b strings.Builder
		rep.WriteText(&b)
		if !strings.Contains(b.String(), out+" not written: 10 of") || strings.Contains(b.String(), "0 bytes") {
			t.Errorf("text report of a refused export does not say it was not written:\n%s", b.String())
		}
	}
	if es, _ := os.ReadDir(outDir); len(es) != 0 {
		t.Errorf("refused export left %v behind", es)
	}
	rep, err = GGUF(context.Background(), dir, GGUFOptions{Out: out, AllowRequant: true})
	if err != nil {
		t.Fatal(err)
	}
	f := openGGUF(t, out)
	ti, _ := f.Tensor("blk.1.ffn_up_exps.weight")
	if ti == nil || ti.Type != gguf.TypeQ8_0 || !slices.Equal(ti.Dims, []uint64{64, 172, 4}) {
		t.Fatalf("blk.1.ffn_up_exps.weight: %+v, want Q8_0 {64, 172, 4}", ti)
	}
	data, _ := f.TensorData("blk.1.ffn_up_exps.weight")
	got, err := gguf.Dequantize(gguf.TypeQ8_0, data, 64)
	if err != nil {
		t.Fatal(err)
	}
	for e := 0; e < 4; e++ {
		want := lmpackValues(t, dir, "model.layers.1.block_sparse_moe.experts."+string(rune('0'+e))+".w3.weight")
		if !slices.Equal(got[e*172*64:(e+1)*172*64], want) {
			t.Errorf("expert %d of blk.1.ffn_up_exps does not decode to lmpack's values", e)
		}
	}
	for _, r := range rep.Tensors {
		if r.Name == "blk.1.ffn_up_exps.weight" && (!strings.Contains(r.Reason, "--allow-requant") || !strings.HasPrefix(r.From, "mixed: ")) {
			t.Errorf("row %+v: want the mixed widths and --allow-requant in From/Reason", r)
		}
	}
	if v, _ := f.Get("llama.expert_count"); v != uint32(4) {
		t.Errorf("llama.expert_count %v", v)
	}
}

// TestGGUFArtifactKV exports an artifact with an INT2 KV-cache scheme:
// the weights export (equal to the checkpoint's export), and the report
// says which llama.cpp cache type to use instead.
func TestGGUFArtifactKV(t *testing.T) {
	dir := shared.Path(t, "stories260K-hf")
	a, err := pack.FromCheckpoint(dir, pack.FromOptions{KVCache: "int2-naive"})
	if err != nil {
		t.Fatal(err)
	}
	art := filepath.Join(t.TempDir(), "stories260K-hf.lmpk")
	if _, err := pack.Write(art, a, pack.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	a.Close()
	rep, out := exportGGUF(t, art, GGUFOptions{})
	found := false
	for _, w := range rep.Warnings {
		if strings.Contains(w, `"int2-naive"`) && strings.Contains(w, "--cache-type-k q4_0") {
			found = true
		}
	}
	if !found {
		t.Errorf("warnings %q: want the INT2 scheme and --cache-type-k q4_0", rep.Warnings)
	}
	_, ref := exportGGUF(t, dir, GGUFOptions{})
	x, _ := os.ReadFile(out)
	y, _ := os.ReadFile(ref)
	if !bytes.Equal(x, y) {
		t.Error("the artifact's export differs from the checkpoint's")
	}
}

// TestGGUFOutput: an existing file that is not a GGUF is refused and
// kept; a previous export is replaced; bad options name the field.
func TestGGUFOutput(t *testing.T) {
	dir := shared.Path(t, "stories260K-hf")
	out := filepath.Join(t.TempDir(), "x.gguf")
	os.WriteFile(out, []byte("precious"), 0o644)
	if _, err := GGUF(context.Background(), dir, GGUFOptions{Out: out}); err == nil || !strings.Contains(err.Error(), "not a GGUF file; refusing to overwrite") {
		t.Errorf("over a non-GGUF file: %v", err)
	}
	if b, _ := os.ReadFile(out); string(b) != "precious" {
		t.Errorf("the existing file was changed: %q", b)
	}
	os.Remove(out)
	exportGGUF(t, dir, GGUFOptions{Out: out, Type: "f16"})
	if _, err := GGUF(context.Background(), dir, GGUFOptions{Out: out}); err != nil {
		t.Errorf("over a previous export: %v", err)
	}
	if f := openGGUF(t, out); f.Tensors[1].Type != gguf.TypeF32 {
		t.Error("the previous export was not replaced")
	}
	for _, c := range []struct {
		opt  GGUFOptions
		want string
	}{
		{GGUFOptions{}, "Out: want the .gguf file to write"},
		{GGUFOptions{Out: out, Type: "q5_k"}, `Type "q5_k": want auto, q8_0`},
	} {
		if err := c.opt.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Validate(%+v): %v, want %q", c.opt, err, c.want)
		}
	}
	if _, err := GGUF(context.Background(), filepath.Join(t.TempDir(), "nope"), GGUFOptions{Out: out}); err == nil {
		t.Error("a missing model exported")
	}
}

// TestGGUFQuantArtifact: an artifact packed from a quantized checkpoint
// exports to the same bytes as the checkpoint (its storage tensors are
// read through the manifest).
func TestGGUFQuantArtifact(t *testing.T) {
	dir := writeQuantCheckpoint(t, shared.Path(t, "stories260K-hf"), func(name string, rows, cols int) *weights.Options {
		if cols%32 != 0 {
			return nil
		}
		return &weights.Options{Bits: 4, GroupSize: 32}
	})
	a, err := pack.FromCheckpoint(dir, pack.FromOptions{})
	if err != nil {
		t.Fatal(err)
	}
	art := filepath.Join(t.TempDir(), filepath.Base(dir)+".lmpk")
	if _, err := pack.Write(art, a, pack.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	a.Close()
	_, x := exportGGUF(t, art, GGUFOptions{})
	_, y := exportGGUF(t, dir, GGUFOptions{})
	bx, _ := os.ReadFile(x)
	by, _ := os.ReadFile(y)
	if !bytes.Equal(bx, by) {
		t.Error("the quantized artifact's export differs from its checkpoint's")
	}
	if f := openGGUF(t, x); f.Tensors[1].Type != gguf.TypeF32 {
		t.Errorf("tensor 1 %s: %v", f.Tensors[1].Name, f.Tensors[1].Type)
	} else if ti, _ := f.Tensor("blk.0.attn_v.weight"); ti.Type != gguf.TypeQ4_1 {
		t.Errorf("blk.0.attn_v.weight: %v, want Q4_1", ti.Type)
	}
}

// TestGGUFCanceled: a canceled export fails and leaves nothing in the
// output directory.
func TestGGUFCanceled(t *testing.T) {
	outDir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := GGUF(ctx, shared.Path(t, "stories260K-hf"), GGUFOptions{Out: filepath.Join(outDir, "m.gguf")})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("canceled export: %v, want context.Canceled", err)
	}
	if es, _ := os.ReadDir(outDir); len(es) != 0 {
		t.Errorf("canceled export left %v", es)
	}
}

// TestGGUFActOrder: an act-order weight (8-bit symmetric group 32 with a
// column permutation) whose permutation keeps each block of 32 original
// columns in one group is written as Q8_0 exactly after undoing it; one
// whose permutation mixes groups is requantized, saying so.
func TestGGUFActOrder(t *testing.T) {
	src := shared.Path(t, "stories260K-hf")
	o := &weights.Options{Bits: 8, GroupSize: 32, Symmetric: true}
	dir := writeQuantCheckpointPerm(t, src, func(name string, rows, cols int) *weights.Options {
		if strings.Contains(name, "layers.0.mlp.gate_proj") || strings.Contains(name, "layers.0.mlp.up_proj") {
			return o
		}
		return nil
	}, func(name string, cols int) []int32 {
		perm := make([]int32, cols)
		for j := range perm {
			perm[j] = int32(j)
		}
		if strings.Contains(name, "gate_proj") { // reverse inside each group of 32
			for j := range perm {
				perm[j] = int32(j/32*32 + 31 - j%32)
			}
		} else { // reverse the whole row: groups mix original blocks
			slices.Reverse(perm)
			perm[0], perm[40] = perm[40], perm[0]
		}
		return perm
	})
	rep, out := exportGGUF(t, dir, GGUFOptions{})
	f := openGGUF(t, out)
	rows := map[string]TensorRow{}
	for _, r := range rep.Tensors {
		rows[r.Name] = r
	}
	g := rows["blk.0.ffn_gate.weight"]
	if g.Mode != ModeExact || g.To != "Q8_0" || !strings.Contains(g.From, "act-order") {
		t.Errorf("gate (permutation within groups): %+v, want exact Q8_0 from an act-order tensor", g)
	}
	data, _ := f.TensorData("blk.0.ffn_gate.weight")
	got, err := gguf.Dequantize(gguf.TypeQ8_0, data, 64)
	if err != nil {
		t.Fatal(err)
	}
	if want := lmpackValues(t, dir, "model.layers.0.mlp.gate_proj.weight"); !slices.Equal(got, want) {
		t.Error("the act-order gate_proj does not decode to lmpack's values in the original column order")
	}
	u := rows["blk.0.ffn_up.weight"]
	if u.Mode != ModeRequantized || u.To != "Q8_0" || !strings.Contains(u.Reason, "act-order") {
		t.Errorf("up (permutation across groups): %+v, want requantized Q8_0 naming the act-order permutation", u)
	}
}

// TestKVWarning: each lmpack KV scheme names the llama.cpp cache type to
// use instead.
func TestKVWarning(t *testing.T) {
	for _, c := range []struct {
		cache string
		rot   bool
		want  []string
	}{
		{"oscar2", true, []string{`KV cache "oscar2" with OSCAR rotations`, "--cache-type-k q4_0 --cache-type-v q4_0", "-fa", "2-bit has no counterpart"}},
		{"int4", false, []string{"--cache-type-k q4_0"}},
		{"int8", false, []string{"--cache-type-k q8_0 --cache-type-v q8_0"}},
		{"fp16", false, []string{"--cache-type-k f16"}},
	} {
		w := kvWarning(c.cache, c.rot)
		for _, s := range c.want {
			if !strings.Contains(w, s) {
				t.Errorf("kvWarning(%q, %v) = %q, want %q in it", c.cache, c.rot, w, s)
			}
		}
	}
}
