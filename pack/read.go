package pack

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"

	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/internal/fsx"
	"github.com/pierrec/lz4/v4"
)

// Reader is an opened artifact backed by a read-only memory map. Safe for
// concurrent use except Close; views from Section must not be used after
// Close.
type Reader struct {
	path     string
	mem      []byte
	unmap    func() error // nil when mem is not a mapping
	l        *layout
	manifest *Manifest
	storage  map[string]storageRef // quantized weights' storage tensors
	used     consumption
}

// Open memory-maps the artifact at path and validates its header (magic,
// version, header CRC-32C, file size), section table (CRC-32C, bounds,
// 64-byte alignment, no overlap, known codecs), manifest (CRC-32C, strict
// JSON) and the agreement of manifest and sections. It does not read
// section bytes; Verify does.
//
// Errors (wrapped, naming path and the section or field): os errors;
// ErrFormat; ErrVersion; ErrChecksum (header, table or manifest);
// ErrMismatch.
func Open(path string) (*Reader, error) {
	// Refuse a FIFO or device before opening it: open(2) on a FIFO blocks
	// until a writer appears, and a device reads without end.
	if err := fsx.CheckRegular(path); err != nil {
		return nil, fmt.Errorf("pack: %w", err)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("pack: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("pack: %w", err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmtErr(path, "not a regular file")
	}
	if st.Size() < HeaderSize {
		return nil, fmtErr(path, "file is %d bytes, shorter than the %d-byte header (truncated?)", st.Size(), HeaderSize)
	}
	mem, unmap, err := fsx.Map(f, st.Size())
	if err != nil {
		return nil, fmt.Errorf("pack: %s: %w", path, err)
	}
	r, errs := parse(path, mem)
	if len(errs) > 0 {
		unmap()
		return nil, errs[0]
	}
	r.unmap = unmap
	return r, nil
}

// parse validates layout and manifest; a non-nil Reader with errors means
// the structure parsed but manifest and sections disagree.
func parse(path string, mem []byte) (*Reader, []error) {
	l, err := parseLayout(path, mem)
	if err != nil {
		return nil, []error{err}
	}
	man := mem[l.manifestOff : l.manifestOff+l.manifestLen]
	if got := crc(man); got != l.manifestCRC {
		return nil, []error{fmt.Errorf("pack: %s: manifest CRC-32C %08x, stored %08x: %w", path, got, l.manifestCRC, ErrChecksum)}
	}
	m, err := decodeManifest(path, man)
	if err != nil {
		return nil, []error{err}
	}
	if uint32(m.FormatVersion) != l.version {
		return nil, []error{fmt.Errorf("pack: %s: manifest format_version %d, header says %d: %w", path, m.FormatVersion, l.version, ErrVersion)}
	}
	r := &Reader{path: path, mem: mem, l: l, manifest: m}
	r.storage, _ = storageIndex(m) // errors reported by agreement
	var errs []error
	for _, e := range agreement(m, l) {
		errs = append(errs, fmt.Errorf("pack: %s: %w", path, e))
	}
	return r, errs
}

// agreement lists every disagreement between manifest and sections: a
// referenced section missing, a tensor of an unknown dtype (ErrFormat) or
// whose raw size is not dtype×shape
// (for a quantized tensor: each storage section's size, see storage), an
// invalid quantized entry, a section two tensors claim, a section nothing
// refers to.
func agreement(m *Manifest, l *layout) []error {
	var errs []error
	used := map[string]bool{}
	need := func(what, sec string) (entry, bool) {
		i, ok := l.index[sec]
		if !ok {
			errs = append(errs, fmt.Errorf("%s names section %q, which is missing: %w", what, sec, ErrMismatch))
			return entry{}, false
		}
		used[sec] = true
		return l.entries[i], true
	}
	owner := map[string]string{}
	sized := func(name, sec string, dtype safetensors.DType, shape []int) {
		if o, dup := owner[sec]; dup {
			errs = append(errs, fmt.Errorf("tensor %q: section %q is also tensor %q's: %w", name, sec, o, ErrMismatch))
			return
		}
		owner[sec] = name
		e, ok := need(fmt.Sprintf("tensor %q", name), sec)
		if !ok {
			return
		}
		if !dtype.Valid() {
			errs = append(errs, fmt.Errorf("tensor %q: unknown dtype %q (want a safetensors dtype: F64, F32, F16, BF16, F8_E4M3, F8_E5M2, I64, I32, I16, I8, U64, U32, U16, U8 or BOOL): %w", name, string(dtype), ErrFormat))
			return
		}
		n, good := numelU(shape)
		size := uint64(dtype.Size())
		if !good || size == 0 || n > (1<<62)/size || n*size != e.Raw {
			errs = append(errs, fmt.Errorf("tensor %q: dtype %s shape %v does not match section %q of %d bytes: %w",
				name, dtype, shape, sec, e.Raw, ErrMismatch))
		}
	}
	if _, err := storageIndex(m); err != nil {
		errs = append(errs, err)
	}
	for i := range m.Tensors {
		t := &m.Tensors[i]
		if t.Quant == nil {
			sized(t.Name, t.Section, safetensors.DType(t.DType), t.Shape)
			continue
		}
		if checkQuant(t) != nil {
			continue // reported by storageIndex
		}
		st := storage(t)
		for _, n := range slices.Sorted(maps.Keys(st)) {
			sized(n, st[n].section, st[n].dtype, st[n].shape)
		}
	}
	files, fileSec := map[string]bool{}, map[string]string{}
	for _, f := range m.Files {
		what := fmt.Sprintf("file %q", f.Name)
		switch {
		case f.Name == "" || f.Name == "." || f.Name == ".." || strings.ContainsAny(f.Name, `/\`):
			errs = append(errs, fmt.Errorf("%s: want a plain file name such as config.json (no directories): %w", what, ErrMismatch))
		case files[f.Name]:
			errs = append(errs, fmt.Errorf("%s is listed twice in the manifest (a loader would read one of them): %w", what, ErrMismatch))
		}
		files[f.Name] = true
		if o, dup := owner[f.Section]; dup {
			errs = append(errs, fmt.Errorf("%s: section %q is also tensor %q's: %w", what, f.Section, o, ErrMismatch))
			continue
		}
		if o, dup := fileSec[f.Section]; dup {
			errs = append(errs, fmt.Errorf("%s: section %q is also file %q's: %w", what, f.Section, o, ErrMismatch))
			continue
		}
		fileSec[f.Section] = f.Name
		need(what, f.Section)
	}
	if m.Tokenizer != "" {
		need("tokenizer", m.Tokenizer)
	}
	if m.KV != nil {
		for _, r := range m.KV.Rotations {
			need(fmt.Sprintf("kv rotation of layer %d", r.Layer), r.K)
			need(fmt.Sprintf("kv rotation of layer %d", r.Layer), r.V)
		}
	}
	for _, e := range l.entries {
		if !used[e.Name] {
			errs = append(errs, fmt.Errorf("section %q is not named by the manifest: %w", e.Name, ErrMismatch))
		}
	}
	return errs
}

// ArtifactInfo is what inspect reports for an artifact: its format
// version, weight-quantization method ("" for float weights) and KV cache
// method (Info gives "" for the float32 cache, which lmpack inspect
// reports as "fp32") with its fp16 windows in tokens (0: none, or the
// method's default).
type ArtifactInfo struct {
	FormatVersion int    `json:"format_version"`
	WeightsMethod string `json:"weights_method,omitempty"`
	KVCache       string `json:"kv_cache"`
	KVSink        int    `json:"kv_sink,omitempty"`
	KVRecent      int    `json:"kv_recent,omitempty"`
}

// Info returns the manifest's format version, weights method and KV
// scheme (cache method, "" for none, and windows) as recorded, not
// validated (KVCache validates the scheme).
func (r *Reader) Info() ArtifactInfo {
	m := r.manifest
	i := ArtifactInfo{FormatVersion: m.FormatVersion, WeightsMethod: m.WeightsMethod}
	if m.KV != nil {
		i.KVCache, i.KVSink, i.KVRecent = m.KV.Cache, m.KV.Sink, m.KV.Recent
	}
	return i
}

// Manifest returns the parsed manifest (shared; do not modify).
func (r *Reader) Manifest() *Manifest { return r.manifest }

// Names returns the section names, sorted.
func (r *Reader) Names() []string {
	out := make([]string, len(r.l.entries))
	for i, e := range r.l.entries {
		out[i] = e.Name
	}
	return out
}

// SectionInfo returns a section's codec and raw and stored sizes in bytes.
func (r *Reader) SectionInfo(name string) (codec Codec, raw, stored int64, err error) {
	i, ok := r.l.index[name]
	if !ok {
		return 0, 0, 0, fmt.Errorf("pack: %s: section %q: %w", r.path, name, ErrNoSection)
	}
	e := r.l.entries[i]
	return e.Codec, int64(e.Raw), int64(e.Stored), nil
}

// Section returns the raw bytes of the named section: a zero-copy view of
// the map for CodecNone (read-only: writing to it faults), a new slice
// for lz4 codecs. It does not check the CRC (Verify does).
//
// Errors: ErrNoSection; ErrFormat when lz4 data does not decode to the
// recorded raw size.
func (r *Reader) Section(name string) ([]byte, error) {
	i, ok := r.l.index[name]
	if !ok {
		return nil, fmt.Errorf("pack: %s: section %q: %w", r.path, name, ErrNoSection)
	}
	return r.decode(r.l.entries[i])
}

func (r *Reader) decode(e entry) ([]byte, error) {
	stored := r.mem[e.Offset : e.Offset+e.Stored : e.Offset+e.Stored]
	if e.Codec == CodecNone {
		return stored, nil
	}
	out := make([]byte, e.Raw)
	n, err := lz4.UncompressBlock(stored, out)
	if err != nil || uint64(n) != e.Raw {
		return nil, fmt.Errorf("pack: %s: section %q: lz4 decoded %d of %d bytes (%v): %w", r.path, e.Name, n, e.Raw, err, ErrFormat)
	}
	if e.Codec == CodecLZ4Planes2 {
		planes := out
		out = make([]byte, e.Raw)
		joinPlanes2(out, planes)
	}
	return out, nil
}

// Close unmaps the file.
func (r *Reader) Close() error {
	if r.unmap != nil && r.mem != nil {
		err := r.unmap()
		r.mem = nil
		if err != nil {
			return fmt.Errorf("pack: %s: %w", r.path, err)
		}
	}
	return nil
}

// Problem is one failed check of Verify; Section is empty for whole-file
// problems.
type Problem struct {
	Section string `json:"section,omitempty"`
	Error   string `json:"error"`
}

// VerifyReport is Verify's result. OK is true when Problems is empty.
// SHA256 is the hex sha256 of the file's bytes (what sha256sum prints);
// ContentSHA256 is the hash the header stores, of the file with the
// header's hash field taken as zero (docs/FORMAT.md).
type VerifyReport struct {
	Path          string    `json:"path"`
	OK            bool      `json:"ok"`
	Sections      int       `json:"sections"`
	Tensors       int       `json:"tensors"`
	Bytes         int64     `json:"file_bytes"`
	SHA256        string    `json:"sha256"`
	ContentSHA256 string    `json:"content_sha256"`
	Problems      []Problem `json:"problems"`
}

// Verify checks the artifact at path: everything Open checks, then every
// section's CRC-32C and lz4 decoding, the whole-file sha256, and what a
// loader checks of the manifest (semantics): the model description
// validates, the tensors are exactly those the model reads, the KV scheme
// builds with its rotations and clip ratios and its windows fit
// max_position_embeddings, the weights method is rtn or gptq, and every
// quantized weight's scales, zero-points and permutation are valid
// (runtime.ReadQuantized), every plain tensor the model reads is a float
// dtype, the embedded tokenizer.json (with tokenizer_config.json) loads as
// run and eval load it (Reader.Tokenizer), and that no float tensor holds NaN or ±Inf
// (each one reported with the tensor and the element's row-major index,
// ErrFormat). It
// returns a report listing every problem and, when there is one, an error
// naming the first (wrapping ErrChecksum, ErrMismatch or ErrFormat). A
// file whose header, table or manifest cannot be parsed, and a directory
// (verify takes a file), give a nil report and the error.
func Verify(path string) (*VerifyReport, error) {
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		return nil, fmt.Errorf("pack: %s is a directory; verify takes an .lmpk artifact file (lmpack pack writes one from a checkpoint directory; lmpack inspect describes a directory)", path)
	}
	mem, err := fsx.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("pack: %w", err)
	}
	r, errs := parse(path, mem)
	if r == nil {
		return nil, errs[0]
	}
	rep := &VerifyReport{Path: path, Sections: len(r.l.entries), Tensors: len(r.manifest.Tensors), Bytes: int64(len(mem))}
	// The file's own sha256 runs alongside the other checks.
	fileSum := make(chan [sha256.Size]byte, 1)
	go func() { fileSum <- sha256.Sum256(mem) }()
	var first error
	add := func(sec string, err error) {
		rep.Problems = append(rep.Problems, Problem{sec, err.Error()})
		if first == nil {
			first = err
		}
	}
	for _, e := range errs {
		add("", e)
	}
	keep := map[string]bool{} // sections semantics reads: storage tensors, embedded files
	for _, s := range r.storage {
		keep[s.section] = true
	}
	plain := map[string]*TensorEntry{} // section -> its plain (not quantized) tensor
	for i := range r.manifest.Tensors {
		if t := &r.manifest.Tensors[i]; t.Quant == nil {
			plain[t.Section] = t
		}
	}
	for _, f := range r.manifest.Files {
		keep[f.Section] = true // read by checkTokenizer
	}
	decoded := map[string][]byte{} // quantized weights' storage sections and embedded files that passed
	for _, e := range r.l.entries {
		if got := crc(mem[e.Offset : e.Offset+e.Stored]); got != e.CRC {
			add(e.Name, fmt.Errorf("pack: %s: section %q: CRC-32C %08x, stored %08x: %w", path, e.Name, got, e.CRC, ErrChecksum))
			continue
		}
		b, err := r.decode(e)
		if err != nil {
			add(e.Name, err)
			continue
		}
		if t, ok := plain[e.Name]; ok {
			if err := checkFinite(t.Name, safetensors.DType(t.DType), b); err != nil {
				add(e.Name, fmt.Errorf("pack: %s: %w", path, err))
			}
		}
		if keep[e.Name] {
			decoded[e.Name] = b
		}
	}
	if len(errs) == 0 {
		for _, e := range r.semantics(func(sec string) ([]byte, bool) { b, ok := decoded[sec]; return b, ok }) {
			if !errors.Is(e, ErrFormat) && !errors.Is(e, ErrMismatch) {
				e = fmt.Errorf("%w (%w)", e, ErrFormat)
			}
			add("", e)
		}
	}
	h := sha256.New()
	h.Write(mem[:offSHA256])
	h.Write(make([]byte, endSHA256-offSHA256))
	h.Write(mem[endSHA256:])
	rep.ContentSHA256 = hex.EncodeToString(h.Sum(nil))
	fs := <-fileSum
	rep.SHA256 = hex.EncodeToString(fs[:])
	if stored := hex.EncodeToString(r.l.sha[:]); stored != rep.ContentSHA256 {
		add("", fmt.Errorf("pack: %s: content sha256 %s, stored %s: %w", path, rep.ContentSHA256, stored, ErrChecksum))
	}
	rep.OK = len(rep.Problems) == 0
	if rep.Problems == nil {
		rep.Problems = []Problem{}
	}
	return rep, first
}
