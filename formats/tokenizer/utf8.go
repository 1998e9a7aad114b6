package tokenizer

import "unicode/utf8"

// utf8Lead reports, for a first byte b, the total length of the UTF-8
// sequence it starts and the range allowed for the second byte (Unicode
// Core Specification, Table 3-7 "Well-Formed UTF-8 Byte Sequences").
// size is 0 for a byte that can never start a sequence.
func utf8Lead(b byte) (size int, lo, hi byte) {
	switch {
	case b < 0x80:
		return 1, 0, 0
	case b >= 0xC2 && b <= 0xDF:
		return 2, 0x80, 0xBF
	case b == 0xE0:
		return 3, 0xA0, 0xBF
	case b == 0xED:
		return 3, 0x80, 0x9F
	case b >= 0xE1 && b <= 0xEF:
		return 3, 0x80, 0xBF
	case b == 0xF0:
		return 4, 0x90, 0xBF
	case b >= 0xF1 && b <= 0xF3:
		return 4, 0x80, 0xBF
	case b == 0xF4:
		return 4, 0x80, 0x8F
	}
	return 0, 0, 0
}

// appendLossy appends src to dst as valid UTF-8, replacing every maximal
// ill-formed subpart with one U+FFFD. This is the "substitution of maximal
// subparts" practice of the Unicode Standard (section 3.9, U+FFFD
// substitution), which Rust's String::from_utf8_lossy, the WHATWG
// TextDecoder and Python's errors="replace" all follow; Go's own
// strings.ToValidUTF8 and utf8.DecodeRune do not (they count per byte or per
// run).
//
// When final is false, a trailing sequence that is a valid but incomplete
// prefix (it could still be completed by more bytes) is not written; n is the
// number of bytes of src consumed, so src[n:] must be carried over to the
// next call. When final is true, n == len(src).
func appendLossy(dst, src []byte, final bool) (out []byte, n int) {
	i := 0
	for i < len(src) {
		b := src[i]
		if b < utf8.RuneSelf {
			dst = append(dst, b)
			i++
			continue
		}
		size, lo, hi := utf8Lead(b)
		if size == 0 {
			dst = append(dst, "\uFFFD"...)
			i++
			continue
		}
		k := 1
		for k < size && i+k < len(src) {
			c := src[i+k]
			if k == 1 {
				if c < lo || c > hi {
					break
				}
			} else if c < 0x80 || c > 0xBF {
				break
			}
			k++
		}
		switch {
		case k == size:
			dst = append(dst, src[i:i+k]...)
		case i+k == len(src) && !final:
			return dst, i
		default:
			dst = append(dst, "\uFFFD"...)
		}
		i += k
	}
	return dst, i
}

// toValidUTF8 returns s unchanged when it is valid UTF-8, else its lossy
// conversion (see appendLossy).
func toValidUTF8(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	out, _ := appendLossy(make([]byte, 0, len(s)+8), []byte(s), true)
	return string(out)
}
