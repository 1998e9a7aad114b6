package pack

import (
	"path/filepath"
	"testing"

	"github.com/lmpack/lmpack/internal/shared"
)

// lz4Models are the shared checkpoints whose lz4 savings are reported.
var lz4Models = []string{"stories260K-hf", "stories260K-moe-hf"}

// asBF16 rewrites every F32 tensor section of a to BF16 (truncation), as
// a bf16 checkpoint would be stored.
func asBF16(a *Artifact) {
	f32 := map[string]bool{}
	for i := range a.Manifest.Tensors {
		if e := &a.Manifest.Tensors[i]; e.DType == "F32" {
			e.DType = "BF16"
			f32[e.Section] = true
		}
	}
	for i := range a.Sections {
		if s := &a.Sections[i]; f32[s.Name] {
			s.Data, s.ElemSize = toBF16(s.Data), 2
		}
	}
}

// TestLZ4SavingsPerModel packs each shared model as stored (F32) and as
// BF16 and logs, per dtype, what lz4 saved (issue #6: "report what it
// saved on each model"). Every compressed section must save at least 10%
// and decode (Verify); the embedded JSON files must compress, and trained
// F32 weights, which lz4 cannot shrink by 10%, must stay raw.
func TestLZ4SavingsPerModel(t *testing.T) {
	for _, model := range lz4Models {
		for _, bf16 := range []bool{false, true} {
			a, err := FromCheckpoint(filepath.Dir(shared.Path(t, model, "config.json")), FromOptions{LmpackVersion: "test"})
			if err != nil {
				t.Fatal(err)
			}
			label := model + " F32"
			if bf16 {
				asBF16(a)
				label = model + " as BF16"
			}
			out := filepath.Join(t.TempDir(), "m.lmpk")
			st, err := Write(out, a, WriteOptions{})
			a.Close()
			if err != nil {
				t.Fatal(err)
			}
			if _, err := Verify(out); err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: %d -> %d bytes, lz4 saved %d bytes (%.2f%%)", label, st.Raw, st.Stored, st.Raw-st.Stored, 100*float64(st.Raw-st.Stored)/float64(st.Raw))
			for _, d := range st.ByDType {
				t.Logf("  %-5s %3d sections, %3d compressed, %8d -> %8d bytes (saved %.2f%%)", d.DType, d.Sections, d.Compressed, d.Raw, d.Stored, 100*(1-d.Ratio))
				if d.DType == "file" && d.Compressed == 0 {
					t.Errorf("%s: no embedded JSON file compressed", label)
				}
				if d.DType == "F32" && d.Compressed != 0 {
					t.Errorf("%s: %d trained F32 sections compressed by ≥10%%", label, d.Compressed)
				}
			}
			for _, s := range st.Sections {
				if s.Codec != "none" && float64(s.Stored) > 0.9*float64(s.Raw) {
					t.Errorf("%s: section %q kept %s saving only %d of %d bytes", label, s.Name, s.Codec, s.Raw-s.Stored, s.Raw)
				}
			}
		}
	}
}

// packInput loads a shared model's artifact (FromCheckpoint), as BF16
// when bf16 is set.
func packInput(b *testing.B, model string, bf16 bool) *Artifact {
	a, err := FromCheckpoint(filepath.Dir(shared.Path(b, model, "config.json")), FromOptions{LmpackVersion: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	if bf16 {
		asBF16(a)
	}
	return a
}

func rawBytes(a *Artifact) int64 {
	var n int64
	for _, s := range a.Sections {
		n += int64(len(s.Data))
	}
	return n
}

// BenchmarkPack: Write throughput in MB/s of raw section bytes (lz4
// tried on every section, kept where it saves ≥10%), with the bytes lz4
// saved.
func BenchmarkPack(b *testing.B) {
	for _, model := range lz4Models {
		for _, bf16 := range []bool{false, true} {
			name := model + "/F32"
			if bf16 {
				name = model + "/BF16"
			}
			b.Run(name, func(b *testing.B) {
				a := packInput(b, model, bf16)
				defer a.Close()
				out := filepath.Join(b.TempDir(), "m.lmpk")
				b.SetBytes(rawBytes(a))
				var st *Stats
				for b.Loop() {
					var err error
					if st, err = Write(out, a, WriteOptions{}); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(st.Raw-st.Stored), "lz4_saved_bytes")
			})
		}
	}
}

// writeBench packs a shared model (BF16, so lz4 sections are exercised)
// into a temporary artifact and returns its path and size.
func writeBench(b *testing.B, model string) (string, int64) {
	a := packInput(b, model, true)
	defer a.Close()
	out := filepath.Join(b.TempDir(), "m.lmpk")
	st, err := Write(out, a, WriteOptions{})
	if err != nil {
		b.Fatal(err)
	}
	return out, st.FileSize
}

// BenchmarkOpen: time to open an artifact (map it, check header, table
// and manifest CRCs and manifest/section agreement; no section read) and
// close it, in ns/op.
func BenchmarkOpen(b *testing.B) {
	for _, model := range lz4Models {
		b.Run(model, func(b *testing.B) {
			out, _ := writeBench(b, model)
			for b.Loop() {
				r, err := Open(out)
				if err != nil {
					b.Fatal(err)
				}
				r.Close()
			}
		})
	}
}

// BenchmarkVerify: Verify throughput in MB/s of file bytes (every section
// CRC, lz4 decoding, the content and file sha256s, and the loader's
// manifest checks).
func BenchmarkVerify(b *testing.B) {
	for _, model := range lz4Models {
		b.Run(model, func(b *testing.B) {
			out, size := writeBench(b, model)
			b.SetBytes(size)
			for b.Loop() {
				if _, err := Verify(out); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
