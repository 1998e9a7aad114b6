package pack

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/internal/shared"
)

func storiesDir(t testing.TB) string {
	t.Helper()
	return filepath.Dir(shared.Path(t, "stories260K-hf", "config.json"))
}

func packStories(t *testing.T, opt WriteOptions) (string, *Stats) {
	t.Helper()
	a, err := FromCheckpoint(storiesDir(t), FromOptions{LmpackVersion: "test"})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	out := filepath.Join(t.TempDir(), "m.lmpk")
	st, err := Write(out, a, opt)
	if err != nil {
		t.Fatal(err)
	}
	return out, st
}

func TestRoundTripStories260K(t *testing.T) {
	dir := storiesDir(t)
	out, st := packStories(t, WriteOptions{})
	for _, d := range st.ByDType {
		t.Logf("stories260K %s: %d sections, %d compressed, %d -> %d bytes (ratio %.3f)", d.DType, d.Sections, d.Compressed, d.Raw, d.Stored, d.Ratio)
	}
	r, err := Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ck, err := safetensors.OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	// The checkpoint's lm_head.weight is a copy of the tied embedding,
	// which is not packed (TestTiedLMHeadNotPacked).
	names := slices.DeleteFunc(ck.Names(), func(n string) bool { return n == "lm_head.weight" })
	if got, want := len(r.Manifest().Tensors), len(names); got != want || want != len(ck.Names())-1 {
		t.Fatalf("manifest has %d tensors, checkpoint %d besides the tied lm_head (of %d)", got, want, len(ck.Names()))
	}
	for _, name := range names {
		tt, _ := ck.Tensor(name)
		b, err := r.Section(name)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b, tt.Data) {
			t.Errorf("tensor %q: bytes differ after round trip", name)
		}
	}
	tok, _ := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
	if b, err := r.Section(r.Manifest().Tokenizer); err != nil || !bytes.Equal(b, tok) {
		t.Errorf("tokenizer section differs (err %v)", err)
	}
	if m := r.Manifest().Model; len(m.Layers) == 0 || m.Layers[0].HeadDim == 0 || m.Layers[0].MLP == nil {
		t.Errorf("model description incomplete: %+v", m)
	}
	rep, err := Verify(out)
	if err != nil || !rep.OK {
		t.Fatalf("verify of a fresh artifact: %v %+v", err, rep)
	}
	if rep.SHA256 != st.SHA256 {
		t.Errorf("verify sha %s, write sha %s", rep.SHA256, st.SHA256)
	}
}

func TestDeterministic(t *testing.T) {
	a, _ := packStories(t, WriteOptions{})
	b, _ := packStories(t, WriteOptions{})
	x, _ := os.ReadFile(a)
	y, _ := os.ReadFile(b)
	if !bytes.Equal(x, y) {
		t.Fatal("two packs of the same input differ")
	}
}

// toBF16 truncates F32 little-endian bytes to BF16 (the high 2 bytes).
func toBF16(f32 []byte) []byte {
	out := make([]byte, len(f32)/2)
	for i := 0; i+4 <= len(f32); i += 4 {
		out[i/2], out[i/2+1] = f32[i+2], f32[i+3]
	}
	return out
}

func TestStories260KBF16Savings(t *testing.T) {
	a, err := FromCheckpoint(storiesDir(t), FromOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	for i := range a.Sections {
		s := &a.Sections[i]
		if s.ElemSize == 4 {
			s.Data, s.ElemSize = toBF16(s.Data), 2
		}
	}
	for i := range a.Manifest.Tensors {
		a.Manifest.Tensors[i].DType = "BF16"
	}
	out := filepath.Join(t.TempDir(), "bf16.lmpk")
	st, err := Write(out, a, WriteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range st.ByDType {
		t.Logf("stories260K as BF16 %s: %d sections, %d compressed, %d -> %d bytes (ratio %.3f)", d.DType, d.Sections, d.Compressed, d.Raw, d.Stored, d.Ratio)
	}
	if rep, err := Verify(out); err != nil || !rep.OK {
		t.Fatal(err)
	}
}

func synth(t *testing.T, secs []Section, dtype string) (*Stats, string) {
	t.Helper()
	a := &Artifact{Manifest: Manifest{Files: []FileEntry{}}}
	for _, s := range secs {
		a.Manifest.Tensors = append(a.Manifest.Tensors, TensorEntry{Name: s.Name, Section: s.Name, DType: dtype, Shape: []int{len(s.Data) / s.ElemSize}})
	}
	a.Sections = secs
	out := filepath.Join(t.TempDir(), "s.lmpk")
	st, err := Write(out, a, WriteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return st, out
}

func TestBF16PlanesAndRandomF32(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	const n = 1 << 16
	bf := make([]byte, 2*n)
	f := make([]byte, 4*n)
	for i := 0; i < n; i++ {
		v := float32(rng.NormFloat64() * 0.02)
		u := math.Float32bits(v)
		binary.LittleEndian.PutUint16(bf[2*i:], uint16(u>>16))
		binary.LittleEndian.PutUint32(f[4*i:], math.Float32bits(float32(rng.NormFloat64())))
	}
	st, out := synth(t, []Section{{Name: "w", ElemSize: 2, Data: bf}}, "BF16")
	s := st.Sections[0]
	ratio := float64(s.Stored) / float64(s.Raw)
	t.Logf("synthetic N(0,0.02) BF16: codec %s ratio %.3f", s.Codec, ratio)
	if s.Codec != CodecLZ4Planes2.String() || ratio > 1-DefaultMinSaving {
		t.Errorf("bf16: codec %s ratio %.3f, want lz4+planes2 saving ≥ 10%%", s.Codec, ratio)
	}
	r, err := Open(out)
	if err != nil {
		t.Fatal(err)
	}
	got, err := r.Section("w")
	r.Close()
	if err != nil || !bytes.Equal(got, bf) {
		t.Fatalf("bf16 round trip differs (%v)", err)
	}
	st, _ = synth(t, []Section{{Name: "w", ElemSize: 4, Data: f}}, "F32")
	if s := st.Sections[0]; s.Codec != "none" || s.Stored != s.Raw {
		t.Errorf("random f32: codec %s stored %d raw %d, want raw", s.Codec, s.Stored, s.Raw)
	}
}

func TestCorruption(t *testing.T) {
	out, _ := packStories(t, WriteOptions{})
	orig, _ := os.ReadFile(out)
	r, err := Open(out)
	if err != nil {
		t.Fatal(err)
	}
	l := r.l
	r.Close()
	write := func(b []byte) string {
		p := filepath.Join(t.TempDir(), "c.lmpk")
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// A flipped byte in every section is found and named.
	for _, e := range l.entries {
		if e.Stored == 0 {
			continue
		}
		b := bytes.Clone(orig)
		b[e.Offset+e.Stored/2] ^= 0x40
		rep, err := Verify(write(b))
		if !errors.Is(err, ErrChecksum) || !strings.Contains(err.Error(), e.Name) {
			t.Fatalf("section %q flipped: err %v", e.Name, err)
		}
		if rep.OK || rep.Problems[0].Section != e.Name {
			t.Errorf("section %q flipped: report %+v", e.Name, rep.Problems)
		}
	}
	b := bytes.Clone(orig)
	b[l.manifestOff+l.manifestLen/2] ^= 1
	if _, err := Verify(write(b)); !errors.Is(err, ErrChecksum) || !strings.Contains(err.Error(), "manifest") {
		t.Errorf("manifest flipped: %v", err)
	}
	if _, err := Verify(write(orig[:len(orig)-100])); !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), "truncated") {
		t.Errorf("truncated: %v", err)
	}
	b = bytes.Clone(orig)
	binary.LittleEndian.PutUint32(b[offVersion:], 99)
	if _, err := Open(write(b)); !errors.Is(err, ErrVersion) {
		t.Errorf("version 99: %v", err)
	}
}

func TestManifestTensorWithoutSection(t *testing.T) {
	a := &Artifact{Manifest: Manifest{Files: []FileEntry{}, Tensors: []TensorEntry{
		{Name: "a", Section: "a", DType: "F32", Shape: []int{1}},
		{Name: "ghost", Section: "ghost", DType: "F32", Shape: []int{1}}}},
		Sections: []Section{{Name: "a", ElemSize: 4, Data: make([]byte, 4)}}}
	_, err := Write(filepath.Join(t.TempDir(), "x.lmpk"), a, WriteOptions{})
	if !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), `"ghost"`) {
		t.Fatalf("writer: %v", err)
	}
	// Forge a file whose manifest names a missing section: write a valid
	// one, then rewrite the manifest and fix its CRCs.
	a.Manifest.Tensors = a.Manifest.Tensors[:1]
	p := filepath.Join(t.TempDir(), "y.lmpk")
	if _, err := Write(p, a, WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(p)
	le := binary.LittleEndian
	mo, ml := le.Uint64(b[offManifestOff:]), le.Uint64(b[offManifestLen:])
	man := strings.Replace(string(b[mo:mo+ml]), `"tensors":[`, `"tensors":[{"name":"ghost","section":"ghost","dtype":"F32","shape":[1]},`, 1)
	b = append(b[:mo], man...)
	le.PutUint64(b[offFileSize:], uint64(len(b)))
	le.PutUint64(b[offManifestLen:], uint64(len(man)))
	le.PutUint32(b[offManifestCRC:], crc([]byte(man)))
	le.PutUint32(b[offHeaderCRC:], crc(b[:offHeaderCRC]))
	os.WriteFile(p, b, 0o644)
	if _, err := Open(p); !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), `"ghost"`) {
		t.Errorf("open: %v", err)
	}
	rep, err := Verify(p)
	if !errors.Is(err, ErrMismatch) || rep == nil || rep.OK {
		t.Errorf("verify: %v %+v", err, rep)
	}
}

// TestManifestDuplicateFile: a manifest listing one embedded file twice
// (two sections for config.json), two files or a file and a tensor on one
// section, or a file name that is not a plain name, is refused naming the
// file.
func TestManifestDuplicateFile(t *testing.T) {
	a := &Artifact{Manifest: Manifest{Files: []FileEntry{{Name: "config.json", Section: "f0"}, {Name: "config.json", Section: "f1"}},
		Tensors: []TensorEntry{{Name: "a", Section: "a", DType: "F32", Shape: []int{1}}}},
		Sections: []Section{{Name: "a", ElemSize: 4, Data: make([]byte, 4)}, {Name: "f0", ElemSize: 1, Data: []byte("{}")}, {Name: "f1", ElemSize: 1, Data: []byte("{}")}}}
	_, err := Write(filepath.Join(t.TempDir(), "x.lmpk"), a, WriteOptions{})
	if !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), `file "config.json" is listed twice`) {
		t.Fatalf("writer: %v, want the duplicate config.json named", err)
	}
	// Aliases: two files on one section, a file on a tensor's section,
	// names with directories or empty.
	for _, c := range []struct {
		files []FileEntry
		want  string
	}{
		{[]FileEntry{{Name: "config.json", Section: "f0"}, {Name: "tokenizer.json", Section: "f0"}}, `file "tokenizer.json": section "f0" is also file "config.json"'s`},
		{[]FileEntry{{Name: "config.json", Section: "a"}}, `file "config.json": section "a" is also tensor "a"'s`},
		{[]FileEntry{{Name: "./config.json", Section: "f0"}}, `file "./config.json": want a plain file name`},
		{[]FileEntry{{Name: "../../etc/x", Section: "f0"}}, `file "../../etc/x": want a plain file name`},
		{[]FileEntry{{Name: "", Section: "f0"}}, `file "": want a plain file name`},
	} {
		b := &Artifact{Manifest: Manifest{Files: c.files, Tensors: a.Manifest.Tensors},
			Sections: []Section{{Name: "a", ElemSize: 4, Data: make([]byte, 4)}, {Name: "f0", ElemSize: 1, Data: []byte("{}")}}}
		_, err := Write(filepath.Join(t.TempDir(), "y.lmpk"), b, WriteOptions{})
		if !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("files %+v: %v, want %q", c.files, err, c.want)
		}
	}
}

func FuzzHeader(f *testing.F) {
	a := &Artifact{Manifest: Manifest{Files: []FileEntry{}, Tensors: []TensorEntry{{Name: "a", Section: "a", DType: "BF16", Shape: []int{64}}}},
		Sections: []Section{{Name: "a", ElemSize: 2, Data: make([]byte, 128)}}}
	p := filepath.Join(f.TempDir(), "f.lmpk")
	if _, err := Write(p, a, WriteOptions{}); err != nil {
		f.Fatal(err)
	}
	seed, _ := os.ReadFile(p)
	f.Add(seed)
	f.Add(seed[:HeaderSize])
	f.Add([]byte("LMPK"))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, errs := parse("fuzz", b)
		if r != nil && len(errs) == 0 {
			for _, n := range r.Names() {
				r.Section(n) // decoded size is bounded by 255× the stored bytes
			}
		}
	})
}

// TestSHA256IsFileHash: Stats.SHA256 and VerifyReport.SHA256 are the
// sha256 of the file's bytes (sha256sum); ContentSHA256 is the hash the
// header stores (the file with the hash field zeroed), and differs.
func TestSHA256IsFileHash(t *testing.T) {
	out, st := packStories(t, WriteOptions{})
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	file := sha256.Sum256(b)
	zeroed := slices.Clone(b)
	clear(zeroed[offSHA256:endSHA256])
	content := sha256.Sum256(zeroed)
	rep, err := Verify(out)
	if err != nil {
		t.Fatal(err)
	}
	want, wantContent := hex.EncodeToString(file[:]), hex.EncodeToString(content[:])
	if st.SHA256 != want || rep.SHA256 != want {
		t.Errorf("sha256: write %s, verify %s, file %s", st.SHA256, rep.SHA256, want)
	}
	if st.ContentSHA256 != wantContent || rep.ContentSHA256 != wantContent || wantContent != hex.EncodeToString(b[offSHA256:endSHA256]) || want == wantContent {
		t.Errorf("content sha256: write %s, verify %s, want %s (stored %x)", st.ContentSHA256, rep.ContentSHA256, wantContent, b[offSHA256:endSHA256])
	}
}
