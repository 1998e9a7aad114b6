package pack

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestUnknownManifestDType: a manifest dtype that is no safetensors dtype
// ("BF6") is reported as an unknown dtype, naming the tensor, by Write,
// and by Open and Verify of a file resealed with correct checksums; a
// directory given to Verify is refused as one.
func TestUnknownManifestDType(t *testing.T) {
	a, err := FromCheckpoint(storiesDir(t), FromOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	const name = "model.norm.weight"
	for i := range a.Manifest.Tensors {
		if a.Manifest.Tensors[i].Name == name {
			a.Manifest.Tensors[i].DType = "BF6"
		}
	}
	want := `tensor "` + name + `": unknown dtype "BF6"`
	if _, err := Write(filepath.Join(t.TempDir(), "w.lmpk"), a, WriteOptions{}); !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), want) {
		t.Errorf("Write: %v, want ErrFormat with %q", err, want)
	}

	// Reseal: an artifact written with F32, its manifest edited to BF6
	// (same length) and every checksum fixed.
	out, _ := packStories(t, WriteOptions{})
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	le := binary.LittleEndian
	mo, ml := le.Uint64(b[offManifestOff:]), le.Uint64(b[offManifestLen:])
	man := b[mo : mo+ml]
	entry := []byte(`{"name":"` + name + `","section":"` + name + `","dtype":"F32"`)
	i := bytes.Index(man, entry)
	if i < 0 {
		t.Fatalf("manifest lacks %s", entry)
	}
	copy(man[i+len(entry)-5:], `"BF6"`)
	le.PutUint32(b[offManifestCRC:], crc(man))
	le.PutUint32(b[offHeaderCRC:], crc(b[:offHeaderCRC]))
	clear(b[offSHA256:endSHA256])
	sum := sha256.Sum256(b)
	copy(b[offSHA256:endSHA256], sum[:])
	if err := os.WriteFile(out, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if r, err := Open(out); err == nil || !strings.Contains(err.Error(), want) {
		if err == nil {
			r.Close()
		}
		t.Errorf("Open: %v, want %q", err, want)
	}
	rep, err := Verify(out)
	if err == nil || rep == nil || rep.OK || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "does not match section") {
		t.Errorf("Verify: %v (report %+v), want %q only", err, rep, want)
	}

	dir := t.TempDir()
	if _, err := Verify(dir); err == nil || !strings.Contains(err.Error(), dir+" is a directory; verify takes an .lmpk artifact file") {
		t.Errorf("Verify(dir): %v", err)
	}
}
