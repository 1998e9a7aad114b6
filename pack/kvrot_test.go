package pack

import (
	"encoding/binary"
	"math"
	"path/filepath"
	"testing"

	"github.com/lmpack/lmpack/calibrate"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/internal/shared"
	"github.com/lmpack/lmpack/model"
	"github.com/lmpack/lmpack/quantize/oscar"
)

// TestPackKVRotations: an artifact packed with a real OSCAR rotation file
// (calibrated on calib.txt) carries the KV scheme in its manifest, and the
// rotation sections read back equal the rotation file's matrices.
func TestPackKVRotations(t *testing.T) {
	mdir := shared.Path(t, "stories260K-hf")
	dir := t.TempDir()
	calib := filepath.Join(dir, "calib.safetensors")
	if _, err := calibrate.Run(t.Context(), calibrate.Options{Model: mdir, Data: shared.Path(t, "tinystories-valid", "calib.txt"),
		Tokens: 1024, Ctx: 256, Out: calib, Threads: 1, Version: "test"}); err != nil {
		t.Fatal(err)
	}
	rotPath := filepath.Join(dir, "rot.safetensors")
	if _, err := oscar.QuantizeKV(t.Context(), oscar.KVOptions{Model: mdir, Calib: calib, Method: oscar.Method,
		ClipK: oscar.DefaultClipK, ClipV: oscar.DefaultClipV, Out: rotPath, Version: "test"}); err != nil {
		t.Fatal(err)
	}
	a, err := FromCheckpoint(mdir, FromOptions{KVRotations: rotPath, LmpackVersion: "test"})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	out := filepath.Join(dir, "m.lmpk")
	if _, err := Write(out, a, WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := Verify(out); err != nil {
		t.Fatal(err)
	}
	r, err := Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	kv := r.Manifest().KV
	if kv == nil || kv.Method != "oscar" || len(kv.Rotations) != 5 || len(kv.ClipK) != 5 || kv.ClipV[0] != 0.92 {
		t.Fatalf("manifest kv scheme: %+v", kv)
	}
	ck, err := safetensors.OpenDir(mdir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	fp, _ := model.Fingerprint(mdir, ck)
	rot, _, err := oscar.ReadFile(rotPath, model.Expect{ModelFingerprint: fp})
	if err != nil {
		t.Fatal(err)
	}
	for l, e := range kv.Rotations {
		for _, pair := range []struct {
			name string
			want []float32
		}{{e.K, rot.K[l]}, {e.V, rot.V[l]}} {
			b, err := r.Section(pair.name)
			if err != nil {
				t.Fatal(err)
			}
			if len(b) != 4*len(pair.want) {
				t.Fatalf("%s: %d bytes", pair.name, len(b))
			}
			for i, w := range pair.want {
				if got := math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])); got != w {
					t.Fatalf("%s[%d] = %v, want %v", pair.name, i, got, w)
				}
			}
		}
	}
}
