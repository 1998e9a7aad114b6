package pack

// Internals exposed to the external tests (package pack_test: the tests
// that open artifacts through internal/engine, which imports pack).
var (
	DecodeManifest = decodeManifest
	PackStories    = packStories
	CRC            = crc
)

// Header offsets of the format version and the header CRC.
const (
	OffVersion   = offVersion
	OffHeaderCRC = offHeaderCRC
)

// SectionOffset returns the file offset of section name's stored bytes.
func SectionOffset(r *Reader, name string) (uint64, bool) {
	i, ok := r.l.index[name]
	if !ok {
		return 0, false
	}
	return r.l.entries[i].Offset, true
}

// SectionRange returns the file offset and stored length of section name.
func SectionRange(r *Reader, name string) (offset, stored uint64, ok bool) {
	i, ok := r.l.index[name]
	if !ok {
		return 0, 0, false
	}
	e := r.l.entries[i]
	return e.Offset, e.Stored, true
}
