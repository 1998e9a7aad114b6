package export

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/internal/field"
	"github.com/lmpack/lmpack/internal/fsx"
	"github.com/lmpack/lmpack/model"
	"github.com/lmpack/lmpack/pack"
	"github.com/lmpack/lmpack/quantize/weights"
	"github.com/lmpack/lmpack/runtime"
)

// FormatCompressedTensors is Report.Format of CompressedTensors.
const FormatCompressedTensors = "compressed-tensors"

// CTVersion is the quantization_config "version" written: the
// compressed-tensors release whose pack-quantized layout and config
// fields this writer follows.
const CTVersion = "0.10.2"

// CTBits are the code widths vLLM's compressed-tensors WNA16 schemes
// serve (CompressedTensorsWNA16: 4 and 8 bits); CompressedTensors refuses
// every other width.
var CTBits = []int{4, 8}

// ErrCTUnsupported is wrapped by CompressedTensors for a model the
// compressed-tensors output cannot represent (a code width vLLM does not
// serve, a width-pruned model, a KV-cache scheme without a
// compressed-tensors counterpart).
var ErrCTUnsupported = errors.New("cannot be exported as compressed-tensors")

// CTOptions configures CompressedTensors.
type CTOptions struct {
	// Out is the output directory; it must not exist.
	Out string
	// KVCalib, when set, is a calibration file (lmpack calibrate) holding
	// token ids; it adds an FP8 kv_cache_scheme with per-layer
	// k_scale/v_scale (kvScales).
	KVCalib string
	// DropKV exports the weights of an artifact whose KV-cache scheme has
	// no compressed-tensors counterpart (lmpack's int2/int4 schemes,
	// OSCAR rotations), leaving the scheme out with a warning; without it
	// such an artifact is refused.
	DropKV bool
	// Threads is the CPU worker count of the KVCalib forward passes; <= 0
	// means all cores.
	Threads int
	// Logger receives progress lines; nil discards them.
	Logger *slog.Logger
}

// Validate checks opt's values without opening anything: Out given,
// Threads >= 0.
//
// Errors: a *field.Error naming the Go field (cmd/lmpack renames it to
// its flag).
func (opt *CTOptions) Validate() error {
	switch {
	case opt.Out == "":
		return field.New("Out", nil, "the output directory to create")
	case opt.Threads < 0:
		return field.New("Threads", opt.Threads, ">= 0 (0: all cores)")
	}
	return nil
}

// ctSource is the opened input of CompressedTensors: a checkpoint
// directory or an artifact.
type ctSource struct {
	desc   *arch.Description
	src    runtime.TensorSource
	config []byte                 // config.json bytes
	files  func(dst string) error // copies the side files into dst
	kv     *pack.KVScheme         // the artifact's KV scheme, nil for none
	close  func() error
	dir    string // checkpoint directory ("" for an artifact)
	path   string // what the user named
	dtypes map[string]safetensors.DType
}

func openCTSource(ctx context.Context, name string) (*ctSource, error) {
	if model.IsArtifact(name) {
		r, d, err := openArtifact(name)
		if err != nil {
			return nil, err
		}
		cfg, err := r.File(model.ConfigFile)
		if err != nil {
			r.Close()
			return nil, fmt.Errorf("export: %s: %w", name, err)
		}
		// The embedded config.json becomes the export's: it must describe
		// the manifest's model (layers, sizes).
		cd, err := arch.Parse(cfg)
		if err != nil {
			r.Close()
			return nil, fmt.Errorf("export: %s: embedded config.json: %w", name, err)
		}
		if len(cd.Layers) != len(d.Layers) || cd.HiddenSize != d.HiddenSize || cd.VocabSize != d.VocabSize {
			r.Close()
			return nil, fmt.Errorf("export: %s: embedded config.json describes %d layers, hidden_size %d, vocab_size %d; the manifest %d, %d, %d", name,
				len(cd.Layers), cd.HiddenSize, cd.VocabSize, len(d.Layers), d.HiddenSize, d.VocabSize)
		}
		s := &ctSource{desc: d, src: r, config: cfg, kv: r.Manifest().KV, close: r.Close, path: name, dtypes: map[string]safetensors.DType{}}
		for _, ti := range r.TensorInfos() {
			s.dtypes[ti.Name] = ti.DType
		}
		s.files = func(dst string) error {
			for _, f := range pack.EmbeddedFiles {
				if f == model.ConfigFile {
					continue
				}
				b, err := r.File(f)
				if errors.Is(err, fs.ErrNotExist) {
					continue
				}
				if err != nil {
					return err
				}
				if err := os.WriteFile(filepath.Join(dst, f), b, 0o644); err != nil {
					return err
				}
			}
			return nil
		}
		return s, nil
	}
	dir, d, ck, err := openCheckpoint(ctx, name)
	if err != nil {
		return nil, err
	}
	cfg, err := fsx.ReadFile(filepath.Join(dir, model.ConfigFile))
	if err != nil {
		ck.Close()
		return nil, fmt.Errorf("export: %w", err)
	}
	s := &ctSource{desc: d, src: ck, config: cfg, close: ck.Close, dir: dir, path: name, dtypes: map[string]safetensors.DType{}}
	for _, n := range ck.Names() {
		ti, _, err := ck.Info(n)
		if err != nil {
			ck.Close()
			return nil, err
		}
		s.dtypes[n] = ti.DType
	}
	s.files = func(dst string) error { return fsx.CopySideFiles(dir, dst) }
	return s, nil
}

// ctScheme is one config group: the weights quantized alike.
type ctScheme struct {
	Bits      int
	GroupSize int // 0: per output channel
	Symmetric bool
	ActOrder  bool
}

func (s ctScheme) String() string {
	g := "channel"
	if s.GroupSize > 0 {
		g = "g" + strconv.Itoa(s.GroupSize)
	}
	sym := "asym"
	if s.Symmetric {
		sym = "sym"
	}
	out := fmt.Sprintf("int%d %s %s", s.Bits, g, sym)
	if s.ActOrder {
		out += " act-order"
	}
	return out
}

func schemeOf(tq arch.TensorQuant, cols int) ctScheme {
	s := ctScheme{Bits: tq.Bits, GroupSize: tq.GroupSize, Symmetric: tq.Symmetric, ActOrder: tq.Perm}
	if tq.GroupSize == cols {
		s.GroupSize = 0
	}
	return s
}

// CompressedTensors exports model (a checkpoint directory, lmpack
// quantized checkpoint (docs/QUANT.md), Hugging Face id or .lmpk
// artifact) as a Hugging Face directory in the compressed-tensors
// "pack-quantized" format that vLLM's compressed-tensors loader reads
// (the layout of compressed-tensors' PackedQuantizationCompressor and
// QuantizationArgs, release CTVersion):
//
//   - each quantized weight NAME.weight [out, in] (4 or 8 bits) becomes
//     NAME.weight_packed I32 [out, ceil(in/(32/bits))]: the unsigned codes
//     (lmpack's codes q ∈ [0, 2^bits−1], which are compressed-tensors'
//     signed values plus the offset 2^(bits−1)), 32/bits per int32 along the
//     input dimension, value i of a word in bits [i·bits, (i+1)·bits), the
//     padding zero; in the original column order (act-order undone);
//     NAME.weight_scale F16 [out, in/group] ([out, 1] per channel), lmpack's
//     fp16 scales bit for bit; NAME.weight_zero_point I32 [ceil(out/(32/bits)),
//     in/group] (asymmetric only) the integer zero-points packed the same way
//     along the output dimension; NAME.weight_shape I64 [2] = [out, in];
//     NAME.weight_g_idx I32 [in] (act-order only): the group of each
//     original input column. Dequantisation (q − z)·scale[r, g_idx[c]]
//     equals lmpack's bit for bit.
//   - float tensors are copied in their dtype; config.json gets
//     quantization_config (one config group per scheme, the largest
//     targeting "Linear", the others their module names; lm_head and every
//     other float 2-d Linear weight in ignore) and loses lmpack_quantization
//     (and a layer_configs list that only repeats the top-level sizes). A
//     stored copy of a tied lm_head is not written (a warning says so).
//   - with opt.KVCalib, an FP8 kv_cache_scheme and per-layer
//     model.layers.N.self_attn.k_scale / v_scale F32 scalars (kvScales).
//
// What maps how:
//
//	lmpack                          compressed-tensors            mode
//	4/8-bit, group 32/64/128        strategy group, group_size    exact
//	4/8-bit, group = cols           strategy channel              exact
//	symmetric (z = 2^(bits−1))      symmetric, no zero-point      exact
//	asymmetric (integer z)          weight_zero_point             exact
//	act-order (NAME.perm)           actorder "group", g_idx       exact
//	float tensors                   same dtype, in ignore         exact
//	1-, 2-, 3-bit weights           —                             refused
//	width-pruned (layer_configs)    —                             refused
//	artifact KV scheme (oscar2 ...) — (DropKV: left out)          refused
//	calibration token ids           FP8 kv_cache_scheme, scales   measured
//
// Scales stay F16 (lmpack's); vLLM casts them to the model's dtype at
// load (exact for fp16/fp32 models; a warning for bf16). vLLM itself was
// not run on this output in lmpack's tests: they decode the output with an unpacker written from the format's
// documentation and compare with lmpack's dequantized weights.
//
// One safetensors shard per decoder block plus one for the rest, with
// model.safetensors.index.json; tokenizer and side files copied. The
// output is written tensor by tensor into a temporary directory renamed
// onto opt.Out (fsx.WriteDir), and is byte-identical for the same input.
//
// Errors: opt.Validate's *field.Error; Out existing; ErrCTUnsupported
// (naming the tensor or field) for 1-, 2- or 3-bit weights, a width-pruned
// model (config.json layer_configs), an artifact's KV scheme without
// opt.DropKV; model/pack open errors; runtime.ErrBadWeights for corrupt
// quantized tensors; ctx's error. On error nothing is left at Out.
func CompressedTensors(ctx context.Context, modelPath string, opt CTOptions) (*Report, error) {
	if err := opt.Validate(); err != nil {
		return nil, err
	}
	if _, err := os.Lstat(opt.Out); err == nil {
		return nil, fmt.Errorf("export: output %s already exists; choose a new path (the exporter never overwrites)", opt.Out)
	}
	s, err := openCTSource(ctx, modelPath)
	if err != nil {
		return nil, err
	}
	defer s.close()
	if s.dir != "" {
		if err := fsx.CheckNewDir(s.dir, opt.Out, "the export"); err != nil {
			return nil, fmt.Errorf("export: %w", err)
		}
	}
	rep := &Report{Format: FormatCompressedTensors, Out: opt.Out}
	d := s.desc

	var raw map[string]json.RawMessage
	if err := json.Unmarshal(s.config, &raw); err != nil {
		return nil, fmt.Errorf("export: %s: config.json: %w", modelPath, err)
	}
	if err := checkUniform(raw); err != nil {
		return nil, fmt.Errorf("export: %s: config.json: layer_configs: %w: %v: the model is width-pruned, and stock loaders, vLLM's included, build every layer from the one num_attention_heads, num_key_value_heads and intermediate_size; export a depth-pruned or unpruned model", modelPath, ErrCTUnsupported, err)
	}
	if s.kv != nil {
		msg := fmt.Sprintf("the artifact's KV-cache scheme %q (method %q", s.kv.Cache, s.kv.Method)
		if len(s.kv.Rotations) > 0 {
			msg += fmt.Sprintf(", %d per-layer rotations", len(s.kv.Rotations))
		}
		msg += ") has no compressed-tensors counterpart: vLLM's kv_cache_scheme is FP8 (E4M3) with per-tensor scales, without rotations or integer codes"
		if !opt.DropKV {
			return nil, fmt.Errorf("export: %s: %w: %s; pass --drop-kv (CTOptions.DropKV) to export the weights without it (the rotations act on the cache only, so the weights are unchanged), optionally with --kv-calib (CTOptions.KVCalib) for an FP8 cache", modelPath, ErrCTUnsupported, msg)
		}
		rep.Warnings = append(rep.Warnings, msg+"; it was left out (vLLM uses its own --kv-cache-dtype; --kv-calib adds FP8 scales)")
	}

	// Plan: which weights are quantized and how.
	shapes := d.TensorShapes()
	var quant map[string]arch.TensorQuant
	if d.Quant != nil {
		quant = d.Quant.Tensors
	}
	qnames := slices.Sorted(maps.Keys(quant))
	schemes := map[ctScheme][]string{}
	for _, n := range qnames {
		tq := quant[n]
		if !slices.Contains(CTBits, tq.Bits) {
			return nil, fmt.Errorf("export: %s: tensor %q is %d-bit: %w: vLLM's compressed-tensors weight-only schemes (WNA16) serve %v bits only; 1-, 2- and 3-bit codes have no kernel there (requantize with lmpack quantize weights --bits 4, or export GGUF)", modelPath, n, tq.Bits, ErrCTUnsupported, CTBits)
		}
		sc := schemeOf(tq, shapes[n][1])
		schemes[sc] = append(schemes[sc], n)
	}
	if len(qnames) == 0 {
		rep.Warnings = append(rep.Warnings, "the model has no quantized weights: every tensor is written in its float dtype (run lmpack quantize weights first for pack-quantized weights)")
	}
	if d.Quant != nil && len(qnames) > 0 {
		for _, sc := range slices.Collect(maps.Keys(schemes)) {
			if sc.GroupSize != 0 && !slices.Contains([]int{32, 64, 128}, sc.GroupSize) {
				rep.Warnings = append(rep.Warnings, fmt.Sprintf("group size %d: vLLM's Marlin kernels take groups of 32, 64 and 128 (or per channel); another kernel must serve it", sc.GroupSize))
			}
		}
	}
	if dt := torchDType(raw); dt == "bfloat16" && len(qnames) > 0 {
		rep.Warnings = append(rep.Warnings, "weight_scale is stored F16 (lmpack's scales bit for bit); vLLM casts it to the model's bfloat16 at load, rounding each scale to 8 significant bits")
	}
	if _, ok := s.dtypes[d.LMHead]; ok && d.TieWordEmbeddings {
		rep.Warnings = append(rep.Warnings, fmt.Sprintf("%s is a stored copy of the tied embedding (tie_word_embeddings); it is not written, loaders tie it to %s", d.LMHead, d.Embedding))
	}
	rep.Warnings = append(rep.Warnings, fusedMismatch(d, quant)...)
	if len(schemes) > 1 {
		rep.Warnings = append(rep.Warnings, fmt.Sprintf("%d weight schemes, so %d config groups: the largest targets \"Linear\", the others name their modules", len(schemes), len(schemes)))
	}

	var kv *kvResult
	if opt.KVCalib != "" {
		if kv, err = kvScales(ctx, s, opt); err != nil {
			return nil, err
		}
		rep.Warnings = append(rep.Warnings, kv.note)
	}

	qc, err := quantConfig(d, quant, schemes, kv != nil)
	if err != nil {
		return nil, err
	}
	delete(raw, arch.QuantKey)
	delete(raw, "layer_configs")
	if qc != nil {
		raw["quantization_config"] = qc
	}
	cfg, err := json.MarshalIndent(raw, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("export: config.json: %w", err)
	}
	cfg = append(cfg, '\n')

	// Shards: one per decoder block, then the rest.
	nl := len(d.Layers)
	shard := make([][]safetensors.WriteTensor, nl+1)
	cache := &qcache{src: s.src, quant: quant}
	for _, n := range d.TensorNames() {
		li := nl
		if l, ok := layerOf(n); ok && l < nl {
			li = l
		}
		sh := shapes[n]
		if tq, ok := quant[n]; ok {
			ts, row := quantTensors(ctx, cache, n, sh, tq)
			shard[li] = append(shard[li], ts...)
			rep.Tensors = append(rep.Tensors, row)
			continue
		}
		dt, ok := s.dtypes[n]
		if !ok {
			if n == d.LMHead && d.TieWordEmbeddings {
				continue
			}
			return nil, fmt.Errorf("export: %s: tensor %q: %w", modelPath, n, safetensors.ErrMissingTensor)
		}
		name := n
		shard[li] = append(shard[li], safetensors.WriteTensor{Name: n, DType: dt, Shape: sh, WriteTo: func(w io.Writer) error {
			if err := ctx.Err(); err != nil {
				return err
			}
			t, err := s.src.Tensor(name)
			if err != nil {
				return err
			}
			if i, what := safetensors.FirstNonFinite(t.DType, t.Data); i >= 0 {
				return fmt.Errorf("export: %s: tensor %q (%s): element %d (row-major) is %s; lmpack's runtime refuses non-finite weights and vLLM would run them silently", modelPath, name, t.DType, i, what)
			}
			_, err = w.Write(t.Data)
			return err
		}})
		rep.Tensors = append(rep.Tensors, TensorRow{Name: n, Source: n, Shape: sh, From: string(dt), To: string(dt), Mode: ModeExact, Bytes: int64(numel(sh) * dt.Size())})
	}
	if kv != nil {
		for l := range d.Layers {
			for _, kvn := range []struct {
				name string
				v    float32
			}{{fmt.Sprintf("model.layers.%d.self_attn.k_scale", l), kv.k[l]}, {fmt.Sprintf("model.layers.%d.self_attn.v_scale", l), kv.v[l]}} {
				shard[l] = append(shard[l], safetensors.WriteTensor{Name: kvn.name, DType: safetensors.F32, Shape: []int{}, Data: safetensors.F32Bytes([]float32{kvn.v})})
				rep.Tensors = append(rep.Tensors, TensorRow{Name: kvn.name, Shape: []int{}, From: "calibration " + kv.stat, To: "F32 FP8 scale", Mode: ModeExact, Reason: kv.reason, Bytes: 4})
			}
		}
	}

	err = fsx.WriteDir(opt.Out, func(tmp string) error {
		weightMap := map[string]string{}
		var total int64
		files := 0
		for _, ts := range shard {
			if len(ts) > 0 {
				files++
			}
		}
		k := 0
		for _, ts := range shard {
			if len(ts) == 0 {
				continue
			}
			k++
			fn := fmt.Sprintf("model-%05d-of-%05d.safetensors", k, files)
			for _, t := range ts {
				weightMap[t.Name] = fn
				total += int64(numel(t.Shape) * t.DType.Size())
			}
			if opt.Logger != nil {
				opt.Logger.Info("export shard", "file", fn, "tensors", len(ts))
			}
			if err := safetensors.WriteFile(filepath.Join(tmp, fn), ts, map[string]string{"format": "pt"}); err != nil {
				return err
			}
		}
		if err := safetensors.WriteIndex(filepath.Join(tmp, "model.safetensors.index.json"), total, weightMap); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(tmp, model.ConfigFile), cfg, 0o644); err != nil {
			return err
		}
		if err := s.files(tmp); err != nil {
			return fmt.Errorf("export: side files: %w", err)
		}
		rep.Bytes, err = dirBytes(tmp)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("export: %s: %w", opt.Out, err)
	}
	rep.Finish()
	return rep, nil
}

// qcache holds the one quantized weight being written, so that its four
// or five output tensors (written consecutively: they share a prefix)
// read its storage once.
type qcache struct {
	src   runtime.TensorSource
	quant map[string]arch.TensorQuant
	name  string
	q     *weights.Quantized
}

func (c *qcache) get(name string) (*weights.Quantized, error) {
	if c.name == name {
		return c.q, nil
	}
	q, _, err := runtime.ReadQuantized(c.src, name, c.quant[name])
	if err != nil {
		return nil, err
	}
	c.name, c.q = name, q
	return q, nil
}

// quantTensors returns the compressed-tensors tensors of the quantized
// weight name [rows, cols] and its report row.
func quantTensors(ctx context.Context, c *qcache, name string, sh []int, tq arch.TensorQuant) ([]safetensors.WriteTensor, TensorRow) {
	rows, cols := sh[0], sh[1]
	p := arch.QuantPrefix(name)
	pf := 32 / tq.Bits
	g := cols / tq.GroupSize
	sc := schemeOf(tq, cols)
	get := func() (*weights.Quantized, error) {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		return c.get(name)
	}
	ts := []safetensors.WriteTensor{
		{Name: p + ".weight_packed", DType: safetensors.I32, Shape: []int{rows, ceilDiv(cols, pf)}, WriteTo: func(w io.Writer) error {
			q, err := get()
			if err != nil {
				return err
			}
			return writePacked(w, q)
		}},
		{Name: p + ".weight_scale", DType: safetensors.F16, Shape: []int{rows, g}, WriteTo: func(w io.Writer) error {
			q, err := get()
			if err != nil {
				return err
			}
			b := make([]byte, 2*len(q.Scales))
			for i, h := range q.Scales {
				binary.LittleEndian.PutUint16(b[2*i:], h)
			}
			_, err = w.Write(b)
			return err
		}},
		{Name: p + ".weight_shape", DType: safetensors.I64, Shape: []int{2}, Data: binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64(nil, uint64(rows)), uint64(cols))},
	}
	if !tq.Symmetric {
		ts = append(ts, safetensors.WriteTensor{Name: p + ".weight_zero_point", DType: safetensors.I32, Shape: []int{ceilDiv(rows, pf), g}, WriteTo: func(w io.Writer) error {
			q, err := get()
			if err != nil {
				return err
			}
			return writeZeros(w, q)
		}})
	}
	if tq.Perm {
		ts = append(ts, safetensors.WriteTensor{Name: p + ".weight_g_idx", DType: safetensors.I32, Shape: []int{cols}, WriteTo: func(w io.Writer) error {
			q, err := get()
			if err != nil {
				return err
			}
			gi := make([]byte, 4*cols)
			for j, c := range q.Perm {
				binary.LittleEndian.PutUint32(gi[4*c:], uint32(j/q.GroupSize))
			}
			_, err = w.Write(gi)
			return err
		}})
	}
	sort.Slice(ts, func(i, j int) bool { return ts[i].Name < ts[j].Name })
	var bytes int64
	for _, t := range ts {
		bytes += int64(numel(t.Shape) * t.DType.Size())
	}
	why := "lmpack's codes, fp16 scales and zero-points rewritten bit for bit"
	if tq.Perm {
		why += "; act-order undone (codes in original column order, weight_g_idx gives each column's group)"
	}
	return ts, TensorRow{Name: p + ".weight_packed", Source: name, Shape: []int{rows, cols}, From: sc.String(), To: "pack-quantized " + sc.String(), Mode: ModeExact, Reason: why, Bytes: bytes}
}

// writePacked writes q's codes as compressed-tensors' weight_packed:
// [Rows, ceil(Cols/pf)] int32 little-endian, pf = 32/Bits codes per word
// in original column order, code i of a word in bits [i·Bits, (i+1)·Bits).
func writePacked(w io.Writer, q *weights.Quantized) error {
	pf := 32 / q.Bits
	nw := ceilDiv(q.Cols, pf)
	rb := weights.RowBytes(q.Cols, q.Bits)
	codes := make([]uint32, q.Cols)
	out := make([]byte, 4*nw)
	for r := 0; r < q.Rows; r++ {
		row := q.Codes[r*rb : (r+1)*rb]
		for j := 0; j < q.Cols; j++ {
			c := j
			if q.Perm != nil {
				c = int(q.Perm[j])
			}
			codes[c] = code(row, j, q.Bits)
		}
		clear(out)
		for c, v := range codes {
			k, i := c/pf, c%pf
			cur := binary.LittleEndian.Uint32(out[4*k:])
			binary.LittleEndian.PutUint32(out[4*k:], cur|v<<(uint(i*q.Bits)))
		}
		if _, err := w.Write(out); err != nil {
			return err
		}
	}
	return nil
}

// writeZeros writes q's zero-points as compressed-tensors'
// weight_zero_point: [ceil(Rows/pf), G] int32, pf zero-points of
// consecutive rows per word (pack_to_int32 with packed_dim 0).
func writeZeros(w io.Writer, q *weights.Quantized) error {
	pf := 32 / q.Bits
	g := q.Cols / q.GroupSize
	out := make([]byte, 4*ceilDiv(q.Rows, pf)*g)
	for r := 0; r < q.Rows; r++ {
		k, i := r/pf, r%pf
		for gi := 0; gi < g; gi++ {
			z := safetensors.F16ToFloat32(q.Zeros[r*g+gi])
			v := uint32(z) // an integer in [0, 2^bits−1] (runtime.ReadQuantized checked)
			o := 4 * (k*g + gi)
			binary.LittleEndian.PutUint32(out[o:], binary.LittleEndian.Uint32(out[o:])|v<<uint(i*q.Bits))
		}
	}
	_, err := w.Write(out)
	return err
}

// code returns code j of a row bit stream (docs/QUANT.md: LSB first).
func code(row []byte, j, bits int) uint32 {
	var v uint32
	for b := 0; b < bits; b++ {
		k := j*bits + b
		v |= uint32(row[k/8]>>(k%8)&1) << b
	}
	return v
}

// ctArgs is a config group's "weights" (compressed-tensors
// QuantizationArgs), fields in its order.
type ctArgs struct {
	NumBits        int      `json:"num_bits"`
	Type           string   `json:"type"`
	Symmetric      bool     `json:"symmetric"`
	GroupSize      *int     `json:"group_size"`
	Strategy       string   `json:"strategy"`
	BlockStructure *string  `json:"block_structure"`
	Dynamic        bool     `json:"dynamic"`
	ActOrder       *string  `json:"actorder"`
	Observer       string   `json:"observer"`
	ObserverKwargs struct{} `json:"observer_kwargs"`
}

type ctGroup struct {
	Targets           []string `json:"targets"`
	Weights           *ctArgs  `json:"weights"`
	InputActivations  *ctArgs  `json:"input_activations"`
	OutputActivations *ctArgs  `json:"output_activations"`
	Format            string   `json:"format"`
}

type ctConfig struct {
	ConfigGroups       map[string]ctGroup `json:"config_groups"`
	Format             string             `json:"format"`
	GlobalCompression  *float64           `json:"global_compression_ratio"`
	Ignore             []string           `json:"ignore"`
	KVCacheScheme      *ctArgs            `json:"kv_cache_scheme"`
	QuantMethod        string             `json:"quant_method"`
	QuantizationStatus string             `json:"quantization_status"`
	SparsityConfig     struct{}           `json:"sparsity_config"`
	TransformConfig    *struct{}          `json:"transform_config"`
	Version            string             `json:"version"`
}

// quantConfig builds config.json's quantization_config; nil when the
// model has neither quantized weights nor a KV scheme.
func quantConfig(d *arch.Description, quant map[string]arch.TensorQuant, schemes map[ctScheme][]string, withKV bool) (json.RawMessage, error) {
	if len(quant) == 0 && !withKV {
		return nil, nil
	}
	keys := slices.Collect(maps.Keys(schemes))
	slices.SortFunc(keys, func(a, b ctScheme) int { return strings.Compare(a.String(), b.String()) })
	c := ctConfig{ConfigGroups: map[string]ctGroup{}, Format: "pack-quantized", QuantMethod: "compressed-tensors",
		QuantizationStatus: "compressed", Version: CTVersion, Ignore: []string{}}
	if len(quant) == 0 {
		c.Format = "dense"
	}
	// The scheme with the most weight elements targets "Linear" (vLLM's
	// MoE method looks a fused expert layer up under "Linear"); the others
	// name their modules, which matches them first.
	shapes := d.TensorShapes()
	linear, most := -1, -1
	for i, sc := range keys {
		n := 0
		for _, w := range schemes[sc] {
			n += numel(shapes[w])
		}
		if n > most {
			linear, most = i, n
		}
	}
	for i, sc := range keys {
		a := &ctArgs{NumBits: sc.Bits, Type: "int", Symmetric: sc.Symmetric, Strategy: "channel", Observer: "minmax"}
		if sc.GroupSize > 0 {
			gs := sc.GroupSize
			a.GroupSize, a.Strategy = &gs, "group"
		}
		if sc.ActOrder {
			ao := "group"
			a.ActOrder = &ao
		}
		targets := []string{"Linear"}
		if i != linear {
			targets = nil
			for _, n := range schemes[sc] {
				targets = append(targets, arch.QuantPrefix(n))
			}
		}
		c.ConfigGroups["group_"+strconv.Itoa(i)] = ctGroup{Targets: targets, Weights: a, Format: "pack-quantized"}
	}
	// ignore: every Linear the config groups do not cover (lm_head, the
	// MoE routers, float projections).
	ign := map[string]bool{arch.QuantPrefix(d.LMHead): true}
	for n, sh := range shapes {
		if _, q := quant[n]; q || len(sh) != 2 || n == d.Embedding || !strings.HasSuffix(n, ".weight") {
			continue
		}
		ign[arch.QuantPrefix(n)] = true
	}
	c.Ignore = slices.Sorted(maps.Keys(ign))
	if withKV {
		c.KVCacheScheme = &ctArgs{NumBits: 8, Type: "float", Symmetric: true, Strategy: "tensor", Observer: "minmax"}
	}
	b, err := json.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("export: quantization_config: %w", err)
	}
	return b, nil
}

// fusedMismatch warns where vLLM fuses projections (q/k/v, gate/up) that
// the model quantized differently: vLLM needs one scheme per fused layer.
func fusedMismatch(d *arch.Description, quant map[string]arch.TensorQuant) []string {
	var out []string
	check := func(what string, names ...string) {
		var first *arch.TensorQuant
		for _, n := range names {
			tq, ok := quant[n]
			if first == nil {
				first = &tq
				if !ok {
					first = &arch.TensorQuant{}
				}
				continue
			}
			if !ok {
				tq = arch.TensorQuant{}
			}
			if tq != *first {
				out = append(out, fmt.Sprintf("%s: %s are quantized differently; vLLM fuses them into one layer and needs one scheme (it will refuse to load)", what, strings.Join(names, ", ")))
				return
			}
		}
	}
	for i, l := range d.Layers {
		check(fmt.Sprintf("layer %d attention", i), l.Attn.Q, l.Attn.K, l.Attn.V)
		if l.MLP != nil {
			check(fmt.Sprintf("layer %d mlp", i), l.MLP.Gate, l.MLP.Up)
		}
	}
	return out
}

func torchDType(raw map[string]json.RawMessage) string {
	var s string
	for _, k := range []string{"torch_dtype", "dtype"} {
		if v, ok := raw[k]; ok && json.Unmarshal(v, &s) == nil {
			return s
		}
	}
	return ""
}

// checkUniform fails when config.json's layer_configs (lmpack's
// width-pruning extension) gives a layer head counts or an FFN size other
// than the top-level num_attention_heads, num_key_value_heads and
// intermediate_size (a zero intermediate_size means the top-level one).
// An absent, null or empty list, or one that only repeats the top-level
// values, passes (the key is then dropped).
func checkUniform(raw map[string]json.RawMessage) error {
	lcRaw, ok := raw["layer_configs"]
	if !ok || string(lcRaw) == "null" {
		return nil
	}
	var lcs []arch.LayerConfig
	if err := json.Unmarshal(lcRaw, &lcs); err != nil {
		return err
	}
	var top struct {
		Heads int  `json:"num_attention_heads"`
		KV    *int `json:"num_key_value_heads"`
		Inter int  `json:"intermediate_size"`
	}
	b, _ := json.Marshal(raw)
	if err := json.Unmarshal(b, &top); err != nil {
		return err
	}
	kv := top.Heads
	if top.KV != nil {
		kv = *top.KV
	}
	for i, lc := range lcs {
		inter := lc.IntermediateSize
		if inter == 0 {
			inter = top.Inter
		}
		if lc.NumAttentionHeads != top.Heads || lc.NumKeyValueHeads != kv || inter != top.Inter {
			return fmt.Errorf("layer %d has %d attention heads, %d KV heads and intermediate_size %d, the config %d, %d and %d",
				i, lc.NumAttentionHeads, lc.NumKeyValueHeads, inter, top.Heads, kv, top.Inter)
		}
	}
	return nil
}

// layerOf returns N of a "model.layers.N." tensor name.
func layerOf(name string) (int, bool) {
	const p = "model.layers."
	if !strings.HasPrefix(name, p) {
		return 0, false
	}
	rest := name[len(p):]
	i := strings.IndexByte(rest, '.')
	if i <= 0 {
		return 0, false
	}
	n, err := strconv.Atoi(rest[:i])
	return n, err == nil
}

func dirBytes(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.Type().IsRegular() {
			st, err := e.Info()
			if err != nil {
				return err
			}
			n += st.Size()
		}
		return nil
	})
	return n, err
}

func numel(sh []int) int {
	n := 1
	for _, s := range sh {
		n *= s
	}
	return n
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }
