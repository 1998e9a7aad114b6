package pack

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"slices"
	"unicode/utf8"

	"github.com/lmpack/lmpack/model"
)

// Layout constants (docs/FORMAT.md).
const (
	// Magic is the first four bytes of every artifact (model.ArtifactMagic,
	// which model.IsArtifact tests).
	Magic = model.ArtifactMagic
	// FormatVersion is the newest version this lmpack reads and writes.
	// Write records the lowest version that describes the artifact:
	// MinFormatVersion, or QuantFormatVersion when a tensor is quantized,
	// so artifacts without quantized tensors stay readable by older lmpack.
	FormatVersion = 2
	// MinFormatVersion is the oldest version this lmpack reads.
	MinFormatVersion = 1
	// QuantFormatVersion is the first version with quantized tensors
	// (TensorEntry.Quant).
	QuantFormatVersion = 2
	// HeaderSize is the size of the fixed header in bytes.
	HeaderSize = 128
	// Alignment is the alignment in bytes of every section's offset.
	Alignment = 64
	// EntrySize is the size in bytes of one section-table entry.
	EntrySize = 48
	// MaxManifestSize bounds the manifest length (bytes) Open accepts.
	MaxManifestSize = 64 << 20
	// MaxSections bounds the section count Open accepts.
	MaxSections = 1 << 20
	// maxLZ4Ratio: an lz4 block never expands data by more than 255×.
	maxLZ4Ratio = 255
)

// Header byte offsets.
const (
	offVersion     = 4
	offFileSize    = 8
	offManifestOff = 16
	offManifestLen = 24
	offTableOff    = 32
	offTableLen    = 40
	offCount       = 48
	offManifestCRC = 52
	offTableCRC    = 56
	offHeaderCRC   = 60
	offSHA256      = 64
	endSHA256      = 96
)

// Codec is how a section's bytes are stored.
type Codec uint16

const (
	// CodecNone: stored bytes are the raw bytes (zero-copy).
	CodecNone Codec = 0
	// CodecLZ4: one lz4 block of the raw bytes.
	CodecLZ4 Codec = 1
	// CodecLZ4Planes2: the raw bytes are 2-byte little-endian elements
	// split into two planes (all high bytes, then all low bytes) and the
	// planes compressed as one lz4 block.
	CodecLZ4Planes2 Codec = 2
)

// String returns "none", "lz4" or "lz4+planes2".
func (c Codec) String() string {
	switch c {
	case CodecNone:
		return "none"
	case CodecLZ4:
		return "lz4"
	case CodecLZ4Planes2:
		return "lz4+planes2"
	}
	return fmt.Sprintf("codec(%d)", uint16(c))
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func crc(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// entry is one decoded section-table entry.
type entry struct {
	Name   string
	Offset uint64
	Stored uint64
	Raw    uint64
	CRC    uint32
	Codec  Codec
}

// layout is a parsed header and section table.
type layout struct {
	manifestOff, manifestLen uint64
	tableOff, tableLen       uint64
	manifestCRC              uint32
	version                  uint32
	sha                      [32]byte
	entries                  []entry // sorted by name
	index                    map[string]int
}

func fmtErr(path, format string, args ...any) error {
	return fmt.Errorf("pack: %s: %s: %w", path, fmt.Sprintf(format, args...), ErrFormat)
}

// parseLayout validates the header and section table of mem (the whole
// file): magic, version, header and table CRC-32C, file size, bounds,
// alignment, overlap, codecs, names. It does not read section bytes or the
// manifest.
func parseLayout(path string, mem []byte) (*layout, error) {
	n := uint64(len(mem))
	if n < HeaderSize {
		return nil, fmtErr(path, "file is %d bytes, shorter than the %d-byte header (truncated?)", n, HeaderSize)
	}
	if string(mem[:4]) != Magic {
		return nil, fmtErr(path, "magic %q, want %q (not an lmpack artifact)", mem[:4], Magic)
	}
	le := binary.LittleEndian
	if v := le.Uint32(mem[offVersion:]); v < MinFormatVersion || v > FormatVersion {
		return nil, fmt.Errorf("pack: %s: header format version %d, this lmpack reads %d..%d: %w", path, v, MinFormatVersion, FormatVersion, ErrVersion)
	}
	if got, want := crc(mem[:offHeaderCRC]), le.Uint32(mem[offHeaderCRC:]); got != want {
		return nil, fmt.Errorf("pack: %s: header CRC-32C %08x, stored %08x: %w", path, got, want, ErrChecksum)
	}
	if size := le.Uint64(mem[offFileSize:]); size != n {
		return nil, fmtErr(path, "header says the file is %d bytes, it is %d (truncated or extended)", size, n)
	}
	for _, b := range mem[endSHA256:HeaderSize] {
		if b != 0 {
			return nil, fmtErr(path, "reserved header bytes [%d,%d) are not zero", endSHA256, HeaderSize)
		}
	}
	l := &layout{
		manifestOff: le.Uint64(mem[offManifestOff:]), manifestLen: le.Uint64(mem[offManifestLen:]),
		tableOff: le.Uint64(mem[offTableOff:]), tableLen: le.Uint64(mem[offTableLen:]),
		manifestCRC: le.Uint32(mem[offManifestCRC:]), version: le.Uint32(mem[offVersion:]),
	}
	copy(l.sha[:], mem[offSHA256:endSHA256])
	count := uint64(le.Uint32(mem[offCount:]))
	if l.manifestLen > MaxManifestSize {
		return nil, fmtErr(path, "manifest length %d exceeds %d", l.manifestLen, MaxManifestSize)
	}
	if !within(l.manifestOff, l.manifestLen, n) || l.manifestOff < HeaderSize {
		return nil, fmtErr(path, "manifest [%d,+%d) outside the file of %d bytes", l.manifestOff, l.manifestLen, n)
	}
	if !within(l.tableOff, l.tableLen, n) || l.tableOff < HeaderSize || l.tableOff%Alignment != 0 {
		return nil, fmtErr(path, "section table [%d,+%d) outside the file of %d bytes or not %d-aligned", l.tableOff, l.tableLen, n, Alignment)
	}
	if overlaps(l.tableOff, l.tableLen, l.manifestOff, l.manifestLen) {
		return nil, fmtErr(path, "section table and manifest overlap")
	}
	if count > MaxSections || count*EntrySize > l.tableLen {
		return nil, fmtErr(path, "section count %d does not fit the %d-byte table", count, l.tableLen)
	}
	table := mem[l.tableOff : l.tableOff+l.tableLen]
	if got, want := crc(table), le.Uint32(mem[offTableCRC:]); got != want {
		return nil, fmt.Errorf("pack: %s: section table CRC-32C %08x, stored %08x: %w", path, got, want, ErrChecksum)
	}
	names := table[count*EntrySize:]
	l.entries = make([]entry, 0, count)
	l.index = make(map[string]int, count)
	for i := uint64(0); i < count; i++ {
		e := table[i*EntrySize : (i+1)*EntrySize]
		nameOff, nameLen := uint64(le.Uint32(e[32:])), uint64(le.Uint32(e[36:]))
		if !within(nameOff, nameLen, uint64(len(names))) || nameLen == 0 {
			return nil, fmtErr(path, "section %d: name [%d,+%d) outside the %d-byte name table", i, nameOff, nameLen, len(names))
		}
		name := string(names[nameOff : nameOff+nameLen])
		x := entry{Name: name, Offset: le.Uint64(e[0:]), Stored: le.Uint64(e[8:]), Raw: le.Uint64(e[16:]),
			CRC: le.Uint32(e[24:]), Codec: Codec(le.Uint16(e[28:]))}
		switch {
		case !utf8.ValidString(name):
			return nil, fmtErr(path, "section %d: name is not UTF-8", i)
		case i > 0 && name <= l.entries[i-1].Name:
			return nil, fmtErr(path, "section %q: names not strictly sorted (after %q)", name, l.entries[i-1].Name)
		case le.Uint16(e[30:]) != 0 || le.Uint64(e[40:]) != 0:
			return nil, fmtErr(path, "section %q: reserved entry bytes are not zero", name)
		case x.Offset%Alignment != 0 || x.Offset < HeaderSize:
			return nil, fmtErr(path, "section %q: offset %d not %d-aligned after the header", name, x.Offset, Alignment)
		case !within(x.Offset, x.Stored, l.tableOff):
			return nil, fmtErr(path, "section %q: bytes [%d,+%d) run past the section area ending at %d", name, x.Offset, x.Stored, l.tableOff)
		}
		switch x.Codec {
		case CodecNone:
			if x.Raw != x.Stored {
				return nil, fmtErr(path, "section %q: codec none with raw size %d != stored size %d", name, x.Raw, x.Stored)
			}
		case CodecLZ4, CodecLZ4Planes2:
			if x.Stored == 0 || x.Raw > x.Stored*maxLZ4Ratio {
				return nil, fmtErr(path, "section %q: raw size %d impossible for %d lz4 bytes", name, x.Raw, x.Stored)
			}
			if x.Codec == CodecLZ4Planes2 && x.Raw%2 != 0 {
				return nil, fmtErr(path, "section %q: byte-plane codec with odd raw size %d", name, x.Raw)
			}
		default:
			return nil, fmtErr(path, "section %q: unknown codec %d", name, x.Codec)
		}
		l.index[name] = len(l.entries)
		l.entries = append(l.entries, x)
	}
	byOff := slices.Clone(l.entries)
	slices.SortFunc(byOff, func(a, b entry) int {
		if a.Offset != b.Offset {
			if a.Offset < b.Offset {
				return -1
			}
			return 1
		}
		return 0
	})
	for i := 1; i < len(byOff); i++ {
		p := byOff[i-1]
		if p.Offset+p.Stored > byOff[i].Offset {
			return nil, fmtErr(path, "sections %q and %q overlap", p.Name, byOff[i].Name)
		}
	}
	return l, nil
}

// within reports whether [off, off+n) lies inside [0, size) without overflow.
func within(off, n, size uint64) bool { return off <= size && n <= size-off }

func overlaps(a, an, b, bn uint64) bool { return a < b+bn && b < a+an && an > 0 && bn > 0 }

// splitPlanes2 writes src's 2-byte little-endian elements as two planes:
// all high bytes, then all low bytes. len(dst) == len(src), len even.
func splitPlanes2(dst, src []byte) {
	h := len(src) / 2
	for i := 0; i < h; i++ {
		dst[i] = src[2*i+1]
		dst[h+i] = src[2*i]
	}
}

// joinPlanes2 inverts splitPlanes2.
func joinPlanes2(dst, src []byte) {
	h := len(src) / 2
	for i := 0; i < h; i++ {
		dst[2*i+1] = src[i]
		dst[2*i] = src[h+i]
	}
}
