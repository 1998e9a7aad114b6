package tokenizer

// The GPT-2 byte-to-unicode table (Radford et al. 2019, openai/gpt-2
// encoder.py "bytes_to_unicode"): printable bytes '!'..'~', 0xA1..0xAC and
// 0xAE..0xFF stand for themselves; the 68 remaining bytes (controls, space,
// 0x7F..0xA0, 0xAD) are mapped in increasing order onto U+0100, U+0101, ...
// so that every byte is a visible, non-space character.
var (
	byteToRune [256]rune
	runeToByte = map[rune]byte{}
)

func init() {
	next := rune(256)
	for b := 0; b < 256; b++ {
		if (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF) {
			byteToRune[b] = rune(b)
		} else {
			byteToRune[b] = next
			next++
		}
		runeToByte[byteToRune[b]] = byte(b)
	}
}

// byteLevelEncode maps every byte of s to its byte-level character.
func byteLevelEncode(s string) string {
	buf := make([]rune, len(s))
	for i := 0; i < len(s); i++ {
		buf[i] = byteToRune[s[i]]
	}
	return string(buf)
}

// byteLevelDecodeToken appends the bytes a byte-level token stands for. A
// token holding any character outside the table (an added token such as
// "<|im_start|>" written in plain text is fine, it is printable ASCII; but
// e.g. a CJK added token is not) is appended as its own UTF-8 bytes, as the
// Hugging Face ByteLevel decoder does.
func byteLevelDecodeToken(dst []byte, tok string) []byte {
	start := len(dst)
	for _, r := range tok {
		b, ok := runeToByte[r]
		if !ok {
			return append(dst[:start], tok...)
		}
		dst = append(dst, b)
	}
	return dst
}
