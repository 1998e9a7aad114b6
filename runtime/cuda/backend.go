package cuda

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/quantize/kvq"
	"github.com/lmpack/lmpack/runtime"
)

// Backend is the CUDA runtime.Backend. The zero value uses device 0 and
// the default kernel cache directory.
type Backend struct {
	// Ordinal is the CUDA device index.
	Ordinal int
	// CacheDir overrides the kernel (PTX/CUBIN) cache directory ("" =
	// default).
	CacheDir string
}

// New returns the CUDA backend on device 0.
func New() runtime.Backend { return Backend{} }

// Name implements runtime.Backend.
func (Backend) Name() string { return "cuda" }

// Probe opens the driver and device ordinal, builds and loads one small
// kernel source the way Load does (same NVRTC and CUBIN/PTX choice, same
// default cache directory) and closes everything again. It returns nil
// when Load can run, else an error wrapping ErrNoDriver, ErrNoDevice,
// ErrNoNVRTC or ErrKernels (say, every NVRTC found is newer than the
// driver) that names what was searched (for --device auto).
func Probe(ordinal int) error {
	d, err := OpenDevice(ordinal)
	if err != nil {
		return err
	}
	k, err := loadKernels(d, "", probeSources())
	if err != nil {
		d.Close()
		return err
	}
	kerr := k.Close()
	if err := d.Close(); err != nil {
		return err
	}
	return kerr
}

// probeSources is the source Probe loads: the smallest embedded one.
func probeSources() []Source {
	all := Sources()
	best := all[0]
	for _, s := range all[1:] {
		if len(s.Code) < len(best.Code) {
			best = s
		}
	}
	return []Source{best}
}

// ErrUnsupported is wrapped when a model uses a feature the CUDA backend
// lacks (a head_dim over 256 or not a multiple of 4, MoE experts of one
// layer with different intermediate sizes, an expert too wide for
// moe_gemv's grid).
var ErrUnsupported = errors.New("cuda: unsupported model")

// dw is a device weight matrix [rows, cols], binary16 or bfloat16 at p,
// or packed (q non-nil, p = 0).
type dw struct {
	p          DevPtr
	bf16       bool
	rows, cols int
	q          *qw
}

// qw is a quantized weight kept packed on the device (docs/QUANT.md
// layout): codes U8 [rows, ⌈cols·bits/8⌉] (bits 1, 2, 3, 4 or 8), scales
// and zeros binary16 [rows, cols/group] (zeros 0 when symmetric; at 1 bit
// fractional), and for act-order weights perm int32 [cols] (storage
// column j holds input column perm[j], weights.Quantized.Perm) with its
// inverse iperm int32 [cols] (both 0 in natural order). Decode rows run
// gemv_q on it (x gathered through perm); prefill dequantizes it with
// dequant_q (columns gathered through iperm, so Ŵ comes out in the
// original column order) into Model.s.deq and runs gemm_f16.
type qw struct {
	codes, scales, zeros DevPtr
	perm, iperm          DevPtr
	bits, group          int
}

type mlpW struct {
	gu, down dw // gu [2I, H] gate rows first, down [H, I]
	inter    int
}

type moeW struct {
	router   dw // [E, H]
	gu, down dw // stacked: gu [E·2I, H], down [E·H, I] (p = 0 when packed)
	// guQ, downQ: the same stacks kept packed (moe_gemv_q), or nil.
	guQ, downQ *moeQW
	inter, E   int
	topK       int
	norm       bool
	// shared is the always-on expert (Qwen2-MoE) or nil; sharedGate its
	// gate row, float32 [H], or 0 (no gate: weight 1).
	shared     *mlpW
	sharedGate DevPtr
}

// moeQW is a stack of quantized expert weights kept packed on the device
// for moe_gemv_q: each expert's rows are `parts` segments (gate and up:
// 2; down: 1), segment s = expert·parts + part being one quantized
// weight whose storage (docs/QUANT.md, quantize/weights.Quantized) is
// concatenated into codes (U8), scales and zeros (binary16) and perm
// (int32), and described by tab (int64 [5·E·parts], moePack's layout).
type moeQW struct {
	codes, scales, zeros, perm, tab DevPtr
	parts                           int
}

type layerW struct {
	attnNorm, ffnNorm DevPtr // f32 [H]
	wqkv, wo          dw
	bqkv, bo          DevPtr // f32 or 0
	qNorm, kNorm      DevPtr // f32 [hd] or 0
	mlp               *mlpW
	moe               *moeW
	nh, nkv, hd       int
	qdim, kvdim, qkv  int
	window            int
}

// Model is a model loaded on the GPU (runtime.Model). Weights are stored
// binary16 (bfloat16 for BF16 tensors and for tensors with |w| > 65504),
// activations float32. Quantized checkpoints (docs/QUANT.md): the
// attention, MLP and lm_head weights that packable accepts stay packed
// (bits/8 bytes per weight plus binary16 scales and zeros per group, and
// 8 bytes per input column for an act-order permutation and its inverse)
// at 1, 2, 3, 4 and 8 bits, with or without an act-order permutation;
// up to 64 rows per call (decode batches; maxGemvQRows) run gemv_q on
// them, and a call of more rows dequantizes each into one binary16
// scratch buffer the size of the
// largest packed weight (2 bytes per element, allocated at the first
// such prefill) before gemm_f16. The others (groups neither a multiple
// of 8 columns nor per channel, stacks whose parts differ in format or
// permutation, |Ŵ| > 65504) are dequantized on the host and stored like
// float weights (2 bytes per weight). Quantized MoE experts stay packed
// when every expert weight of a stack (a layer's gate/up, or its down) is
// quantized, whatever their widths (1, 2, 3, 4 or 8 bits), groups,
// symmetry or act-order permutations (moeStack): moe_gemv_q reads each
// (token, expert) pair's codes through a per-expert offset table, in
// decode and prefill alike, with no binary16 scratch; a stack with an
// unquantized expert is dequantized on the host. Shared experts
// (Qwen2-MoE) are ordinary MLP weights (packable like them) plus their
// float32 sigmoid gate row. Not safe for concurrent Forward calls.
type Model struct {
	d      *arch.Description
	dev    *Device
	k      *Kernels
	embed  dw
	lmHead dw
	final  DevPtr
	layers []layerW
	allocs []DevPtr
	rope   map[int]*ropeDev // by head_dim
	s      scratchDev
	// deqBytes is the binary16 size of the largest packed weight: the
	// prefill scratch s.deq.
	deqBytes int64
	// caches is the memory of the live DeviceCaches, freed by Close.
	cachesMu sync.Mutex
	caches   map[*cacheMem]struct{}
}

var _ runtime.Model = (*Model)(nil)

type ropeDev struct {
	inv      []float64
	cos, sin DevPtr
	n        int // positions covered
}

// Load implements runtime.Backend: it opens the device, compiles or loads
// the kernels, converts and uploads every tensor the description names
// (checked like the CPU backend: errors wrap runtime.ErrBadWeights and
// name the tensor), fusing q/k/v and gate/up. Errors wrapping
// ErrUnsupported: see ErrUnsupported.
func (b Backend) Load(ctx context.Context, d *arch.Description, src runtime.TensorSource, opt runtime.LoadOptions) (runtime.Model, error) {
	if err := d.Validate(); err != nil {
		return nil, err
	}
	for i := range d.Layers {
		l := &d.Layers[i]
		if l.HeadDim%4 != 0 || l.HeadDim > maxHeadDim {
			return nil, fmt.Errorf("%w: layer %d: head_dim %d, want a multiple of 4 up to %d", ErrUnsupported, i, l.HeadDim, maxHeadDim)
		}
		if l.MoE != nil {
			// moe_gemv puts ⌈N/4⌉ output groups on grid.y (≤ 65535).
			for j, x := range l.MoE.Experts {
				if g := moeGemvGrid(1, 1, max(2*x.IntermediateSize, d.HiddenSize)); g.Y > maxGridYZ {
					return nil, fmt.Errorf("%w: layer %d expert %d: intermediate_size %d or hidden_size %d needs %d blocks on grid.y, at most %d", ErrUnsupported, i, j, x.IntermediateSize, d.HiddenSize, g.Y, maxGridYZ)
				}
			}
		}
	}
	dev, err := OpenDevice(b.Ordinal)
	if err != nil {
		return nil, err
	}
	k, err := LoadKernels(dev, b.CacheDir)
	if err != nil {
		dev.Close()
		return nil, err
	}
	m := &Model{d: d, dev: dev, k: k, rope: map[int]*ropeDev{}}
	// Quantized attention, MLP and lm_head weights stay packed on the
	// device when packable (see linear), MoE experts when moePackable;
	// the rest (mixed stacks, |Ŵ| > 65504) are dequantized on the host and
	// uploaded like float ones.
	if err := m.load(ctx, runtime.WithQuant(d, src), src); err != nil {
		m.Close()
		return nil, err
	}
	return m, nil
}

const maxHeadDim = 256

// load uploads the weights: src serves every weight as float (quantized
// ones dequantized), raw the checkpoint's own tensors (for packed
// weights).
func (m *Model) load(ctx context.Context, src, raw runtime.TensorSource) error {
	d := m.d
	H, V := d.HiddenSize, d.VocabSize
	var err error
	if m.embed, err = m.weight(src, []string{d.Embedding}, []int{V}, H); err != nil {
		return err
	}
	if m.final, err = m.vec(src, d.FinalNorm, H); err != nil {
		return err
	}
	m.lmHead = m.embed
	if !d.TieWordEmbeddings {
		if m.lmHead, err = m.linear(src, raw, []string{d.LMHead}, []int{V}, H); err != nil {
			return err
		}
	}
	m.layers = make([]layerW, len(d.Layers))
	for i := range d.Layers {
		if err := ctx.Err(); err != nil {
			return err
		}
		spec := &d.Layers[i]
		l := &m.layers[i]
		l.nh, l.nkv, l.hd, l.window = spec.NumHeads, spec.NumKVHeads, spec.HeadDim, spec.SlidingWindow
		l.qdim, l.kvdim = spec.QDim(), spec.KVDim()
		l.qkv = l.qdim + 2*l.kvdim
		if m.rope[l.hd] == nil {
			m.rope[l.hd] = &ropeDev{inv: runtime.InvFreq(d.RoPE, l.hd)}
		}
		a := spec.Attn
		if l.attnNorm, err = m.vec(src, a.Norm, H); err != nil {
			return err
		}
		if l.ffnNorm, err = m.vec(src, spec.FFNNorm, H); err != nil {
			return err
		}
		if l.wqkv, err = m.linear(src, raw, []string{a.Q, a.K, a.V}, []int{l.qdim, l.kvdim, l.kvdim}, H); err != nil {
			return err
		}
		if a.QBias != "" || a.KBias != "" || a.VBias != "" {
			bias := make([]float32, l.qkv)
			off := 0
			for j, nm := range []string{a.QBias, a.KBias, a.VBias} {
				n := []int{l.qdim, l.kvdim, l.kvdim}[j]
				if nm != "" {
					v, err := loadF32(src, nm, n)
					if err != nil {
						return err
					}
					copy(bias[off:], v)
				}
				off += n
			}
			if l.bqkv, err = m.upload32(bias); err != nil {
				return err
			}
		}
		if l.wo, err = m.linear(src, raw, []string{a.O}, []int{H}, l.qdim); err != nil {
			return err
		}
		if a.OBias != "" {
			if l.bo, err = m.vec(src, a.OBias, H); err != nil {
				return err
			}
		}
		if a.QNorm != "" {
			if l.qNorm, err = m.vec(src, a.QNorm, l.hd); err != nil {
				return err
			}
			if l.kNorm, err = m.vec(src, a.KNorm, l.hd); err != nil {
				return err
			}
		}
		if s := spec.MLP; s != nil {
			l.mlp = &mlpW{inter: s.IntermediateSize}
			if l.mlp.gu, err = m.linear(src, raw, []string{s.Gate, s.Up}, []int{s.IntermediateSize, s.IntermediateSize}, H); err != nil {
				return err
			}
			if l.mlp.down, err = m.linear(src, raw, []string{s.Down}, []int{H}, s.IntermediateSize); err != nil {
				return err
			}
		}
		if mo := spec.MoE; mo != nil {
			e := &moeW{E: mo.NumExperts, topK: mo.TopK, norm: mo.NormTopKProb}
			if e.router, err = m.weight(src, []string{mo.Router}, []int{mo.NumExperts}, H); err != nil {
				return err
			}
			var gu, down []string
			var guRows, downRows []int
			for j := range mo.Experts {
				x := &mo.Experts[j]
				if j == 0 {
					e.inter = x.IntermediateSize
				} else if x.IntermediateSize != e.inter {
					return fmt.Errorf("%w: layer %d: experts differ in intermediate_size", ErrUnsupported, i)
				}
				gu = append(gu, x.Gate, x.Up)
				guRows = append(guRows, x.IntermediateSize, x.IntermediateSize)
				down = append(down, x.Down)
				downRows = append(downRows, H)
			}
			if e.guQ, err = m.moeStack(raw, gu, e.inter, H, 2); err != nil {
				return err
			}
			if e.guQ == nil {
				if e.gu, err = m.weight(src, gu, guRows, H); err != nil {
					return err
				}
			}
			if e.downQ, err = m.moeStack(raw, down, H, e.inter, 1); err != nil {
				return err
			}
			if e.downQ == nil {
				if e.down, err = m.weight(src, down, downRows, e.inter); err != nil {
					return err
				}
			}
			if sh := mo.Shared; sh != nil {
				e.shared = &mlpW{inter: sh.IntermediateSize}
				if e.shared.gu, err = m.linear(src, raw, []string{sh.Gate, sh.Up}, []int{sh.IntermediateSize, sh.IntermediateSize}, H); err != nil {
					return err
				}
				if e.shared.down, err = m.linear(src, raw, []string{sh.Down}, []int{H}, sh.IntermediateSize); err != nil {
					return err
				}
				if mo.SharedGate != "" {
					g, err := loadF32(src, mo.SharedGate, 1, H)
					if err != nil {
						return err
					}
					if e.sharedGate, err = m.upload32(g); err != nil {
						return err
					}
				}
			}
			l.moe = e
		}
	}
	return nil
}

// loadF32 reads tensor name as float32, checking shape and finiteness
// (the CPU backend's rules).
func loadF32(src runtime.TensorSource, name string, want ...int) ([]float32, error) {
	t, err := src.Tensor(name)
	if err != nil {
		if errors.Is(err, safetensors.ErrMissingTensor) {
			return nil, fmt.Errorf("cuda: %w: tensor %q named by config.json is missing: %w", runtime.ErrBadWeights, name, err)
		}
		return nil, fmt.Errorf("cuda: tensor %q: %w", name, err)
	}
	if !slices.Equal(t.Shape, want) {
		return nil, fmt.Errorf("cuda: %w: %s: tensor %q: shape %v, want %v", runtime.ErrBadWeights, t.File, name, t.Shape, want)
	}
	switch t.DType {
	case safetensors.F32, safetensors.F16, safetensors.BF16, safetensors.F64, safetensors.F8E4M3, safetensors.F8E5M2:
	default:
		return nil, fmt.Errorf("cuda: %w: %s: tensor %q: dtype %s, want a float dtype", runtime.ErrBadWeights, t.File, name, t.DType)
	}
	v, err := t.Float32()
	if err != nil {
		return nil, fmt.Errorf("cuda: %s: tensor %q: %w", t.File, name, err)
	}
	for i, x := range v {
		if x-x != 0 {
			return nil, fmt.Errorf("cuda: %w: %s: tensor %q: element %d is not finite (checked at load)", runtime.ErrBadWeights, t.File, name, i)
		}
	}
	return v, nil
}

// linear loads the matmul weight names (stacked row-wise, [rows[i], cols]
// each) packed when packStack accepts them, else as weight does
// (dequantized on the host). Errors: packStack's, weight's, device
// errors.
func (m *Model) linear(src, raw runtime.TensorSource, names []string, rows []int, cols int) (dw, error) {
	h, err := packStack(m.d.Quant, raw, names, rows, cols)
	if err != nil {
		return dw{}, err
	}
	if h == nil {
		return m.weight(src, names, rows, cols)
	}
	w := dw{rows: h.rows, cols: cols, q: &qw{bits: h.bits, group: h.group}}
	up := func(p *DevPtr, n int, v any) error {
		if n == 0 {
			return nil // zeros of a symmetric grid, perm in natural order: null
		}
		var err error
		if *p, err = m.dev.Alloc(int64(n)); err != nil {
			return err
		}
		m.allocs = append(m.allocs, *p)
		switch v := v.(type) {
		case []byte:
			return Upload(m.dev, *p, v)
		case []uint16:
			return Upload(m.dev, *p, v)
		case []int32:
			return Upload(m.dev, *p, v)
		}
		return nil
	}
	for _, u := range []struct {
		p *DevPtr
		n int
		v any
	}{
		{&w.q.codes, len(h.codes), h.codes}, {&w.q.scales, 2 * len(h.scales), h.scales}, {&w.q.zeros, 2 * len(h.zeros), h.zeros},
		{&w.q.perm, 4 * len(h.perm), h.perm}, {&w.q.iperm, 4 * len(h.iperm), h.iperm},
	} {
		if err := up(u.p, u.n, u.v); err != nil {
			return dw{}, err
		}
	}
	m.deqBytes = max(m.deqBytes, 2*int64(h.rows)*int64(cols))
	return w, nil
}

// hostStack is a stack of quantized weights as linear uploads it: codes
// U8 [rows, ⌈cols·bits/8⌉], scales and zeros binary16 bits [rows,
// cols/group] (zeros nil when symmetric), and for act-order weights the
// common permutation perm [cols] (storage column j holds input column
// perm[j]) and its inverse iperm [cols] (both nil in natural order).
type hostStack struct {
	codes             []byte
	scales, zeros     []uint16
	perm, iperm       []int32
	rows, bits, group int
}

// packStack reads the quantized weights names (each [rows[i], cols]) from
// raw and stacks them row-wise for the device when packable(q, names,
// cols) accepts them, every part has the same act-order permutation (GPTQ
// gives q/k/v, and gate/up, the same one: they share the input Hessian)
// and |Ŵ| ≤ 65504 (dequant_q writes binary16). It returns nil, nil when
// the stack must take the host path. Errors: those of
// runtime.ReadQuantized (wrapping runtime.ErrBadWeights, naming the
// tensor), a quantized shape other than [rows[i], cols].
func packStack(q *arch.Quantization, raw runtime.TensorSource, names []string, rows []int, cols int) (*hostStack, error) {
	tq, ok := packable(q, names, cols)
	if !ok {
		return nil, nil
	}
	h := &hostStack{bits: tq.Bits, group: tq.GroupSize}
	for i, n := range names {
		q, file, err := runtime.ReadQuantized(raw, n, tq)
		if err != nil {
			return nil, fmt.Errorf("cuda: %w", err)
		}
		if q.Rows != rows[i] || q.Cols != cols {
			return nil, fmt.Errorf("cuda: %w: %s: quantized weight %q: shape [%d, %d], want [%d, %d]", runtime.ErrBadWeights, file, n, q.Rows, q.Cols, rows[i], cols)
		}
		if qMaxAbs(q.Scales, q.Zeros, q.Bits) > 65504 {
			// dequant_q's binary16 output would overflow: the host path
			// picks bfloat16 instead.
			return nil, nil
		}
		if i == 0 {
			h.perm = q.Perm
		} else if !slices.Equal(q.Perm, h.perm) {
			return nil, nil // one device perm serves the whole stack
		}
		h.codes = append(h.codes, q.Codes...)
		h.scales = append(h.scales, q.Scales...)
		h.zeros = append(h.zeros, q.Zeros...)
		h.rows += rows[i]
	}
	if h.perm != nil {
		h.iperm = make([]int32, cols)
		for j, c := range h.perm {
			h.iperm[c] = int32(j)
		}
	}
	return h, nil
}

// packable reports whether the weights names (each [·, cols]) can stay
// packed on the device, and their common quantization: every one is in
// q.Tensors with the same bits, group size, symmetry and act-order flag
// (linear further checks that the permutations themselves are equal),
// bits 1, 2, 3, 4 or 8 (gemv_q's and dequant_q's) and a group size that
// is a multiple of 8 or cols (gemv_q reads 8 codes per group).
func packable(q *arch.Quantization, names []string, cols int) (arch.TensorQuant, bool) {
	if q == nil || len(names) == 0 {
		return arch.TensorQuant{}, false
	}
	tq, ok := q.Tensors[names[0]]
	if !ok {
		return tq, false
	}
	for _, n := range names[1:] {
		if t, ok := q.Tensors[n]; !ok || t != tq {
			return tq, false
		}
	}
	switch tq.Bits {
	case 1, 2, 3, 4, 8:
	default:
		return tq, false
	}
	if tq.GroupSize <= 0 || (tq.GroupSize%8 != 0 && tq.GroupSize != cols) {
		return tq, false
	}
	return tq, true
}

// qMaxAbs bounds |Ŵ| = scale·|code − zero| over a packed weight's groups
// (scales and zeros binary16 bits, zeros nil: 2^(bits−1)): scale·
// max(z, maxq − z), which is max(|0 − z|, |maxq − z|) also for the
// fractional, possibly negative or > 1, 1-bit zero-points.
func qMaxAbs(scales, zeros []uint16, bits int) float64 {
	maxq := float64(int(1)<<bits - 1)
	worst := 0.0
	for i, h := range scales {
		z := float64(int(1) << (bits - 1))
		if zeros != nil {
			z = float64(kvq.F16ToFloat32(zeros[i]))
		}
		worst = max(worst, float64(kvq.F16ToFloat32(h))*max(z, maxq-z))
	}
	return worst
}

// weight loads tensors names[i] ([rows[i], cols] each), stacks them
// row-wise and uploads them as binary16, or bfloat16 when any part is
// BF16 or holds |w| > 65504.
func (m *Model) weight(src runtime.TensorSource, names []string, rows []int, cols int) (dw, error) {
	var all []float32
	bf := false
	total := 0
	for i, n := range names {
		v, err := loadF32(src, n, rows[i], cols)
		if err != nil {
			return dw{}, err
		}
		if t, err := src.Tensor(n); err == nil && t.DType == safetensors.BF16 {
			bf = true
		}
		all = append(all, v...)
		total += rows[i]
	}
	for _, x := range all {
		if x > 65504 || x < -65504 {
			bf = true
			break
		}
	}
	h := make([]uint16, len(all))
	for i, x := range all {
		if bf {
			h[i] = bf16FromFloat32(x)
		} else {
			h[i] = kvq.F16FromFloat32(x)
		}
	}
	p, err := m.dev.Alloc(int64(2 * len(h)))
	if err != nil {
		return dw{}, err
	}
	m.allocs = append(m.allocs, p)
	if err := Upload(m.dev, p, h); err != nil {
		return dw{}, err
	}
	return dw{p: p, bf16: bf, rows: total, cols: cols}, nil
}

// bf16FromFloat32 rounds f to bfloat16 bits (nearest even; NaN quiet).
func bf16FromFloat32(f float32) uint16 {
	b := math.Float32bits(f)
	if f != f {
		return uint16(b>>16) | 0x40
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// vec loads a float32 vector [n] onto the device.
func (m *Model) vec(src runtime.TensorSource, name string, n int) (DevPtr, error) {
	v, err := loadF32(src, name, n)
	if err != nil {
		return 0, err
	}
	return m.upload32(v)
}

func (m *Model) upload32(v []float32) (DevPtr, error) {
	p, err := m.dev.Alloc(int64(4 * len(v)))
	if err != nil {
		return 0, err
	}
	m.allocs = append(m.allocs, p)
	return p, Upload(m.dev, p, v)
}

// Description implements runtime.Model.
func (m *Model) Description() *arch.Description { return m.d }

// SetObserver implements runtime.Model. The CUDA backend has no
// calibration hooks: o must be nil (a non-nil observer is ignored and
// calibration must use the CPU backend).
func (m *Model) SetObserver(o any) {}

// Close implements runtime.Model: it frees the device memory (the
// weights, scratch and every DeviceCache this model made that is not
// freed yet), the kernels and the device thread, and returns the errors
// met (joined); the caches must not be used afterwards.
func (m *Model) Close() error {
	if m.dev == nil {
		return nil
	}
	var errs []error
	note := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	m.cachesMu.Lock()
	for cm := range m.caches {
		note(cm.free())
	}
	m.caches = nil
	m.cachesMu.Unlock()
	for _, p := range m.allocs {
		note(m.dev.Free(p))
	}
	m.allocs = nil
	note(m.s.free(m.dev))
	for _, r := range m.rope {
		note(m.dev.Free(r.cos))
		note(m.dev.Free(r.sin))
		r.cos, r.sin, r.n = 0, 0, 0
	}
	if m.k != nil {
		note(m.k.Close())
	}
	note(m.dev.Close())
	m.dev = nil
	return errors.Join(errs...)
}

// ensureRope grows the cos/sin tables of every head_dim to n positions.
func (m *Model) ensureRope(n int) error {
	for hd, r := range m.rope {
		if n <= r.n {
			continue
		}
		half := hd / 2
		cs := make([]float32, n*half)
		sn := make([]float32, n*half)
		for p := 0; p < n; p++ {
			for i, inv := range r.inv {
				a := float64(p) * inv
				cs[p*half+i] = float32(math.Cos(a))
				sn[p*half+i] = float32(math.Sin(a))
			}
		}
		ferr := errors.Join(m.dev.Free(r.cos), m.dev.Free(r.sin))
		r.cos, r.sin, r.n = 0, 0, 0
		if ferr != nil {
			return ferr
		}
		var err error
		if r.cos, err = m.dev.Alloc(int64(4 * len(cs))); err != nil {
			return err
		}
		if r.sin, err = m.dev.Alloc(int64(4 * len(sn))); err != nil {
			return err
		}
		if err := Upload(m.dev, r.cos, cs); err != nil {
			return err
		}
		if err := Upload(m.dev, r.sin, sn); err != nil {
			return err
		}
		r.n = n
	}
	return nil
}
