package pack

import (
	"fmt"
	"slices"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/quantize/weights"
)

// Quantized-tensor constants (docs/FORMAT.md "Quantized tensors").
const (
	// PackingLSBFirst is the only QuantFormat.PackingOrder defined.
	PackingLSBFirst = "lsb_first"
	// QuantScaleDType is the only scale and zero-point dtype defined.
	QuantScaleDType = "F16"
)

// storageRef is one storage tensor of a quantized weight as the runtime
// asks for it (NAME.qweight, NAME.scales, NAME.qzeros, NAME.perm): the
// manifest entry it belongs to, its section, dtype and row-major shape.
type storageRef struct {
	entry   int
	section string
	dtype   safetensors.DType
	shape   []int
}

// storage lists the storage tensors of the quantized entry t (Quant set,
// Shape [rows, cols]) by their checkpoint names (arch.QuantStorage
// naming), with their sections, dtypes and shapes.
func storage(t *TensorEntry) map[string]storageRef {
	q := t.Quant
	rows, cols := t.Shape[0], t.Shape[1]
	g := cols / q.GroupSize
	p := arch.QuantPrefix(t.Name)
	s := map[string]storageRef{
		p + arch.SuffixQWeight: {section: t.Section, dtype: safetensors.U8, shape: []int{rows, weights.RowBytes(cols, q.Bits)}},
		p + arch.SuffixScales:  {section: q.ScaleSection, dtype: safetensors.DType(q.ScaleDType), shape: []int{rows, g}},
	}
	if q.ZeroSection != "" {
		s[p+arch.SuffixQZeros] = storageRef{section: q.ZeroSection, dtype: safetensors.DType(q.ZeroDType), shape: []int{rows, g}}
	}
	if q.PermSection != "" {
		s[p+arch.SuffixPerm] = storageRef{section: q.PermSection, dtype: safetensors.I32, shape: []int{cols}}
	}
	return s
}

// checkQuant validates a quantized entry's format fields (not its
// sections): a 2-d ".weight" of dtype U8, bits 2, 3, 4 or 8, a group size
// dividing cols, F16 scales (and zero-points when present), lsb_first
// packing. The error (ErrFormat, wrapped) names the tensor and the field.
func checkQuant(t *TensorEntry) error {
	q := t.Quant
	bad := func(format string, a ...any) error {
		return fmt.Errorf("quantized tensor %q: %s: %w", t.Name, fmt.Sprintf(format, a...), ErrFormat)
	}
	switch {
	case len(t.Shape) != 2 || t.Shape[0] <= 0 || t.Shape[1] <= 0 || t.Shape[0] > 1<<31 || t.Shape[1] > 1<<31:
		return bad("shape %v, want [rows, cols] with both > 0", t.Shape)
	case len(t.Name) <= len(".weight") || arch.QuantPrefix(t.Name) == t.Name:
		return bad("name must end in .weight")
	case t.DType != string(safetensors.U8):
		return bad("dtype %q, want U8 (packed codes)", t.DType)
	case !slices.Contains([]int{1, 2, 3, 4, 8}, q.Bits):
		return bad("bits %d, want 1, 2, 3, 4 or 8", q.Bits)
	case q.Bits == 1 && q.ZeroSection == "":
		return bad("bits 1 needs zero-points (1-bit is asymmetric only)")
	case q.GroupSize <= 0 || t.Shape[1]%q.GroupSize != 0:
		return bad("group_size %d must be > 0 and divide its %d columns", q.GroupSize, t.Shape[1])
	case q.ScaleDType != QuantScaleDType:
		return bad("scale_dtype %q, want %s", q.ScaleDType, QuantScaleDType)
	case q.ScaleSection == "":
		return bad("no scale_section")
	case (q.ZeroSection == "") != (q.ZeroDType == ""):
		return bad("zero_section %q and zero_dtype %q: give both (asymmetric) or neither (symmetric)", q.ZeroSection, q.ZeroDType)
	case q.ZeroDType != "" && q.ZeroDType != QuantScaleDType:
		return bad("zero_dtype %q, want %s", q.ZeroDType, QuantScaleDType)
	case q.PackingOrder != PackingLSBFirst:
		return bad("packing_order %q, want %s", q.PackingOrder, PackingLSBFirst)
	}
	return nil
}

// storageIndex maps every storage tensor name of the manifest's quantized
// entries to its reference. Errors (ErrFormat, ErrMismatch): an invalid
// quantized entry (checkQuant); a storage name that is also a plain
// tensor's name or another quantized entry's.
func storageIndex(m *Manifest) (map[string]storageRef, error) {
	idx := map[string]storageRef{}
	names := map[string]bool{}
	for _, t := range m.Tensors {
		names[t.Name] = true
	}
	for i := range m.Tensors {
		t := &m.Tensors[i]
		if t.Quant == nil {
			continue
		}
		if err := checkQuant(t); err != nil {
			return nil, err
		}
		for n, s := range storage(t) {
			if _, dup := idx[n]; dup || names[n] {
				return nil, fmt.Errorf("quantized tensor %q: storage tensor name %q is used twice: %w", t.Name, n, ErrMismatch)
			}
			s.entry = i
			idx[n] = s
		}
	}
	return idx, nil
}

// quantization returns the manifest's quantized tensors as the
// arch.Quantization block the runtime dequantizes (nil when none).
func quantization(m *Manifest) *arch.Quantization {
	var q *arch.Quantization
	for _, t := range m.Tensors {
		if t.Quant == nil {
			continue
		}
		if q == nil {
			q = &arch.Quantization{Format: arch.QuantFormat, Version: arch.QuantVersion, Method: m.WeightsMethod, Tensors: map[string]arch.TensorQuant{}}
		}
		q.Tensors[t.Name] = arch.TensorQuant{Bits: t.Quant.Bits, GroupSize: t.Quant.GroupSize,
			Symmetric: t.Quant.Symmetric(), Perm: t.Quant.PermSection != ""}
	}
	return q
}

// numel is the product of shape (sizes checked by the caller).
func numelU(shape []int) (uint64, bool) {
	n := uint64(1)
	for _, d := range shape {
		if d < 0 || (d > 0 && n > (1<<62)/uint64(d)) {
			return 0, false
		}
		n *= uint64(d)
	}
	return n, true
}
