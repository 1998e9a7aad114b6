package weights

// Packing: each row of codes is one little-endian bit stream. Code j of a
// row occupies stream bits [j·bits, (j+1)·bits), least significant bit
// first, and stream bit k lives in byte k/8 at bit position k%8 (bit 0 =
// LSB). A row takes RowBytes(cols, bits) = ceil(cols·bits/8) bytes; the
// unused high bits of a row's last byte are zero. For 2, 4 and 8 bits this
// is the usual "codes per byte, LSB first" layout; for 3 bits a code may
// straddle two bytes (e.g. code 2 uses bits 6–7 of byte 0 and bit 0 of
// byte 1).

// RowBytes returns the bytes one packed row of cols codes of the given
// width takes: ceil(cols·bits/8).
func RowBytes(cols, bits int) int { return (cols*bits + 7) / 8 }

// putCode writes the low bits of v as code j of the packed row.
func putCode(row []byte, j, bits int, v uint8) {
	p := j * bits
	b, off := p>>3, uint(p&7)
	mask := uint16(1)<<uint(bits) - 1
	w := uint16(v) & mask << off
	m := mask << off
	row[b] = row[b]&^byte(m) | byte(w)
	if off+uint(bits) > 8 {
		row[b+1] = row[b+1]&^byte(m>>8) | byte(w>>8)
	}
}

// getCode reads code j of the packed row.
func getCode(row []byte, j, bits int) uint8 {
	p := j * bits
	b, off := p>>3, uint(p&7)
	w := uint16(row[b])
	if off+uint(bits) > 8 {
		w |= uint16(row[b+1]) << 8
	}
	return uint8(w >> off & (1<<uint(bits) - 1))
}

// PackRow packs codes (one code per element, values < 2^bits) into dst,
// which must hold RowBytes(len(codes), bits) bytes; it panics otherwise
// (a programmer error). bits must be 1, 2, 3, 4 or 8.
func PackRow(dst []byte, codes []uint8, bits int) {
	dst = dst[:RowBytes(len(codes), bits)]
	clear(dst)
	for j, c := range codes {
		putCode(dst, j, bits, c)
	}
}

// UnpackRow unpacks len(dst) codes of the given width from src, the
// inverse of PackRow.
func UnpackRow(dst []uint8, src []byte, bits int) {
	_ = src[RowBytes(len(dst), bits)-1]
	for j := range dst {
		dst[j] = getCode(src, j, bits)
	}
}
