package safetensors

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// MaxHeaderSize is the largest JSON header, in bytes, that Open accepts. It is
// the limit of the reference implementation (huggingface/safetensors,
// MAX_HEADER_SIZE = 100,000,000) and bounds the memory an untrusted file can
// make the parser allocate: parsing allocates in proportion to the header
// bytes only, never to the shapes or offsets a header declares.
const MaxHeaderSize = 100_000_000

// metadataKey is the reserved header key holding the free-form string map.
const metadataKey = "__metadata__"

// TensorInfo describes one tensor of a file as declared by its header.
//
// Shape is row-major (C order); a 0-d tensor (a scalar) has an empty Shape
// and one element. Begin and End are byte offsets relative to the start of the
// data section (the byte after the header), End exclusive, exactly as in the
// header's "data_offsets"; End-Begin equals the element count times
// DType.Size().
type TensorInfo struct {
	Name  string
	DType DType
	Shape []int
	Begin int64
	End   int64
}

// NumElements returns the product of Shape (1 for a 0-d tensor).
func (ti TensorInfo) NumElements() int { return numElements(ti.Shape) }

// numElements multiplies dims; callers pass shapes that were checked for
// overflow (parseHeader, WriteFile) or accept wrap-around for hand-made ones.
func numElements(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

// formatErr builds an ErrFormat error naming the file and, when tensor is not
// empty, the tensor.
func formatErr(file, tensor string, format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	if tensor != "" {
		return fmt.Errorf("safetensors: %s: tensor %q: %s: %w", file, tensor, msg, ErrFormat)
	}
	return fmt.Errorf("safetensors: %s: %s: %w", file, msg, ErrFormat)
}

// header is the parsed, validated JSON header of one file.
type header struct {
	tensors  []TensorInfo // sorted by name
	metadata map[string]string
}

// parseHeader parses and validates the JSON header hdr of file, whose data
// section is dataLen bytes long. The rules are those of the safetensors
// format (huggingface/safetensors README and tensor.rs validation): the
// header is UTF-8 JSON starting with '{', optionally padded with trailing
// whitespace; keys are unique; "__metadata__" maps strings to strings; every
// other key is a tensor with exactly "dtype", "shape" and "data_offsets";
// dims are non-negative integers whose product times the dtype size neither
// overflows nor differs from End-Begin; and the tensors, sorted by offsets,
// tile the data section exactly (no gap, no overlap, nothing left over).
func parseHeader(file string, hdr []byte, dataLen int64) (*header, error) {
	if !utf8.Valid(hdr) {
		return nil, formatErr(file, "", "header is not valid UTF-8")
	}
	if len(hdr) == 0 || hdr[0] != '{' {
		return nil, formatErr(file, "", "header does not start with '{'")
	}
	h := &header{}
	err := forEachMember(hdr, func(key string, val json.RawMessage) error {
		if key == metadataKey {
			m, err := parseMetadata(val)
			if err != nil {
				return formatErr(file, "", "%s: %v", metadataKey, err)
			}
			h.metadata = m
			return nil
		}
		ti, err := parseTensorEntry(key, val)
		if err != nil {
			return formatErr(file, key, "%v", err)
		}
		h.tensors = append(h.tensors, ti)
		return nil
	})
	if err != nil {
		if errors.Is(err, ErrFormat) {
			return nil, err
		}
		return nil, formatErr(file, "", "invalid JSON header: %v", err)
	}
	if h.metadata == nil {
		h.metadata = map[string]string{}
	}
	slices.SortFunc(h.tensors, func(a, b TensorInfo) int { return strings.Compare(a.Name, b.Name) })

	// Per-tensor checks, in name order so the first error is deterministic.
	for _, ti := range h.tensors {
		if ti.End > dataLen {
			return nil, formatErr(file, ti.Name, "data_offsets [%d,%d) end past the data section of %d bytes", ti.Begin, ti.End, dataLen)
		}
	}

	// Tiling: sorted by (Begin, End) the ranges must follow one another.
	order := make([]int, len(h.tensors))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int {
		ta, tb := &h.tensors[a], &h.tensors[b]
		if ta.Begin != tb.Begin {
			return cmpInt64(ta.Begin, tb.Begin)
		}
		if ta.End != tb.End {
			return cmpInt64(ta.End, tb.End)
		}
		return strings.Compare(ta.Name, tb.Name)
	})
	var pos int64
	prev := ""
	for _, i := range order {
		ti := &h.tensors[i]
		switch {
		case ti.Begin > pos:
			return nil, formatErr(file, ti.Name, "data_offsets [%d,%d) leave a gap: the data before it ends at %d", ti.Begin, ti.End, pos)
		case ti.Begin < pos:
			return nil, formatErr(file, ti.Name, "data_offsets [%d,%d) overlap tensor %q, which ends at %d", ti.Begin, ti.End, prev, pos)
		}
		pos = ti.End
		prev = ti.Name
	}
	if pos != dataLen {
		return nil, formatErr(file, "", "tensors cover %d bytes but the data section has %d (trailing bytes not indexed)", pos, dataLen)
	}
	return h, nil
}

func cmpInt64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// parseMetadata decodes the "__metadata__" object, whose values must all be
// JSON strings.
func parseMetadata(val json.RawMessage) (map[string]string, error) {
	m := map[string]string{}
	err := forEachMember(val, func(key string, v json.RawMessage) error {
		if len(v) == 0 || v[0] != '"' {
			return fmt.Errorf("value of %q is %s, want a JSON string", key, abbrev(v))
		}
		var s string
		if err := json.Unmarshal(v, &s); err != nil {
			return fmt.Errorf("value of %q: %v", key, err)
		}
		m[key] = s
		return nil
	})
	return m, err
}

// parseTensorEntry decodes and checks one tensor entry on its own (dtype,
// dims, offsets, byte length); tiling is checked by parseHeader.
func parseTensorEntry(name string, val json.RawMessage) (TensorInfo, error) {
	ti := TensorInfo{Name: name}
	var haveDType, haveShape, haveOffsets bool
	var offs []int64
	err := forEachMember(val, func(key string, v json.RawMessage) error {
		switch key {
		case "dtype":
			if len(v) == 0 || v[0] != '"' {
				return fmt.Errorf("dtype is %s, want a JSON string", abbrev(v))
			}
			var s string
			if err := json.Unmarshal(v, &s); err != nil {
				return fmt.Errorf("dtype: %v", err)
			}
			ti.DType = DType(s)
			haveDType = true
		case "shape":
			dims, err := intArray(v)
			if err != nil {
				return fmt.Errorf("shape: %v", err)
			}
			ti.Shape = make([]int, len(dims))
			for i, d := range dims {
				if d < 0 {
					return fmt.Errorf("shape %v: dim %d is negative", dims, i)
				}
				if d > math.MaxInt {
					return fmt.Errorf("shape %v: dim %d does not fit in int", dims, i)
				}
				ti.Shape[i] = int(d)
			}
			haveShape = true
		case "data_offsets":
			o, err := intArray(v)
			if err != nil {
				return fmt.Errorf("data_offsets: %v", err)
			}
			offs = o
			haveOffsets = true
		default:
			return fmt.Errorf("unexpected key %q (want only dtype, shape, data_offsets)", key)
		}
		return nil
	})
	if err != nil {
		return ti, err
	}
	switch {
	case !haveDType:
		return ti, errors.New(`missing "dtype"`)
	case !haveShape:
		return ti, errors.New(`missing "shape"`)
	case !haveOffsets:
		return ti, errors.New(`missing "data_offsets"`)
	}
	size := ti.DType.Size()
	if size == 0 {
		return ti, fmt.Errorf("unknown dtype %q", string(ti.DType))
	}
	if len(offs) != 2 {
		return ti, fmt.Errorf("data_offsets has %d values, want 2", len(offs))
	}
	ti.Begin, ti.End = offs[0], offs[1]
	if ti.Begin < 0 || ti.End < ti.Begin {
		return ti, fmt.Errorf("data_offsets [%d,%d) out of order", ti.Begin, ti.End)
	}
	nbytes, ok := byteLen(ti.Shape, size)
	if !ok {
		return ti, fmt.Errorf("%s %v: byte length overflows int64", ti.DType, ti.Shape)
	}
	if nbytes != ti.End-ti.Begin {
		return ti, fmt.Errorf("data_offsets [%d,%d) hold %d bytes but %s %v needs %d", ti.Begin, ti.End, ti.End-ti.Begin, ti.DType, ti.Shape, nbytes)
	}
	return ti, nil
}

// byteLen returns prod(shape)*size, or ok=false when it overflows int (and so
// int64 on 64-bit hosts) or a dim is negative. A zero dim makes the product 0
// whatever the other dims are.
func byteLen(shape []int, size int) (int64, bool) {
	n := 1
	for _, d := range shape {
		if d < 0 {
			return 0, false
		}
		if d == 0 {
			return 0, true
		}
	}
	for _, d := range shape {
		if n > math.MaxInt/d {
			return 0, false
		}
		n *= d
	}
	if n > math.MaxInt/size {
		return 0, false
	}
	return int64(n * size), true
}

// intArray decodes a JSON array of integer literals (no strings, fractions or
// exponents) into int64s.
func intArray(v json.RawMessage) ([]int64, error) {
	if len(v) == 0 || v[0] != '[' {
		return nil, fmt.Errorf("%s is not a JSON array", abbrev(v))
	}
	var raw []json.RawMessage
	if err := json.Unmarshal(v, &raw); err != nil {
		return nil, err
	}
	out := make([]int64, len(raw))
	for i, r := range raw {
		n, err := strconv.ParseInt(string(r), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("element %d is %s, want an integer", i, abbrev(r))
		}
		out[i] = n
	}
	return out, nil
}

// forEachMember walks the JSON object raw, calling fn for each member in
// order. It rejects non-objects, duplicate keys (the safetensors format
// disallows them; encoding/json would silently keep the last) and trailing
// non-whitespace after the closing brace.
func forEachMember(raw []byte, fn func(key string, val json.RawMessage) error) error {
	err := walkMembers(raw, fn)
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

func walkMembers(raw []byte, fn func(key string, val json.RawMessage) error) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return fmt.Errorf("%s is not a JSON object", abbrev(raw))
	}
	seen := map[string]struct{}{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		key, ok := tok.(string)
		if !ok {
			return fmt.Errorf("object key %v is not a string", tok)
		}
		if _, dup := seen[key]; dup {
			return fmt.Errorf("duplicate key %q", key)
		}
		seen[key] = struct{}{}
		var val json.RawMessage
		if err := dec.Decode(&val); err != nil {
			return err
		}
		if err := fn(key, val); err != nil {
			return err
		}
	}
	if _, err := dec.Token(); err != nil { // the closing '}'
		return err
	}
	rest := raw[dec.InputOffset():]
	if len(bytes.TrimLeft(rest, " \t\r\n")) != 0 {
		return fmt.Errorf("unexpected data after the JSON object: %s", abbrev(rest))
	}
	return nil
}

// abbrev quotes at most 40 bytes of b for error messages.
func abbrev(b []byte) string {
	const max = 40
	if len(b) > max {
		return strconv.Quote(string(b[:max])) + "..."
	}
	return strconv.Quote(string(b))
}
