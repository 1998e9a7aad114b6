package safetensors

import "encoding/binary"

// FirstNonFinite returns the flat (row-major) index of the first NaN or
// ±Inf element of data, raw little-endian values of dtype, and what it is
// ("NaN", "+Inf" or "-Inf"); -1 when every element is finite or dtype is
// not a float dtype (F64, F32, F16, BF16, F8_E4M3, F8_E5M2). The check
// reads the exponent bits only, so it allocates nothing.
func FirstNonFinite(dtype DType, data []byte) (int, string) {
	le := binary.LittleEndian
	classify := func(frac bool, neg bool) string {
		switch {
		case frac:
			return "NaN"
		case neg:
			return "-Inf"
		}
		return "+Inf"
	}
	switch dtype {
	case F64:
		for i := 0; i+8 <= len(data); i += 8 {
			if b := le.Uint64(data[i:]); b&0x7ff0000000000000 == 0x7ff0000000000000 {
				return i / 8, classify(b&0x000fffffffffffff != 0, b>>63 == 1)
			}
		}
	case F32:
		for i := 0; i+4 <= len(data); i += 4 {
			if b := le.Uint32(data[i:]); b&0x7f800000 == 0x7f800000 {
				return i / 4, classify(b&0x007fffff != 0, b>>31 == 1)
			}
		}
	case F16:
		for i := 0; i+2 <= len(data); i += 2 {
			if b := le.Uint16(data[i:]); b&0x7c00 == 0x7c00 {
				return i / 2, classify(b&0x03ff != 0, b>>15 == 1)
			}
		}
	case BF16:
		for i := 0; i+2 <= len(data); i += 2 {
			if b := le.Uint16(data[i:]); b&0x7f80 == 0x7f80 {
				return i / 2, classify(b&0x007f != 0, b>>15 == 1)
			}
		}
	case F8E4M3:
		// E4M3 (fn) has no infinities; S.1111.111 is NaN.
		for i, b := range data {
			if b&0x7f == 0x7f {
				return i, "NaN"
			}
		}
	case F8E5M2:
		for i, b := range data {
			if b&0x7c == 0x7c {
				return i, classify(b&0x03 != 0, b>>7 == 1)
			}
		}
	}
	return -1, ""
}
