package safetensors

import (
	"encoding/binary"
	"fmt"
	"os"
	"slices"

	"github.com/lmpack/lmpack/internal/fsx"
)

// File is one opened .safetensors file. Open parses and validates only the
// header; tensor bytes are read lazily from a read-only memory map when a
// Tensor's Data is touched. A File is safe for concurrent use by multiple
// goroutines, except Close, which must not run concurrently with other methods.
// As with any memory map, truncating the file on disk while it is open makes
// later reads of tensor data fault (SIGBUS); lmpack never rewrites a file in
// place (WriteFile renames a new file over the old one, which is safe).
type File struct {
	path      string
	mem       []byte // the whole file
	release   func() error
	dataStart int64 // offset of the data section in mem: 8 + header length
	tensors   []TensorInfo
	index     map[string]int
	metadata  map[string]string
	closed    bool
}

// Open memory-maps the safetensors file at path (read-only; on platforms
// without mmap it reads the file into memory) and parses and validates its
// header (the rules listed in the package doc: header length at most
// MaxHeaderSize and within the file, UTF-8 JSON object without duplicate
// keys, known dtypes, non-negative dims, byte lengths matching dtype×shape,
// offsets that tile the data section exactly).
//
// Errors: os errors from opening/stating/mapping the file, wrapped with the
// path; ErrFormat (wrapped, naming the path and the offending tensor) for a
// malformed file. The caller must Close the File; tensors obtained from it
// must not be used after Close.
func Open(path string) (*File, error) {
	// Refuse FIFOs and devices before opening: opening a FIFO blocks.
	if st, err := os.Stat(path); err == nil && !st.Mode().IsRegular() {
		return nil, formatErr(path, "", "not a regular file")
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	if !st.Mode().IsRegular() {
		return nil, formatErr(path, "", "not a regular file")
	}
	size := st.Size()
	// Check the 8-byte header length before mapping anything.
	var lenBuf [8]byte
	if size < 8 {
		return nil, formatErr(path, "", "file is %d bytes, shorter than the 8-byte header length", size)
	}
	if _, err := f.ReadAt(lenBuf[:], 0); err != nil {
		return nil, fmt.Errorf("safetensors: %s: reading header length: %w", path, err)
	}
	if err := checkHeaderLen(path, binary.LittleEndian.Uint64(lenBuf[:]), size); err != nil {
		return nil, err
	}
	mem, release, err := fsx.Map(f, size)
	if err != nil {
		return nil, fmt.Errorf("safetensors: %s: %w", path, err)
	}
	sf, err := parseFile(path, mem)
	if err != nil {
		release()
		return nil, err
	}
	sf.release = release
	return sf, nil
}

// FromBytes parses b, the complete bytes of a safetensors file, with the same
// validation as Open; name is used in error messages and returned by Path.
// The File refers to b without copying it, so b must not be modified while
// the File or its tensors are in use. Close is a no-op apart from marking the
// File closed. Errors: ErrFormat (wrapped) for malformed data.
func FromBytes(name string, b []byte) (*File, error) {
	return parseFile(name, b)
}

// checkHeaderLen validates the declared header length n against the file
// size. A length beyond MaxHeaderSize is no safetensors file's (a text or
// other file read as one), and the message says so.
func checkHeaderLen(path string, n uint64, size int64) error {
	if n > MaxHeaderSize {
		return formatErr(path, "", "not a safetensors file: header length %d exceeds the limit of %d bytes (a safetensors file starts with its JSON header's length as a little-endian uint64; the first 8 bytes here are not one)", n, MaxHeaderSize)
	}
	if int64(n) > size-8 {
		return formatErr(path, "", "header length %d runs past the end of the file (%d bytes after the length field)", n, size-8)
	}
	return nil
}

// parseFile validates mem as a whole safetensors file.
func parseFile(path string, mem []byte) (*File, error) {
	size := int64(len(mem))
	if size < 8 {
		return nil, formatErr(path, "", "file is %d bytes, shorter than the 8-byte header length", size)
	}
	n := binary.LittleEndian.Uint64(mem)
	if err := checkHeaderLen(path, n, size); err != nil {
		return nil, err
	}
	dataStart := 8 + int64(n)
	h, err := parseHeader(path, mem[8:dataStart], size-dataStart)
	if err != nil {
		return nil, err
	}
	sf := &File{
		path:      path,
		mem:       mem,
		dataStart: dataStart,
		tensors:   h.tensors,
		index:     make(map[string]int, len(h.tensors)),
		metadata:  h.metadata,
	}
	for i, ti := range h.tensors {
		sf.index[ti.Name] = i
	}
	return sf, nil
}

// Path returns the path the File was opened with.
func (f *File) Path() string { return f.path }

// Tensors returns the header entries of all tensors, sorted by name. The
// slice and its Shapes are copies the caller may modify.
func (f *File) Tensors() []TensorInfo {
	out := make([]TensorInfo, len(f.tensors))
	for i, ti := range f.tensors {
		ti.Shape = slices.Clone(ti.Shape)
		if ti.Shape == nil {
			ti.Shape = []int{}
		}
		out[i] = ti
	}
	return out
}

// Info returns the header entry of the named tensor. Errors: ErrMissingTensor
// (wrapped, naming the file and tensor).
func (f *File) Info(name string) (TensorInfo, error) {
	i, ok := f.index[name]
	if !ok {
		return TensorInfo{}, fmt.Errorf("safetensors: %s: tensor %q: %w", f.path, name, ErrMissingTensor)
	}
	ti := f.tensors[i]
	ti.Shape = slices.Clone(ti.Shape)
	return ti, nil
}

// Metadata returns a copy of the header's "__metadata__" string map (empty,
// not nil, when the header has none).
func (f *File) Metadata() map[string]string {
	m := make(map[string]string, len(f.metadata))
	for k, v := range f.metadata {
		m[k] = v
	}
	return m
}

// Tensor returns a zero-copy view of the named tensor: its Data slices the
// File's read-only mapping (writing to it faults) and is valid until Close.
// Errors: ErrMissingTensor (wrapped, naming the file and tensor); ErrClosed
// after Close.
func (f *File) Tensor(name string) (*Tensor, error) {
	if f.closed {
		return nil, fmt.Errorf("safetensors: %s: tensor %q: %w", f.path, name, ErrClosed)
	}
	i, ok := f.index[name]
	if !ok {
		return nil, fmt.Errorf("safetensors: %s: tensor %q: %w", f.path, name, ErrMissingTensor)
	}
	ti := &f.tensors[i]
	lo, hi := f.dataStart+ti.Begin, f.dataStart+ti.End
	shape := slices.Clone(ti.Shape)
	if shape == nil {
		shape = []int{}
	}
	return &Tensor{
		Name:  ti.Name,
		File:  f.path,
		DType: ti.DType,
		Shape: shape,
		Data:  f.mem[lo:hi:hi],
	}, nil
}

// Close unmaps the file. Tensors obtained from f must not be used afterwards.
// Closing twice is a no-op. Errors: the munmap error, wrapped with the path.
func (f *File) Close() error {
	if f.closed {
		return nil
	}
	f.closed = true
	var err error
	if f.release != nil {
		if e := f.release(); e != nil {
			err = fmt.Errorf("safetensors: %s: %w", f.path, e)
		}
	}
	f.mem = nil
	f.release = nil
	return err
}
