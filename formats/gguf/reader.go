package gguf

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"github.com/lmpack/lmpack/internal/fsx"
	"io"
	"math"
	"os"
)

// maxCount bounds the counts read from a header (tensors, keys, array
// elements, string bytes) so that a corrupt file fails cleanly instead of
// allocating without limit.
const maxCount = 1 << 28

// File is a parsed GGUF header with access to the tensor data.
type File struct {
	// Version is the file's format version (3).
	Version uint32
	// KVs are the metadata pairs in file order; Values are decoded to the
	// Go types KV documents (arrays as slices).
	KVs []KV
	// Tensors are the tensor infos in file order.
	Tensors []TensorInfo
	// Alignment is general.alignment (DefaultAlignment when absent);
	// DataOffset the file offset of the data section.
	Alignment  uint64
	DataOffset uint64

	r    io.ReaderAt
	size int64
	c    io.Closer
}

// Open opens and parses the GGUF file at path (Read); Close the File.
func Open(path string) (*File, error) {
	if err := fsx.CheckRegular(path); err != nil {
		return nil, fmt.Errorf("gguf: %w", err)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("gguf: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("gguf: %w", err)
	}
	g, err := Read(f, st.Size())
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	g.c = f
	return g, nil
}

// Close closes the file opened by Open (nothing for Read's).
func (f *File) Close() error {
	if f.c != nil {
		return f.c.Close()
	}
	return nil
}

// Read parses the GGUF header of the size bytes of r and checks every
// tensor's data range against size.
//
// Errors: a wrong magic, a version other than 3, truncated or oversized
// fields, unknown value or tensor types, duplicate keys or tensor names,
// a misaligned or overlapping offset, data past the end of the file.
func Read(r io.ReaderAt, size int64) (*File, error) {
	d := &dec{r: bufio.NewReaderSize(io.NewSectionReader(r, 0, size), 1<<16), size: uint64(max(size, 0))}
	magic := d.bytes(4)
	if d.err == nil && string(magic) != Magic {
		return nil, fmt.Errorf("gguf: magic %q, want %q", magic, Magic)
	}
	f := &File{r: r, size: size, Alignment: DefaultAlignment}
	f.Version = d.u32()
	if d.err == nil && f.Version != Version {
		return nil, fmt.Errorf("gguf: version %d, want %d", f.Version, Version)
	}
	nt, nkv := d.count(), d.count()
	keys := map[string]bool{}
	for i := uint64(0); i < nkv && d.err == nil; i++ {
		k := d.str()
		v := d.value()
		if d.err != nil {
			return nil, fmt.Errorf("gguf: metadata %d (%q): %w", i, k, d.err)
		}
		if keys[k] {
			return nil, fmt.Errorf("gguf: duplicate metadata key %q", k)
		}
		keys[k] = true
		if k == KeyAlignment {
			a, ok := v.(uint32)
			if !ok || a == 0 || a&(a-1) != 0 {
				return nil, fmt.Errorf("gguf: %s %v: want a uint32 power of two", KeyAlignment, v)
			}
			f.Alignment = uint64(a)
		}
		f.KVs = append(f.KVs, KV{k, v})
	}
	names := map[string]bool{}
	for i := uint64(0); i < nt && d.err == nil; i++ {
		var t TensorInfo
		t.Name = d.str()
		nd := d.u32()
		if d.err == nil && (nd == 0 || nd > 4) {
			return nil, fmt.Errorf("gguf: tensor %q: %d dims, want 1 to 4", t.Name, nd)
		}
		for j := uint32(0); j < nd && d.err == nil; j++ {
			t.Dims = append(t.Dims, d.u64())
		}
		t.Type = Type(d.u32())
		t.Offset = d.u64()
		if d.err != nil {
			break
		}
		if names[t.Name] {
			return nil, fmt.Errorf("gguf: duplicate tensor name %q", t.Name)
		}
		names[t.Name] = true
		f.Tensors = append(f.Tensors, t)
	}
	if d.err != nil {
		return nil, fmt.Errorf("gguf: header: %w", d.err)
	}
	f.DataOffset = alignUp(d.n, f.Alignment)
	var end uint64
	for i := range f.Tensors {
		t := &f.Tensors[i]
		n, err := t.Size()
		if err != nil {
			return nil, err
		}
		if t.Offset%f.Alignment != 0 {
			return nil, fmt.Errorf("gguf: tensor %q: offset %d not a multiple of the alignment %d", t.Name, t.Offset, f.Alignment)
		}
		if t.Offset < end {
			return nil, fmt.Errorf("gguf: tensor %q: offset %d overlaps the previous tensor (ends at %d)", t.Name, t.Offset, end)
		}
		end = t.Offset + n
		if f.DataOffset+end > uint64(size) {
			return nil, fmt.Errorf("gguf: tensor %q: data [%d, %d) past the end of the file (%d bytes)", t.Name, f.DataOffset+t.Offset, f.DataOffset+end, size)
		}
	}
	return f, nil
}

// Get returns the value of metadata key k and whether it is present.
func (f *File) Get(k string) (any, bool) {
	for _, kv := range f.KVs {
		if kv.Key == k {
			return kv.Value, true
		}
	}
	return nil, false
}

// Tensor returns the info of the tensor named name.
func (f *File) Tensor(name string) (*TensorInfo, bool) {
	for i := range f.Tensors {
		if f.Tensors[i].Name == name {
			return &f.Tensors[i], true
		}
	}
	return nil, false
}

// TensorData reads the data of the tensor named name (Size bytes).
// Errors: no such tensor, read errors.
func (f *File) TensorData(name string) ([]byte, error) {
	t, ok := f.Tensor(name)
	if !ok {
		return nil, fmt.Errorf("gguf: no tensor %q", name)
	}
	n, err := t.Size()
	if err != nil {
		return nil, err
	}
	b := make([]byte, n)
	if _, err := f.r.ReadAt(b, int64(f.DataOffset+t.Offset)); err != nil {
		return nil, fmt.Errorf("gguf: tensor %q: %w", name, err)
	}
	return b, nil
}

// dec reads little-endian values, keeping the first error and a count.
type dec struct {
	r    *bufio.Reader
	n    uint64
	size uint64 // bytes in the file: no field can be longer than what is left
	err  error
}

func (d *dec) bytes(n uint64) []byte {
	if d.err != nil {
		return nil
	}
	if n > d.size-d.n {
		d.err = fmt.Errorf("truncated: %d bytes at byte %d run past the end of the file (%d bytes)", n, d.n, d.size)
		return nil
	}
	if n > maxCount {
		d.err = fmt.Errorf("length %d at byte %d: over %d", n, d.n, maxCount)
		return nil
	}
	b := make([]byte, n)
	k, err := io.ReadFull(d.r, b)
	d.n += uint64(k)
	if err != nil {
		d.err = fmt.Errorf("truncated at byte %d: %w", d.n, err)
		return nil
	}
	return b
}

func (d *dec) u8() uint8 {
	if b := d.bytes(1); b != nil {
		return b[0]
	}
	return 0
}
func (d *dec) u16() uint16 {
	if b := d.bytes(2); b != nil {
		return binary.LittleEndian.Uint16(b)
	}
	return 0
}
func (d *dec) u32() uint32 {
	if b := d.bytes(4); b != nil {
		return binary.LittleEndian.Uint32(b)
	}
	return 0
}
func (d *dec) u64() uint64 {
	if b := d.bytes(8); b != nil {
		return binary.LittleEndian.Uint64(b)
	}
	return 0
}
func (d *dec) count() uint64 {
	n := d.u64()
	if d.err == nil && (n > maxCount || n > d.size-d.n) {
		d.err = fmt.Errorf("count %d at byte %d: more than the file's %d bytes can hold", n, d.n, d.size)
	}
	return n
}
func (d *dec) str() string { return string(d.bytes(d.u64())) }

func (d *dec) scalar(t ValueType) any {
	switch t {
	case ValUint8:
		return d.u8()
	case ValInt8:
		return int8(d.u8())
	case ValUint16:
		return d.u16()
	case ValInt16:
		return int16(d.u16())
	case ValUint32:
		return d.u32()
	case ValInt32:
		return int32(d.u32())
	case ValFloat32:
		return math.Float32frombits(d.u32())
	case ValBool:
		b := d.u8()
		if d.err == nil && b > 1 {
			d.err = fmt.Errorf("bool value %d", b)
		}
		return b == 1
	case ValString:
		return d.str()
	case ValUint64:
		return d.u64()
	case ValInt64:
		return int64(d.u64())
	case ValFloat64:
		return math.Float64frombits(d.u64())
	}
	if d.err == nil {
		d.err = fmt.Errorf("unknown value type %d", t)
	}
	return nil
}

func (d *dec) value() any {
	t := ValueType(d.u32())
	if t != ValArray {
		return d.scalar(t)
	}
	et := ValueType(d.u32())
	n := d.count()
	if d.err != nil {
		return nil
	}
	switch et {
	case ValUint8:
		return arr[uint8](d, et, n)
	case ValInt8:
		return arr[int8](d, et, n)
	case ValUint16:
		return arr[uint16](d, et, n)
	case ValInt16:
		return arr[int16](d, et, n)
	case ValUint32:
		return arr[uint32](d, et, n)
	case ValInt32:
		return arr[int32](d, et, n)
	case ValFloat32:
		return arr[float32](d, et, n)
	case ValBool:
		return arr[bool](d, et, n)
	case ValString:
		return arr[string](d, et, n)
	case ValUint64:
		return arr[uint64](d, et, n)
	case ValInt64:
		return arr[int64](d, et, n)
	case ValFloat64:
		return arr[float64](d, et, n)
	}
	d.err = fmt.Errorf("unsupported array element type %d", et)
	return nil
}

func arr[T any](d *dec, et ValueType, n uint64) []T {
	out := make([]T, 0, min(n, 1<<16))
	for i := uint64(0); i < n && d.err == nil; i++ {
		v, _ := d.scalar(et).(T)
		out = append(out, v)
	}
	return out
}
