package safetensors

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/lmpack/lmpack/internal/fsx"
)

// WriteTensor is one tensor to write with WriteFile.
//
// Shape is row-major; an empty Shape is a 0-d tensor (one element). The
// tensor's byte length is prod(Shape)×DType.Size(). Its bytes come from
// exactly one of Data (little endian, exactly the byte length) or WriteTo,
// which is called once, in name order, and must write exactly the byte
// length to w. A tensor with zero elements may give neither.
type WriteTensor struct {
	Name    string
	DType   DType
	Shape   []int
	Data    []byte
	WriteTo func(w io.Writer) error
}

// FromFloat32 returns an F32 WriteTensor named name with the given shape
// whose Data is data encoded by F32Bytes. WriteFile reports an error if
// len(data) is not prod(shape).
func FromFloat32(name string, shape []int, data []float32) WriteTensor {
	return WriteTensor{Name: name, DType: F32, Shape: slices.Clone(shape), Data: F32Bytes(data)}
}

// FromFloat32As is FromFloat32 for dtype F32, F16 or BF16: data is rounded
// to dtype with round-to-nearest-even (F16Bytes, BF16Bytes). Errors: any
// other dtype.
func FromFloat32As(name string, dtype DType, shape []int, data []float32) (WriteTensor, error) {
	wt := WriteTensor{Name: name, DType: dtype, Shape: slices.Clone(shape)}
	switch dtype {
	case F32:
		wt.Data = F32Bytes(data)
	case F16:
		wt.Data = F16Bytes(data)
	case BF16:
		wt.Data = BF16Bytes(data)
	default:
		return WriteTensor{}, fmt.Errorf("safetensors: tensor %q: cannot encode float32 values as %q (only F32, F16, BF16)", name, string(dtype))
	}
	return wt, nil
}

// WriteFile writes a safetensors file at path holding tensors and the
// "__metadata__" map metadata (omitted when empty).
//
// The output is deterministic: tensors are laid out in name order with
// offsets computed up front, and the header is compact JSON with
// "__metadata__" first (its keys sorted), then the tensors in name order,
// each as {"dtype","shape","data_offsets"}; the header is padded with spaces
// to a multiple of 8 bytes. Identical inputs give identical bytes.
//
// The write is streaming and atomic: bytes go through a buffer to a temporary
// file in path's directory, which is fsynced, closed and renamed onto path,
// then the directory is fsynced (fsx.WriteAtomic). On any error the
// temporary file is removed and path is left as it was. The file gets mode
// 0644.
//
// Errors (naming path and the tensor): a duplicate, reserved
// ("__metadata__") or non-UTF-8 name (the empty name is allowed, as the
// format allows it); an unknown dtype; a negative dim or a size that
// overflows; Data of the wrong length; both or neither of Data and WriteTo
// for a non-empty tensor; WriteTo returning an error or writing a different
// number of bytes; a header over MaxHeaderSize; any I/O error.
func WriteFile(path string, tensors []WriteTensor, metadata map[string]string) (err error) {
	hdr, order, sizes, err := buildHeader(path, tensors, metadata)
	if err != nil {
		return err
	}
	total := 8 + int64(len(hdr))
	for _, n := range sizes {
		total += n
	}
	var bodyErr error // an error of the body, already naming path
	err = fsx.WriteAtomic(path, 0o644, func(f *os.File) error {
		bodyErr = writeBody(f, path, hdr, tensors, order, sizes, total)
		return bodyErr
	})
	if err != nil && err != bodyErr {
		return fmt.Errorf("safetensors: %s: %w", path, err)
	}
	return err
}

// writeBody writes the header length, hdr and the tensors in order to f
// through a buffer and checks that f holds total bytes.
func writeBody(f *os.File, path string, hdr []byte, tensors []WriteTensor, order []int, sizes []int64, total int64) error {
	bw := bufio.NewWriterSize(f, 1<<20)
	var lenBuf [8]byte
	binary.LittleEndian.PutUint64(lenBuf[:], uint64(len(hdr)))
	if _, err := bw.Write(lenBuf[:]); err != nil {
		return fmt.Errorf("safetensors: %s: %w", path, err)
	}
	if _, err := bw.Write(hdr); err != nil {
		return fmt.Errorf("safetensors: %s: %w", path, err)
	}
	for k, i := range order {
		t := &tensors[i]
		want := sizes[k]
		if t.WriteTo == nil {
			if _, err := bw.Write(t.Data); err != nil {
				return fmt.Errorf("safetensors: %s: tensor %q: %w", path, t.Name, err)
			}
			continue
		}
		lw := &limitedWriter{w: bw, left: want}
		err := t.WriteTo(lw)
		if lw.over {
			return fmt.Errorf("safetensors: %s: tensor %q: WriteTo wrote more than the %d bytes of %s %v", path, t.Name, want, t.DType, t.Shape)
		}
		if err != nil {
			return fmt.Errorf("safetensors: %s: tensor %q: writing data: %w", path, t.Name, err)
		}
		if lw.left != 0 {
			return fmt.Errorf("safetensors: %s: tensor %q: WriteTo wrote %d bytes, want %d for %s %v", path, t.Name, want-lw.left, want, t.DType, t.Shape)
		}
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("safetensors: %s: %w", path, err)
	}
	if st, err := f.Stat(); err != nil {
		return fmt.Errorf("safetensors: %s: %w", path, err)
	} else if st.Size() != total {
		return fmt.Errorf("safetensors: %s: wrote %d bytes, want %d", path, st.Size(), total)
	}
	return nil
}

// limitedWriter passes at most left bytes on to w and records any excess.
type limitedWriter struct {
	w    io.Writer
	left int64
	over bool
}

var errTooMuch = errors.New("more bytes than the tensor's size")

func (l *limitedWriter) Write(p []byte) (int, error) {
	if int64(len(p)) > l.left {
		l.over = true
		return 0, errTooMuch
	}
	n, err := l.w.Write(p)
	l.left -= int64(n)
	return n, err
}

// buildHeader validates tensors and returns the padded header bytes, the
// indices of tensors in name order, and each one's byte length (in that
// order).
func buildHeader(path string, tensors []WriteTensor, metadata map[string]string) ([]byte, []int, []int64, error) {
	order := make([]int, len(tensors))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return strings.Compare(tensors[a].Name, tensors[b].Name) })

	var buf bytes.Buffer
	buf.WriteByte('{')
	first := true
	if len(metadata) > 0 {
		keys := make([]string, 0, len(metadata))
		for k := range metadata {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			if !utf8.ValidString(k) || !utf8.ValidString(metadata[k]) {
				return nil, nil, nil, fmt.Errorf("safetensors: %s: metadata key %q: key or value is not valid UTF-8", path, k)
			}
		}
		buf.WriteString(`"__metadata__":{`)
		for i, k := range keys {
			if i > 0 {
				buf.WriteByte(',')
			}
			writeJSONString(&buf, k)
			buf.WriteByte(':')
			writeJSONString(&buf, metadata[k])
		}
		buf.WriteByte('}')
		first = false
	}
	sizes := make([]int64, len(order))
	var off int64
	for k, i := range order {
		t := &tensors[i]
		if !utf8.ValidString(t.Name) {
			return nil, nil, nil, fmt.Errorf("safetensors: %s: tensor %q: name is not valid UTF-8", path, t.Name)
		}
		if t.Name == metadataKey {
			return nil, nil, nil, fmt.Errorf("safetensors: %s: tensor %q: the name is reserved for metadata", path, t.Name)
		}
		if k > 0 && tensors[order[k-1]].Name == t.Name {
			return nil, nil, nil, fmt.Errorf("safetensors: %s: tensor %q: duplicate name", path, t.Name)
		}
		size := t.DType.Size()
		if size == 0 {
			return nil, nil, nil, fmt.Errorf("safetensors: %s: tensor %q: unknown dtype %q", path, t.Name, string(t.DType))
		}
		nb, ok := byteLen(t.Shape, size)
		if !ok {
			return nil, nil, nil, fmt.Errorf("safetensors: %s: tensor %q: shape %v has a negative dim or its size overflows", path, t.Name, t.Shape)
		}
		switch {
		case t.Data != nil && t.WriteTo != nil:
			return nil, nil, nil, fmt.Errorf("safetensors: %s: tensor %q: both Data and WriteTo are set", path, t.Name)
		case t.WriteTo == nil && int64(len(t.Data)) != nb:
			return nil, nil, nil, fmt.Errorf("safetensors: %s: tensor %q: Data has %d bytes, want %d for %s %v", path, t.Name, len(t.Data), nb, t.DType, t.Shape)
		}
		if nb > math.MaxInt64-(MaxHeaderSize+8)-off {
			return nil, nil, nil, fmt.Errorf("safetensors: %s: tensor %q: total data size overflows int64", path, t.Name)
		}
		sizes[k] = nb
		if !first {
			buf.WriteByte(',')
		}
		first = false
		writeJSONString(&buf, t.Name)
		buf.WriteString(`:{"dtype":`)
		writeJSONString(&buf, string(t.DType))
		buf.WriteString(`,"shape":[`)
		for j, d := range t.Shape {
			if j > 0 {
				buf.WriteByte(',')
			}
			buf.WriteString(strconv.Itoa(d))
		}
		buf.WriteString(`],"data_offsets":[`)
		buf.WriteString(strconv.FormatInt(off, 10))
		buf.WriteByte(',')
		buf.WriteString(strconv.FormatInt(off+nb, 10))
		buf.WriteString(`]}`)
		off += nb
	}
	buf.WriteByte('}')
	for buf.Len()%8 != 0 {
		buf.WriteByte(' ')
	}
	if buf.Len() > MaxHeaderSize {
		return nil, nil, nil, fmt.Errorf("safetensors: %s: header of %d bytes exceeds the limit of %d", path, buf.Len(), MaxHeaderSize)
	}
	return buf.Bytes(), order, sizes, nil
}

// writeJSONString writes s as a JSON string without HTML escaping.
func writeJSONString(buf *bytes.Buffer, s string) {
	enc := json.NewEncoder(buf)
	enc.SetEscapeHTML(false)
	enc.Encode(s)               // cannot fail for a string
	buf.Truncate(buf.Len() - 1) // drop the newline Encode appends
}
