// Package gguf reads and writes GGUF version 3, the file format of
// llama.cpp (ggml): a header of typed metadata key-value pairs and tensor
// infos (name, dims, type, offset), padding to general.alignment, then
// the tensor data, each tensor's offset aligned to general.alignment.
// Integers are little-endian; a string is a uint64 byte length and its
// UTF-8 bytes; an array is its element type, a uint64 count and the
// elements.
//
// Dimensions follow ggml's order: Dims[0] (ne[0]) is the contiguous
// dimension, so a row-major [rows, cols] tensor has Dims {cols, rows}
// (see DimsOf).
package gguf

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
)

// Magic is the first four bytes of a GGUF file; Version the format
// version this package writes and reads.
const (
	Magic   = "GGUF"
	Version = 3
)

// DefaultAlignment is the alignment (bytes) of the data section and of
// every tensor's offset when general.alignment is absent.
const DefaultAlignment = 32

// KeyAlignment is the metadata key that overrides DefaultAlignment.
const KeyAlignment = "general.alignment"

// ValueType is the type tag of a metadata value.
type ValueType uint32

// Metadata value types (gguf.h's gguf_type).
const (
	ValUint8   ValueType = 0
	ValInt8    ValueType = 1
	ValUint16  ValueType = 2
	ValInt16   ValueType = 3
	ValUint32  ValueType = 4
	ValInt32   ValueType = 5
	ValFloat32 ValueType = 6
	ValBool    ValueType = 7
	ValString  ValueType = 8
	ValArray   ValueType = 9
	ValUint64  ValueType = 10
	ValInt64   ValueType = 11
	ValFloat64 ValueType = 12
)

// KV is one metadata pair. Value is one of the Go types uint8, int8,
// uint16, int16, uint32, int32, float32, bool, string, uint64, int64,
// float64 (the scalar types, in that ValueType order), or a slice of one
// of them (an array; []string, []int32, []float32, ... ).
type KV struct {
	Key   string
	Value any
}

// TensorInfo describes one tensor: its name, its dims in ggml order
// (Dims[0] contiguous) and its Type. Offset (relative to the start of the
// data section) is set by the writer and read by the reader.
type TensorInfo struct {
	Name   string
	Dims   []uint64
	Type   Type
	Offset uint64
}

// DimsOf returns the ggml dims of a row-major shape (its reverse).
func DimsOf(shape []int) []uint64 {
	d := make([]uint64, len(shape))
	for i, s := range shape {
		d[len(shape)-1-i] = uint64(s)
	}
	return d
}

// Shape returns the row-major shape of t (the reverse of Dims).
func (t *TensorInfo) Shape() []int {
	s := make([]int, len(t.Dims))
	for i, d := range t.Dims {
		s[len(t.Dims)-1-i] = int(d)
	}
	return s
}

// Size returns the bytes of t's data: Type.RowBytes(Dims[0]) times the
// product of the other dims. Errors: an unknown type, Dims[0] not a
// multiple of the type's block size, no dims, or a size over 2^62.
func (t *TensorInfo) Size() (uint64, error) {
	if len(t.Dims) == 0 || len(t.Dims) > 4 {
		return 0, fmt.Errorf("gguf: tensor %q: %d dims, want 1 to 4", t.Name, len(t.Dims))
	}
	if t.Dims[0] > math.MaxInt32*16 {
		return 0, fmt.Errorf("gguf: tensor %q: ne[0] %d too large", t.Name, t.Dims[0])
	}
	rb, err := t.Type.RowBytes(int(t.Dims[0]))
	if err != nil {
		return 0, fmt.Errorf("gguf: tensor %q: %w", t.Name, err)
	}
	n := uint64(rb)
	for _, d := range t.Dims[1:] {
		if d != 0 && n > (1<<62)/d {
			return 0, fmt.Errorf("gguf: tensor %q: size overflows", t.Name)
		}
		n *= d
	}
	return n, nil
}

func alignUp(x, a uint64) uint64 { return (x + a - 1) / a * a }

// Writer streams a GGUF file: NewWriter writes the header (all metadata
// and tensor infos, so every tensor's size is fixed up front), then
// WriteTensor is called once per tensor in the order of the infos. Close
// checks that every tensor was written and flushes.
type Writer struct {
	w       *bufio.Writer
	tensors []TensorInfo
	sizes   []uint64
	align   uint64
	next    int
	pos     uint64 // bytes written into the data section
	err     error
}

// NewWriter writes the GGUF header for kvs and tensors to w and returns a
// Writer for the tensor data. The tensors' Offset fields are computed
// (each aligned to the alignment: general.alignment when kvs has it as a
// uint32, else DefaultAlignment) and stored back in tensors. Keys must be
// unique and tensor names unique.
//
// Errors: a duplicate key or tensor name, an unsupported Value type, a
// bad general.alignment (not a power of two), a tensor whose Size fails,
// and w's write errors.
func NewWriter(w io.Writer, kvs []KV, tensors []TensorInfo) (*Writer, error) {
	align := uint64(DefaultAlignment)
	seen := map[string]bool{}
	for _, kv := range kvs {
		if seen[kv.Key] {
			return nil, fmt.Errorf("gguf: duplicate metadata key %q", kv.Key)
		}
		seen[kv.Key] = true
		if kv.Key == KeyAlignment {
			a, ok := kv.Value.(uint32)
			if !ok || a == 0 || a&(a-1) != 0 {
				return nil, fmt.Errorf("gguf: %s %v: want a uint32 power of two", KeyAlignment, kv.Value)
			}
			align = uint64(a)
		}
	}
	gw := &Writer{w: bufio.NewWriterSize(w, 1<<20), tensors: tensors, align: align}
	names := map[string]bool{}
	var off uint64
	for i := range tensors {
		t := &tensors[i]
		if names[t.Name] {
			return nil, fmt.Errorf("gguf: duplicate tensor name %q", t.Name)
		}
		names[t.Name] = true
		n, err := t.Size()
		if err != nil {
			return nil, err
		}
		off = alignUp(off, align)
		t.Offset = off
		gw.sizes = append(gw.sizes, n)
		off += n
	}
	e := &enc{w: gw.w}
	e.bytes([]byte(Magic))
	e.u32(Version)
	e.u64(uint64(len(tensors)))
	e.u64(uint64(len(kvs)))
	for _, kv := range kvs {
		e.str(kv.Key)
		if err := e.value(kv.Value); err != nil {
			return nil, fmt.Errorf("gguf: metadata %q: %w", kv.Key, err)
		}
	}
	for _, t := range tensors {
		e.str(t.Name)
		e.u32(uint32(len(t.Dims)))
		for _, d := range t.Dims {
			e.u64(d)
		}
		e.u32(uint32(t.Type))
		e.u64(t.Offset)
	}
	if e.err != nil {
		return nil, e.err
	}
	e.pad(alignUp(e.n, align) - e.n)
	if e.err != nil {
		return nil, e.err
	}
	return gw, nil
}

// WriteTensor writes the data of the next tensor (the i-th of the infos,
// in order); len(data) must equal its Size. Errors: a wrong size, more
// tensors than the infos, and write errors (which stick: later calls
// return the first).
func (g *Writer) WriteTensor(data []byte) error {
	if g.err != nil {
		return g.err
	}
	if g.next >= len(g.tensors) {
		return errors.New("gguf: WriteTensor called after the last tensor")
	}
	t := g.tensors[g.next]
	if uint64(len(data)) != g.sizes[g.next] {
		return fmt.Errorf("gguf: tensor %q: %d bytes of data, want %d (%s %v)", t.Name, len(data), g.sizes[g.next], t.Type, t.Dims)
	}
	e := &enc{w: g.w}
	e.pad(t.Offset - g.pos)
	e.bytes(data)
	g.pos = t.Offset + uint64(len(data))
	g.next++
	g.err = e.err
	return g.err
}

// Close pads the file to the alignment and flushes it. Errors: tensors
// left unwritten (naming the first) and write errors. It does not close
// the underlying writer.
func (g *Writer) Close() error {
	if g.err != nil {
		return g.err
	}
	if g.next != len(g.tensors) {
		return fmt.Errorf("gguf: %d of %d tensors written (next: %q)", g.next, len(g.tensors), g.tensors[g.next].Name)
	}
	e := &enc{w: g.w}
	e.pad(alignUp(g.pos, g.align) - g.pos)
	if e.err != nil {
		return e.err
	}
	return g.w.Flush()
}

// enc writes little-endian values, keeping the first error and a count.
type enc struct {
	w   io.Writer
	n   uint64
	err error
	buf [8]byte
}

func (e *enc) bytes(b []byte) {
	if e.err != nil {
		return
	}
	n, err := e.w.Write(b)
	e.n += uint64(n)
	e.err = err
}

var zeros [256]byte

func (e *enc) pad(n uint64) {
	for n > 0 {
		k := min(n, uint64(len(zeros)))
		e.bytes(zeros[:k])
		n -= k
	}
}

func (e *enc) u8(v uint8) { e.buf[0] = v; e.bytes(e.buf[:1]) }
func (e *enc) u16(v uint16) {
	binary.LittleEndian.PutUint16(e.buf[:], v)
	e.bytes(e.buf[:2])
}
func (e *enc) u32(v uint32) {
	binary.LittleEndian.PutUint32(e.buf[:], v)
	e.bytes(e.buf[:4])
}
func (e *enc) u64(v uint64) {
	binary.LittleEndian.PutUint64(e.buf[:], v)
	e.bytes(e.buf[:8])
}
func (e *enc) str(s string) { e.u64(uint64(len(s))); e.bytes([]byte(s)) }

// scalar writes v's payload and returns its type; ok false for a type
// that is not a GGUF scalar.
func (e *enc) scalar(v any) (ValueType, bool) {
	switch x := v.(type) {
	case uint8:
		e.u8(x)
		return ValUint8, true
	case int8:
		e.u8(uint8(x))
		return ValInt8, true
	case uint16:
		e.u16(x)
		return ValUint16, true
	case int16:
		e.u16(uint16(x))
		return ValInt16, true
	case uint32:
		e.u32(x)
		return ValUint32, true
	case int32:
		e.u32(uint32(x))
		return ValInt32, true
	case float32:
		e.u32(math.Float32bits(x))
		return ValFloat32, true
	case bool:
		b := uint8(0)
		if x {
			b = 1
		}
		e.u8(b)
		return ValBool, true
	case string:
		e.str(x)
		return ValString, true
	case uint64:
		e.u64(x)
		return ValUint64, true
	case int64:
		e.u64(uint64(x))
		return ValInt64, true
	case float64:
		e.u64(math.Float64bits(x))
		return ValFloat64, true
	}
	return 0, false
}

// scalarType returns the ValueType of a scalar Go value.
func scalarType(v any) (ValueType, bool) {
	switch v.(type) {
	case uint8:
		return ValUint8, true
	case int8:
		return ValInt8, true
	case uint16:
		return ValUint16, true
	case int16:
		return ValInt16, true
	case uint32:
		return ValUint32, true
	case int32:
		return ValInt32, true
	case float32:
		return ValFloat32, true
	case bool:
		return ValBool, true
	case string:
		return ValString, true
	case uint64:
		return ValUint64, true
	case int64:
		return ValInt64, true
	case float64:
		return ValFloat64, true
	}
	return 0, false
}

func (e *enc) value(v any) error {
	if t, ok := scalarType(v); ok {
		e.u32(uint32(t))
		e.scalar(v)
		return nil
	}
	var elems []any
	var et ValueType
	add := func(t ValueType, n int, at func(i int) any) {
		et = t
		elems = make([]any, n)
		for i := range elems {
			elems[i] = at(i)
		}
	}
	switch x := v.(type) {
	case []uint8:
		add(ValUint8, len(x), func(i int) any { return x[i] })
	case []int8:
		add(ValInt8, len(x), func(i int) any { return x[i] })
	case []uint16:
		add(ValUint16, len(x), func(i int) any { return x[i] })
	case []int16:
		add(ValInt16, len(x), func(i int) any { return x[i] })
	case []uint32:
		add(ValUint32, len(x), func(i int) any { return x[i] })
	case []int32:
		add(ValInt32, len(x), func(i int) any { return x[i] })
	case []float32:
		add(ValFloat32, len(x), func(i int) any { return x[i] })
	case []bool:
		add(ValBool, len(x), func(i int) any { return x[i] })
	case []string:
		add(ValString, len(x), func(i int) any { return x[i] })
	case []uint64:
		add(ValUint64, len(x), func(i int) any { return x[i] })
	case []int64:
		add(ValInt64, len(x), func(i int) any { return x[i] })
	case []float64:
		add(ValFloat64, len(x), func(i int) any { return x[i] })
	default:
		return fmt.Errorf("unsupported value type %T", v)
	}
	e.u32(uint32(ValArray))
	e.u32(uint32(et))
	e.u64(uint64(len(elems)))
	for _, x := range elems {
		e.scalar(x)
	}
	return nil
}
