package pack

import "errors"

// Sentinel errors, wrapped with the file and the section, tensor or field.
var (
	// ErrFormat: the file is not a well-formed artifact (bad magic, bad
	// header fields, a section out of bounds, misaligned or overlapping, a
	// manifest that does not parse or has unknown fields).
	ErrFormat = errors.New("malformed artifact")
	// ErrVersion: the header or manifest names a format version this
	// lmpack does not read.
	ErrVersion = errors.New("unsupported artifact format version")
	// ErrChecksum: a stored checksum does not match the bytes (header,
	// manifest, a section or the whole file).
	ErrChecksum = errors.New("checksum mismatch")
	// ErrMismatch: the manifest and the section table disagree (a tensor
	// without a section, a section no manifest entry refers to, a size
	// that does not match dtype×shape).
	ErrMismatch = errors.New("manifest and sections disagree")
	// ErrNoSection: Section was asked for a name the artifact lacks.
	ErrNoSection = errors.New("no such section")
)
