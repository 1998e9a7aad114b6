package pack

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"math"
	"os"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/formats/safetensors"
)

func TestFirstNonFinite(t *testing.T) {
	le := binary.LittleEndian
	f32 := make([]byte, 16)
	le.PutUint32(f32[8:], math.Float32bits(float32(math.Inf(-1))))
	f64 := make([]byte, 24)
	le.PutUint64(f64[16:], math.Float64bits(math.NaN()))
	f16 := []byte{0x00, 0x3c, 0x00, 0x7c}  // 1.0, +Inf
	bf16 := []byte{0x80, 0x3f, 0xc1, 0xff} // 1.0, NaN
	for _, c := range []struct {
		dt   safetensors.DType
		b    []byte
		i    int
		what string
	}{
		{safetensors.F32, f32, 2, "-Inf"}, {safetensors.F64, f64, 2, "NaN"}, {safetensors.F16, f16, 1, "+Inf"},
		{safetensors.BF16, bf16, 1, "NaN"}, {safetensors.F8E4M3, []byte{0x38, 0x7f}, 1, "NaN"},
		{safetensors.F8E5M2, []byte{0x3c, 0xfc}, 1, "-Inf"},
		{safetensors.F32, f32[:8], -1, ""}, {safetensors.F16, []byte{0xff, 0x7b}, -1, ""}, // 65504 is finite
		{safetensors.I32, []byte{0, 0, 0x80, 0x7f}, -1, ""},
	} {
		if i, what := safetensors.FirstNonFinite(c.dt, c.b); i != c.i || what != c.what {
			t.Errorf("%s % x: %d %q, want %d %q", c.dt, c.b, i, what, c.i, c.what)
		}
	}
}

// nanTensor returns a float32 tensor name of the stories260K artifact a and
// a copy of its data with element i set to NaN, replacing the section.
func nanSection(t *testing.T, a *Artifact, name string, i int) {
	t.Helper()
	for k := range a.Sections {
		if a.Sections[k].Name != name {
			continue
		}
		b := bytes.Clone(a.Sections[k].Data)
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(math.NaN())))
		a.Sections[k].Data = b
		return
	}
	t.Fatalf("no section %q", name)
}

// TestWriteRefusesNonFinite: pack never writes an artifact the runtime
// would refuse: a NaN in a float tensor is ErrFormat naming the tensor and
// the element, and no file is left behind.
func TestWriteRefusesNonFinite(t *testing.T) {
	a, err := FromCheckpoint(storiesDir(t), FromOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	const name = "model.layers.2.mlp.up_proj.weight"
	nanSection(t, a, name, 37)
	out := t.TempDir() + "/m.lmpk"
	_, err = Write(out, a, WriteOptions{})
	if !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), name) || !strings.Contains(err.Error(), "element 37 (row-major) is NaN") {
		t.Errorf("Write: %v, want ErrFormat naming %s element 37", err, name)
	}
	if _, serr := os.Stat(out); serr == nil {
		t.Error("a refused artifact was written")
	}
}

// patchSection rewrites the raw (uncompressed) section name of the
// artifact file path with mutate and fixes its CRC-32C, the table and
// header CRCs and the content sha256, so only what mutate changed is wrong.
func patchSection(t *testing.T, path, name string, mutate func([]byte)) {
	t.Helper()
	r, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	i, ok := r.l.index[name]
	l := *r.l
	r.Close()
	if !ok {
		t.Fatalf("no section %q", name)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	e := l.entries[i]
	if e.Codec != CodecNone {
		t.Fatalf("section %q is compressed", name)
	}
	mutate(b[e.Offset : e.Offset+e.Stored])
	le := binary.LittleEndian
	le.PutUint32(b[l.tableOff+uint64(i)*EntrySize+24:], crc(b[e.Offset:e.Offset+e.Stored]))
	le.PutUint32(b[offTableCRC:], crc(b[l.tableOff:l.tableOff+l.tableLen]))
	le.PutUint32(b[offHeaderCRC:], crc(b[:offHeaderCRC]))
	clear(b[offSHA256:endSHA256])
	sum := sha256.Sum256(b)
	copy(b[offSHA256:endSHA256], sum[:])
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestVerifyReportsNonFinite: Verify reports every float tensor holding
// NaN or Inf (each naming the tensor and the element), not only the first
// problem, though every checksum holds.
func TestVerifyReportsNonFinite(t *testing.T) {
	out, _ := packStories(t, WriteOptions{NoCompress: true})
	const a, b = "model.layers.1.self_attn.q_proj.weight", "model.norm.weight"
	le := binary.LittleEndian
	patchSection(t, out, a, func(d []byte) { le.PutUint32(d[4*5:], math.Float32bits(float32(math.NaN()))) })
	patchSection(t, out, b, func(d []byte) { le.PutUint32(d[4*63:], math.Float32bits(float32(math.Inf(1)))) })
	rep, err := Verify(out)
	if !errors.Is(err, ErrFormat) || rep == nil {
		t.Fatalf("Verify: %v (report %v), want ErrFormat", err, rep)
	}
	if rep.OK || len(rep.Problems) != 2 {
		t.Fatalf("problems %+v, want the two non-finite tensors", rep.Problems)
	}
	for k, w := range []struct{ sec, text string }{{a, "element 5 (row-major) is NaN"}, {b, "element 63 (row-major) is +Inf"}} {
		p := rep.Problems[k]
		if p.Section != w.sec || !strings.Contains(p.Error, `tensor "`+w.sec+`"`) || !strings.Contains(p.Error, w.text) {
			t.Errorf("problem %d %+v, want section %s with %q", k, p, w.sec, w.text)
		}
	}
}
