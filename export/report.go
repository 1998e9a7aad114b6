// Package export writes an lmpack model (a Hugging Face checkpoint
// directory, an lmpack quantized checkpoint, docs/QUANT.md, or an .lmpk
// artifact, docs/FORMAT.md) in a format another runtime loads: GGUF for
// llama.cpp (GGUF) and compressed-tensors for vLLM (CompressedTensors).
// Both stream tensor by tensor (peak memory about one tensor), write their
// output atomically (internal/fsx) and produce byte-identical output for
// the same input, and return a Report of what each tensor became and why.
package export

import (
	"fmt"
	"io"
	"strings"
)

// Modes of a TensorRow: how a tensor of the model reached the output.
const (
	// ModeExact: written without loss (a float tensor kept in its dtype,
	// or quantized codes and scales rewritten into the target's layout
	// bit for bit).
	ModeExact = "exact"
	// ModeRequantized: dequantized (or converted from float) and quantized
	// again into To; the values change.
	ModeRequantized = "requantized"
	// ModeKept: a tensor kept in a float type other than its own because
	// the target requires it (e.g. a 1-D norm stored F32).
	ModeKept = "kept"
	// ModeRefused: the tensor could not be written; Reason says why (the
	// export fails when any row is refused).
	ModeRefused = "refused"
)

// TensorRow is what one tensor of the model became in the export.
type TensorRow struct {
	// Name is the tensor's name in the output (GGUF: "blk.0.attn_q.weight";
	// compressed-tensors: the Hugging Face name).
	Name string `json:"name"`
	// Source is the tensor's name in the model ("model.layers.0.self_attn.q_proj.weight");
	// a stacked GGUF expert tensor names the first expert's weight.
	Source string `json:"source,omitempty"`
	// Shape is the row-major shape of the logical (dequantized) tensor.
	Shape []int `json:"shape"`
	// From is the tensor's lmpack storage: a float dtype ("F32", "F16",
	// "BF16") or a quantization ("int4 g32 sym", "int4 g128 asym act-order").
	From string `json:"from"`
	// To is the target type ("Q8_0", "F32", "pack-quantized int4 g32").
	To string `json:"to"`
	// Mode is one of ModeExact, ModeRequantized, ModeKept, ModeRefused.
	Mode string `json:"mode"`
	// Reason says why the tensor took this path (empty for the obvious
	// case of a float tensor kept in its dtype).
	Reason string `json:"reason,omitempty"`
	// Bytes is the size of the tensor's data in the output.
	Bytes int64 `json:"bytes"`
}

// Report is the result of an export.
type Report struct {
	// Format is "gguf" or "compressed-tensors"; Out the output path.
	Format string `json:"format"`
	Out    string `json:"out"`
	// Tensors lists every tensor written (or refused), in output order.
	Tensors []TensorRow `json:"tensors"`
	// Weights is the number of weight values (elements of all tensors).
	Weights int64 `json:"weights"`
	// BitsPerWeight is 8·(sum of the tensors' Bytes)/Weights: the tensor
	// data only, without metadata and padding.
	BitsPerWeight float64 `json:"bits_per_weight"`
	// Bytes is the size of the output (a file's size, or a directory's
	// files summed).
	Bytes int64 `json:"bytes"`
	// Warnings are what the output does not carry and what to do instead
	// (e.g. a KV-cache scheme with the llama.cpp --cache-type-k to use).
	Warnings []string `json:"warnings,omitempty"`
}

// Counts returns how many rows have each Mode.
func (r *Report) Counts() map[string]int {
	c := map[string]int{}
	for _, t := range r.Tensors {
		c[t.Mode]++
	}
	return c
}

// Finish sets Weights and BitsPerWeight from the rows (call it after the
// last row is added; Bytes is the caller's).
func (r *Report) Finish() {
	var n, b int64
	for _, t := range r.Tensors {
		e := int64(1)
		for _, s := range t.Shape {
			e *= int64(s)
		}
		n += e
		b += t.Bytes
	}
	r.Weights = n
	if n > 0 {
		r.BitsPerWeight = 8 * float64(b) / float64(n)
	}
}

// WriteText writes the report as a table: one line per tensor (name,
// shape, from → to, mode, reason), then the totals and the warnings.
func (r *Report) WriteText(w io.Writer) error {
	var b strings.Builder
	for _, t := range r.Tensors {
		sh := make([]string, len(t.Shape))
		for i, s := range t.Shape {
			sh[i] = fmt.Sprint(s)
		}
		fmt.Fprintf(&b, "%-40s [%s] %s -> %s %s", t.Name, strings.Join(sh, ","), t.From, t.To, t.Mode)
		if t.Reason != "" {
			fmt.Fprintf(&b, " (%s)", t.Reason)
		}
		b.WriteByte('\n')
	}
	c := r.Counts()
	if c[ModeRefused] > 0 {
		// Nothing was written: say so rather than a size of 0 bytes.
		fmt.Fprintf(&b, "%s: %s not written: %d of %d tensors refused (%d exact, %d requantized, %d kept)\n",
			r.Format, r.Out, c[ModeRefused], len(r.Tensors), c[ModeExact], c[ModeRequantized], c[ModeKept])
	} else {
		fmt.Fprintf(&b, "%s: %s, %d bytes, %d tensors (%d exact, %d requantized, %d kept), %.3f bits per weight\n",
			r.Format, r.Out, r.Bytes, len(r.Tensors), c[ModeExact], c[ModeRequantized], c[ModeKept], r.BitsPerWeight)
	}
	for _, w := range r.Warnings {
		fmt.Fprintf(&b, "warning: %s\n", w)
	}
	_, err := io.WriteString(w, b.String())
	return err
}
