package pack

import (
	"bufio"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"sort"

	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/internal/fsx"
	"github.com/pierrec/lz4/v4"
)

// Artifact is what Write stores: a manifest and the raw bytes of every
// section it refers to.
type Artifact struct {
	Manifest Manifest
	// Sections in any order; Write sorts them by name.
	Sections []Section
	// closers release inputs (a checkpoint's memory maps) held by views in
	// Sections; see Close.
	closers []func() error
}

// Section is one named byte range. ElemSize is the tensor element size in
// bytes (2 for BF16/F16 makes Write try the byte-plane codec; 0 or 1 for
// files).
type Section struct {
	Name     string
	ElemSize int
	Data     []byte
}

// Close releases inputs the Artifact's sections view (FromCheckpoint keeps
// the checkpoint mapped). Sections must not be used after Close.
func (a *Artifact) Close() error {
	var first error
	for _, c := range a.closers {
		if err := c(); err != nil && first == nil {
			first = err
		}
	}
	a.closers = nil
	return first
}

// WriteOptions control Write.
type WriteOptions struct {
	// NoCompress stores every section raw (CodecNone).
	NoCompress bool
	// MinSaving is the fraction of a section's raw size that a codec must
	// save to be kept (stored ≤ (1−MinSaving)·raw); 0 means
	// DefaultMinSaving.
	MinSaving float64
}

// DefaultMinSaving: lz4 is kept only where it saves at least 10%.
const DefaultMinSaving = 0.10

// SectionStat is one section's storage: sizes in bytes.
type SectionStat struct {
	Name   string `json:"name"`
	DType  string `json:"dtype"`
	Codec  string `json:"codec"`
	Raw    int64  `json:"raw_bytes"`
	Stored int64  `json:"stored_bytes"`
}

// DTypeStat sums SectionStat over sections of one dtype ("file" for
// embedded files). Compressed counts sections stored with a codec.
type DTypeStat struct {
	DType      string  `json:"dtype"`
	Sections   int     `json:"sections"`
	Compressed int     `json:"compressed"`
	Raw        int64   `json:"raw_bytes"`
	Stored     int64   `json:"stored_bytes"`
	Ratio      float64 `json:"ratio"`
}

// Stats describes a written artifact. SHA256 is the hex sha256 of the
// file's bytes (what sha256sum prints); ContentSHA256 is the hash stored
// in the header (the file with the header's hash field taken as zero,
// docs/FORMAT.md).
type Stats struct {
	Path          string        `json:"path"`
	FileSize      int64         `json:"file_bytes"`
	SHA256        string        `json:"sha256"`
	ContentSHA256 string        `json:"content_sha256"`
	Raw           int64         `json:"raw_bytes"`
	Stored        int64         `json:"stored_bytes"`
	ByDType       []DTypeStat   `json:"by_dtype"`
	Sections      []SectionStat `json:"sections"`
}

type encoded struct {
	entry
	dtype string
	data  []byte
}

// encodeSection chooses the smallest of raw, lz4 and (2-byte elements)
// lz4 of byte planes, keeping a codec only when it saves minSaving.
func encodeSection(s Section, noCompress bool, minSaving float64) (Codec, []byte, error) {
	raw := s.Data
	if noCompress || len(raw) == 0 {
		return CodecNone, raw, nil
	}
	limit := int(float64(len(raw)) * (1 - minSaving))
	best, bestData := CodecNone, raw
	try := func(c Codec, src []byte) error {
		dst := make([]byte, lz4.CompressBlockBound(len(src)))
		var comp lz4.Compressor
		n, err := comp.CompressBlock(src, dst)
		if err != nil {
			return fmt.Errorf("pack: section %q: lz4: %w", s.Name, err)
		}
		if n > 0 && n <= limit && n < len(bestData) {
			best, bestData = c, dst[:n:n]
		}
		return nil
	}
	if err := try(CodecLZ4, raw); err != nil {
		return 0, nil, err
	}
	if s.ElemSize == 2 && len(raw)%2 == 0 {
		planes := make([]byte, len(raw))
		splitPlanes2(planes, raw)
		if err := try(CodecLZ4Planes2, planes); err != nil {
			return 0, nil, err
		}
	}
	return best, bestData, nil
}

// Write stores a at path: deterministically (same Artifact and options,
// same bytes) and atomically (a temporary file in path's directory,
// synced, renamed over path, the directory synced: fsx.WriteAtomic). It sets a.Manifest.FormatVersion to
// the lowest version that describes the artifact: MinFormatVersion, or
// QuantFormatVersion when a tensor is quantized.
//
// Errors: ErrMismatch (wrapped, naming the tensor or section) when the
// manifest and sections disagree or section names repeat; ErrFormat when
// a float tensor (any plain manifest tensor, KV rotations included) holds
// NaN or ±Inf, naming the tensor and the element's row-major index (the
// runtime would refuse to load it; quantized weights' scales are checked
// by FromCheckpoint); lz4 and os errors wrapped with the path.
func Write(path string, a *Artifact, opt WriteOptions) (*Stats, error) {
	minSaving := opt.MinSaving
	if minSaving == 0 {
		minSaving = DefaultMinSaving
	}
	if minSaving < 0 || minSaving >= 1 {
		return nil, fmt.Errorf("pack: %s: MinSaving %v: want in [0, 1)", path, minSaving)
	}
	a.Manifest.FormatVersion = MinFormatVersion
	if quantization(&a.Manifest) != nil || a.Manifest.WeightsMethod != "" {
		a.Manifest.FormatVersion = QuantFormatVersion
	}
	secs := slices.Clone(a.Sections)
	sort.Slice(secs, func(i, j int) bool { return secs[i].Name < secs[j].Name })
	dtypes := sectionDTypes(&a.Manifest)
	plain := map[string]string{} // section -> its plain (not quantized) tensor
	for _, t := range a.Manifest.Tensors {
		if t.Quant == nil {
			plain[t.Section] = t.Name
		}
	}
	encs := make([]encoded, len(secs))
	off := uint64(HeaderSize)
	for i, s := range secs {
		if s.Name == "" || (i > 0 && s.Name == secs[i-1].Name) {
			return nil, fmt.Errorf("pack: %s: section name %q empty or repeated: %w", path, s.Name, ErrMismatch)
		}
		if name, ok := plain[s.Name]; ok {
			if err := checkFinite(name, safetensors.DType(dtypes[s.Name]), s.Data); err != nil {
				return nil, fmt.Errorf("pack: %s: %w", path, err)
			}
		}
		c, data, err := encodeSection(s, opt.NoCompress, minSaving)
		if err != nil {
			return nil, err
		}
		encs[i] = encoded{entry: entry{Name: s.Name, Offset: off, Stored: uint64(len(data)), Raw: uint64(len(s.Data)),
			CRC: crc(data), Codec: c}, dtype: dtypes[s.Name], data: data}
		off = alignUp(off + uint64(len(data)))
	}
	l := &layout{index: map[string]int{}}
	for i := range encs {
		l.entries = append(l.entries, encs[i].entry)
		l.index[encs[i].Name] = i
	}
	if errs := agreement(&a.Manifest, l); len(errs) > 0 {
		return nil, fmt.Errorf("pack: %s: %w", path, errs[0])
	}
	man, err := json.Marshal(&a.Manifest)
	if err != nil {
		return nil, fmt.Errorf("pack: %s: manifest: %w", path, err)
	}
	table := encodeTable(l.entries)
	tableOff := off
	manOff := tableOff + uint64(len(table))
	size := manOff + uint64(len(man))

	le := binary.LittleEndian
	hdr := make([]byte, HeaderSize)
	copy(hdr, Magic)
	le.PutUint32(hdr[offVersion:], uint32(a.Manifest.FormatVersion))
	le.PutUint64(hdr[offFileSize:], size)
	le.PutUint64(hdr[offManifestOff:], manOff)
	le.PutUint64(hdr[offManifestLen:], uint64(len(man)))
	le.PutUint64(hdr[offTableOff:], tableOff)
	le.PutUint64(hdr[offTableLen:], uint64(len(table)))
	le.PutUint32(hdr[offCount:], uint32(len(encs)))
	le.PutUint32(hdr[offManifestCRC:], crc(man))
	le.PutUint32(hdr[offTableCRC:], crc(table))
	le.PutUint32(hdr[offHeaderCRC:], crc(hdr[:offHeaderCRC]))

	var fileSum []byte
	var bodyErr error // an error of the write below, already naming path
	err = fsx.WriteAtomic(path, 0o644, func(tmp *os.File) error {
		h := sha256.New()
		w := bufio.NewWriterSize(tmp, 1<<20)
		var pos uint64
		put := func(b []byte) {
			h.Write(b)
			w.Write(b)
			pos += uint64(len(b))
		}
		var zeros [Alignment]byte
		// body emits everything after the header.
		body := func(put func([]byte), pos uint64) {
			for _, e := range encs {
				put(zeros[:e.Offset-pos])
				put(e.data)
				pos = e.Offset + uint64(len(e.data))
			}
			put(zeros[:tableOff-pos])
			put(table)
			put(man)
		}
		put(hdr)
		body(put, pos)
		if err := w.Flush(); err != nil {
			bodyErr = fmt.Errorf("pack: writing %s: %w", path, err)
			return bodyErr
		}
		sum := h.Sum(nil)
		// The file's own sha256 (sha256sum): the header with the hash in place.
		fh := sha256.New()
		copy(hdr[offSHA256:endSHA256], sum)
		fh.Write(hdr)
		body(func(b []byte) { fh.Write(b) }, HeaderSize)
		fileSum = fh.Sum(nil)
		if _, err := tmp.WriteAt(sum, offSHA256); err != nil {
			bodyErr = fmt.Errorf("pack: writing %s: %w", path, err)
			return bodyErr
		}
		return nil
	})
	if err != nil && err != bodyErr {
		return nil, fmt.Errorf("pack: writing %s: %w", path, err)
	} else if err != nil {
		return nil, err
	}
	sum := hdr[offSHA256:endSHA256]
	st := &Stats{Path: path, FileSize: int64(size), SHA256: hex.EncodeToString(fileSum), ContentSHA256: hex.EncodeToString(sum)}
	by := map[string]*DTypeStat{}
	for _, e := range encs {
		st.Sections = append(st.Sections, SectionStat{e.Name, e.dtype, e.Codec.String(), int64(e.Raw), int64(e.Stored)})
		st.Raw += int64(e.Raw)
		st.Stored += int64(e.Stored)
		d := by[e.dtype]
		if d == nil {
			d = &DTypeStat{DType: e.dtype}
			by[e.dtype] = d
		}
		d.Sections++
		d.Raw += int64(e.Raw)
		d.Stored += int64(e.Stored)
		if e.Codec != CodecNone {
			d.Compressed++
		}
	}
	for _, d := range by {
		if d.Raw > 0 {
			d.Ratio = float64(d.Stored) / float64(d.Raw)
		}
		st.ByDType = append(st.ByDType, *d)
	}
	sort.Slice(st.ByDType, func(i, j int) bool { return st.ByDType[i].DType < st.ByDType[j].DType })
	return st, nil
}

func alignUp(x uint64) uint64 { return (x + Alignment - 1) / Alignment * Alignment }

// encodeTable lays out entries (sorted by name) and then their names.
func encodeTable(es []entry) []byte {
	le := binary.LittleEndian
	b := make([]byte, len(es)*EntrySize)
	var names []byte
	for i, e := range es {
		x := b[i*EntrySize:]
		le.PutUint64(x[0:], e.Offset)
		le.PutUint64(x[8:], e.Stored)
		le.PutUint64(x[16:], e.Raw)
		le.PutUint32(x[24:], e.CRC)
		le.PutUint16(x[28:], uint16(e.Codec))
		le.PutUint32(x[32:], uint32(len(names)))
		le.PutUint32(x[36:], uint32(len(e.Name)))
		names = append(names, e.Name...)
	}
	return append(b, names...)
}

// sectionDTypes maps each section the manifest names to its dtype
// ("file" for embedded files).
func sectionDTypes(m *Manifest) map[string]string {
	d := map[string]string{}
	for _, f := range m.Files {
		d[f.Section] = "file"
	}
	for i := range m.Tensors {
		t := &m.Tensors[i]
		d[t.Section] = t.DType
		if q := t.Quant; q != nil {
			d[q.ScaleSection] = q.ScaleDType
			if q.ZeroSection != "" {
				d[q.ZeroSection] = q.ZeroDType
			}
			if q.PermSection != "" {
				d[q.PermSection] = "I32"
			}
		}
	}
	return d
}
