package fsx

import (
	"fmt"
	"unicode/utf8"
)

// ReadText reads a UTF-8 text data file (evaluation or calibration text).
// Errors, naming path: unreadable or not a regular file (ReadFile), empty,
// or not valid UTF-8 (naming the byte offset of the first bad byte).
func ReadText(path string) (string, error) {
	b, err := ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("data file: %w", err)
	}
	if len(b) == 0 {
		return "", fmt.Errorf("data file %s is empty", path)
	}
	if off := FirstInvalidUTF8(b); off >= 0 {
		return "", fmt.Errorf("data file %s is not valid UTF-8 (first bad byte at offset %d)", path, off)
	}
	return string(b), nil
}

// FirstInvalidUTF8 returns the byte offset of the first byte of b that
// does not start a valid UTF-8 sequence, or -1 when b is valid UTF-8.
func FirstInvalidUTF8(b []byte) int {
	if utf8.Valid(b) {
		return -1
	}
	off := 0
	for off < len(b) {
		r, n := utf8.DecodeRune(b[off:])
		if r == utf8.RuneError && n <= 1 {
			break
		}
		off += n
	}
	return off
}
