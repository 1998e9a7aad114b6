package safetensors

import (
	"cmp"
	"errors"
	"os"
	"slices"
	"testing"

	"github.com/lmpack/lmpack/internal/shared"
)

// fuzzMaxData caps the data-section length a fuzzed header is checked
// against, and so the zero bytes the re-serialisation check may reference.
const fuzzMaxData = 4 << 20

var fuzzZeros = make([]byte, fuzzMaxData)

// FuzzHeader feeds arbitrary bytes to the header parser (as a header with a
// data section of dataLen bytes) and to the whole-file parser (as a complete
// file). Neither may panic; every rejection must wrap ErrFormat; an accepted
// header must satisfy the format invariants and survive a write/parse round
// trip through the writer's header builder. Allocations are bounded by the
// input size and fuzzMaxData: nothing is allocated from declared shapes or
// offsets.
func FuzzHeader(f *testing.F) {
	raw, err := os.ReadFile(shared.Path(f, "stories260K-hf", "model.safetensors"))
	if err != nil {
		f.Fatal(err)
	}
	n := int(raw[0]) | int(raw[1])<<8
	f.Add(raw[8:8+n], uint32(len(raw)-8-n)) // the real header, valid
	f.Add(raw[:4096], uint32(0))            // the first 4 KB of the file
	for _, h := range []string{
		`{}`,
		`{"__metadata__":{"format":"pt"}}`,
		`{"s":{"dtype":"F8_E4M3","shape":[],"data_offsets":[0,1]}}`,
		`{"e":{"dtype":"BF16","shape":[0,3],"data_offsets":[0,0]},"x":{"dtype":"I64","shape":[1,1],"data_offsets":[0,8]}}`,
		`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}`,
		`{"a":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,0]}}`,
		`{"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}}  `,
	} {
		f.Add([]byte(h), uint32(12))
		f.Add(rawFile(pad(h), make([]byte, 12)), uint32(0))
	}
	f.Fuzz(func(t *testing.T, hdr []byte, dataLen uint32) {
		dl := int64(dataLen % fuzzMaxData)
		h, err := parseHeader("fuzz", hdr, dl)
		if err != nil {
			if !errors.Is(err, ErrFormat) {
				t.Fatalf("rejection does not wrap ErrFormat: %v", err)
			}
		} else {
			checkInvariants(t, h, dl)
			// Re-serialise with the writer's header builder and parse again.
			ws := make([]WriteTensor, len(h.tensors))
			for i, ti := range h.tensors {
				ws[i] = WriteTensor{Name: ti.Name, DType: ti.DType, Shape: ti.Shape, Data: fuzzZeros[:ti.End-ti.Begin]}
			}
			hdr2, _, _, err := buildHeader("fuzz", ws, h.metadata)
			if err != nil {
				t.Fatalf("accepted header cannot be re-written: %v", err)
			}
			h2, err := parseHeader("fuzz", hdr2, dl)
			if err != nil {
				t.Fatalf("re-written header rejected: %v\n%s", err, hdr2)
			}
			if len(h2.tensors) != len(h.tensors) || len(h2.metadata) != len(h.metadata) {
				t.Fatalf("round trip changed the header: %d/%d tensors", len(h2.tensors), len(h.tensors))
			}
			for i := range h.tensors {
				a, b := h.tensors[i], h2.tensors[i]
				if a.Name != b.Name || a.DType != b.DType || !slices.Equal(a.Shape, b.Shape) || a.End-a.Begin != b.End-b.Begin {
					t.Fatalf("round trip changed %q: %+v vs %+v", a.Name, a, b)
				}
			}
			for k, v := range h.metadata {
				if h2.metadata[k] != v {
					t.Fatalf("round trip changed metadata %q", k)
				}
			}
		}
		// The same bytes as a whole file.
		sf, err := FromBytes("fuzz", hdr)
		if err != nil {
			if !errors.Is(err, ErrFormat) {
				t.Fatalf("rejection does not wrap ErrFormat: %v", err)
			}
			return
		}
		for _, ti := range sf.Tensors() {
			tn, err := sf.Tensor(ti.Name)
			if err != nil {
				t.Fatal(err)
			}
			v, err := tn.Float32()
			if err != nil || len(v) != tn.NumElements() {
				t.Fatalf("%q: %d values for %d elements: %v", ti.Name, len(v), tn.NumElements(), err)
			}
		}
	})
}

// checkInvariants asserts what parseHeader promises for an accepted header.
func checkInvariants(t *testing.T, h *header, dataLen int64) {
	t.Helper()
	var covered int64
	for i, ti := range h.tensors {
		if i > 0 && h.tensors[i-1].Name >= ti.Name {
			t.Fatalf("tensors not sorted/unique at %q", ti.Name)
		}
		if ti.Begin < 0 || ti.End < ti.Begin || ti.End > dataLen {
			t.Fatalf("%q: offsets [%d,%d) outside [0,%d)", ti.Name, ti.Begin, ti.End, dataLen)
		}
		nb, ok := byteLen(ti.Shape, ti.DType.Size())
		if !ok || nb != ti.End-ti.Begin || ti.DType.Size() == 0 {
			t.Fatalf("%q: %s %v does not match [%d,%d)", ti.Name, ti.DType, ti.Shape, ti.Begin, ti.End)
		}
		covered += nb
	}
	if covered != dataLen {
		t.Fatalf("tensors cover %d of %d bytes", covered, dataLen)
	}
	// Sorted by offsets, each range starts where the previous one ended.
	byOff := slices.Clone(h.tensors)
	slices.SortFunc(byOff, func(a, b TensorInfo) int { return cmp.Or(cmp.Compare(a.Begin, b.Begin), cmp.Compare(a.End, b.End)) })
	var pos int64
	for _, ti := range byOff {
		if ti.Begin != pos {
			t.Fatalf("%q starts at %d, previous data ends at %d", ti.Name, ti.Begin, pos)
		}
		pos = ti.End
	}
}
