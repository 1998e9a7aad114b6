package tokenizer

import (
	"strings"
	"unicode/utf8"
)

// The GPT-2 byte-to-unicode table (Radford et al. 2019, openai/gpt-2
// encoder.py "bytes_to_unicode"): printable bytes '!'..'~', 0xA1..0xAC and
// 0xAE..0xFF stand for themselves; the 68 remaining bytes (controls, space,
// 0x7F..0xA0, 0xAD) are mapped in increasing order onto U+0100, U+0101, ...
// so that every byte is a visible, non-space character. All table
// characters are below U+0144.
var (
	byteToRune [256]rune
	byteToUTF8 [256]string
	runeToByte [0x144]int16 // -1: not a table character
)

func init() {
	for i := range runeToByte {
		runeToByte[i] = -1
	}
	next := rune(256)
	for b := 0; b < 256; b++ {
		if (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF) {
			byteToRune[b] = rune(b)
		} else {
			byteToRune[b] = next
			next++
		}
		byteToUTF8[b] = string(byteToRune[b])
		runeToByte[byteToRune[b]] = int16(b)
	}
}

// byteLevelEncode maps every byte of s to its byte-level character.
func byteLevelEncode(s string) string {
	var sb strings.Builder
	sb.Grow(2 * len(s))
	for i := 0; i < len(s); i++ {
		sb.WriteString(byteToUTF8[s[i]])
	}
	return sb.String()
}

// byteLevelDecodeToken appends the bytes a byte-level token stands for. A
// token holding any character outside the table (an added token such as
// "<|im_start|>" is fine, it is printable ASCII; a CJK added token is not)
// is appended as its own UTF-8 bytes, as the Hugging Face ByteLevel decoder
// does.
func byteLevelDecodeToken(dst []byte, tok string) []byte {
	start := len(dst)
	for i := 0; i < len(tok); {
		r, n := rune(tok[i]), 1
		if r >= utf8.RuneSelf {
			r, n = utf8.DecodeRuneInString(tok[i:])
		}
		if r >= rune(len(runeToByte)) || runeToByte[r] < 0 {
			return append(dst[:start], tok...)
		}
		dst = append(dst, byte(runeToByte[r]))
		i += n
	}
	return dst
}
