package runtime

import (
	"context"
	"math"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/runtime/kernels"
)

// NewCPU returns the pure-Go CPU backend.
func NewCPU() Backend { return cpuBackend{} }

type cpuBackend struct{}

func (cpuBackend) Name() string { return "cpu" }

// cpuMLP is a SwiGLU FFN with gate and up fused: gu [2I, H] (gate rows
// first), down [H, I].
type cpuMLP struct {
	gu, down linear
	inter    int
}

type cpuMoE struct {
	router     []float32 // [E, H]
	experts    []cpuMLP
	shared     *cpuMLP
	sharedGate []float32 // [H] or nil
	topK       int
	norm       bool
}

type cpuLayer struct {
	spec            *arch.Layer
	attnNorm        []float32 // [H]
	ffnNorm         []float32 // [H]
	wqkv            linear    // [qdim+2*kvdim, H]
	bqkv            []float32 // [qdim+2*kvdim] or nil
	wo              linear    // [H, qdim]
	bo              []float32 // [H] or nil
	qNorm, kNorm    []float32 // [head_dim] or nil
	mlp             *cpuMLP
	moe             *cpuMoE
	rope            *ropeTable
	qdim, kvdim, hd int
	nh, nkv, window int
	qkvdim          int
}

type cpuModel struct {
	d         *arch.Description
	pool      *kernels.Pool
	embed     []float32 // [V, H], or nil when embedH is set
	finalNorm []float32 // [H]
	lmHead    linear    // [V, H]
	layers    []cpuLayer
	s         scratch
	attn      attnTask

	// The sequences of the running call (batch_cpu.go): their rows are
	// [bs[i].r0, bs[i].r0+bs[i].T) of the activations, rows in all.
	bs   []batchSeq
	rows int
	one  [1]Seq // Forward's sequence, kept here so that Forward allocates nothing

	// Packed matmuls (qlinear.go): the task and, per pool thread, the
	// tile scratch [qScratchFloats(max k)], code and row scratch [max k].
	qmm    qmmTask
	qbuf   [][]float32
	qcodes [][]uint8
	qrow   [][]float32

	obsBlock   BlockObserver
	obsQKV     QKVObserver
	obsRouter  RouterObserver
	obsFFN     FFNObserver
	obsAttn    AttnObserver
	obsAttnOut AttnOutputObserver

	// groupMask[layer][kv] silences GQA groups (headmask.go); nil: none.
	groupMask [][]bool

	// perBlock: the blocks' float linear weights are converted one block
	// at a time (LoadOptions.ConvertPerBlock) into blockBuf [largest
	// block's weights] (blockweights.go).
	perBlock bool
	blockBuf []float32

	// embedH: a BF16/F16 embedding [V, H] used in place (halflinear.go),
	// or nil (embed is set).
	embedH *halfLinear
}

var _ Model = (*cpuModel)(nil)

// Load implements Backend. It converts every tensor to float32, checks
// shapes and finiteness, and fuses q/k/v and gate/up into single matrices.
// Quantized weights of the attention projections, MLPs, experts and
// lm_head stay packed (qlinear.go) unless opt.DequantizeWeights; any other
// quantized weight is dequantized (quantized.go). BF16/F16 linear weights
// and embedding stay src's 16-bit data (halflinear.go) unless
// opt.DequantizeWeights. With opt.ConvertPerBlock the decoder blocks' float linear weights stay src's
// tensors and are converted when their block runs (blockweights.go).
func (cpuBackend) Load(ctx context.Context, d *arch.Description, src TensorSource, opt LoadOptions) (Model, error) {
	if err := d.Validate(); err != nil {
		return nil, err
	}
	H, V := d.HiddenSize, d.VocabSize
	m := &cpuModel{d: d}
	raw := src
	src = WithQuant(d, src) // quantized weights are dequantized (quantized.go)
	packed := !opt.DequantizeWeights
	lin := func(cols int, names []string, rows []int) (linear, error) {
		if !opt.DequantizeWeights && !anyPacked(d, packed, names) {
			// BF16/F16 weights stay in place (halflinear.go).
			if w, ok, err := loadHalfLinear(src, cols, names, rows); ok || err != nil {
				return w, err
			}
		}
		return loadLinear(d, src, raw, packed, cols, names, rows)
	}
	m.perBlock = opt.ConvertPerBlock
	// blin loads a decoder block's linear weight: per block when asked
	// and none of names is kept packed.
	blin := func(cols int, names []string, rows []int) (linear, error) {
		if m.perBlock && !anyPacked(d, packed, names) {
			return loadBlockLinear(src, cols, names, rows)
		}
		return lin(cols, names, rows)
	}
	loadMLP := func(s *arch.MLP) (*cpuMLP, error) {
		gu, err := blin(H, []string{s.Gate, s.Up}, []int{s.IntermediateSize, s.IntermediateSize})
		if err != nil {
			return nil, err
		}
		down, err := blin(s.IntermediateSize, []string{s.Down}, []int{H})
		if err != nil {
			return nil, err
		}
		return &cpuMLP{gu: gu, down: down, inter: s.IntermediateSize}, nil
	}
	var err error
	if opt.DequantizeWeights {
		m.embed, err = loadF32(src, d.Embedding, V, H)
	} else {
		m.embed, err = loadEmbedding(m, src, d.Embedding, V, H)
	}
	if err != nil {
		return nil, err
	}
	if m.finalNorm, err = loadF32(src, d.FinalNorm, H); err != nil {
		return nil, err
	}
	m.lmHead = linear{f: m.embed, h: m.embedH}
	if !d.TieWordEmbeddings {
		if m.lmHead, err = lin(H, []string{d.LMHead}, []int{V}); err != nil {
			return nil, err
		}
	}
	ropes := map[int]*ropeTable{}
	m.layers = make([]cpuLayer, len(d.Layers))
	for i := range d.Layers {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		spec := &d.Layers[i]
		l := &m.layers[i]
		l.spec = spec
		l.nh, l.nkv, l.hd, l.window = spec.NumHeads, spec.NumKVHeads, spec.HeadDim, spec.SlidingWindow
		l.qdim, l.kvdim = spec.QDim(), spec.KVDim()
		l.qkvdim = l.qdim + 2*l.kvdim
		if ropes[l.hd] == nil {
			ropes[l.hd] = newRopeTable(d.RoPE, l.hd)
		}
		l.rope = ropes[l.hd]
		a := spec.Attn
		if l.attnNorm, err = loadF32(src, a.Norm, H); err != nil {
			return nil, err
		}
		if l.ffnNorm, err = loadF32(src, spec.FFNNorm, H); err != nil {
			return nil, err
		}
		if l.wqkv, err = blin(H, []string{a.Q, a.K, a.V}, []int{l.qdim, l.kvdim, l.kvdim}); err != nil {
			return nil, err
		}
		if a.QBias != "" || a.KBias != "" || a.VBias != "" {
			l.bqkv = make([]float32, l.qkvdim)
			off := 0
			for j, nm := range []string{a.QBias, a.KBias, a.VBias} {
				n := []int{l.qdim, l.kvdim, l.kvdim}[j]
				if nm != "" {
					b, err := loadF32(src, nm, n)
					if err != nil {
						return nil, err
					}
					copy(l.bqkv[off:], b)
				}
				off += n
			}
		}
		if l.wo, err = blin(l.qdim, []string{a.O}, []int{H}); err != nil {
			return nil, err
		}
		if a.OBias != "" {
			if l.bo, err = loadF32(src, a.OBias, H); err != nil {
				return nil, err
			}
		}
		if a.QNorm != "" {
			if l.qNorm, err = loadF32(src, a.QNorm, l.hd); err != nil {
				return nil, err
			}
			if l.kNorm, err = loadF32(src, a.KNorm, l.hd); err != nil {
				return nil, err
			}
		}
		if spec.MLP != nil {
			if l.mlp, err = loadMLP(spec.MLP); err != nil {
				return nil, err
			}
		}
		if mo := spec.MoE; mo != nil {
			e := &cpuMoE{topK: mo.TopK, norm: mo.NormTopKProb}
			if e.router, err = loadF32(src, mo.Router, mo.NumExperts, H); err != nil {
				return nil, err
			}
			for j := range mo.Experts {
				x, err := loadMLP(&mo.Experts[j])
				if err != nil {
					return nil, err
				}
				e.experts = append(e.experts, *x)
			}
			if mo.Shared != nil {
				if e.shared, err = loadMLP(mo.Shared); err != nil {
					return nil, err
				}
			}
			if mo.SharedGate != "" {
				if e.sharedGate, err = loadF32(src, mo.SharedGate, 1, H); err != nil {
					return nil, err
				}
			}
			l.moe = e
		}
		if m.perBlock {
			if err := m.checkBlock(l); err != nil {
				return nil, err
			}
		}
	}
	m.pool = kernels.NewPool(opt.Threads)
	m.attn.m = m
	m.allocPacked()
	return m, nil
}

// linears calls f on every linear weight of the model.
func (m *cpuModel) linears(f func(*linear)) {
	f(&m.lmHead)
	mlp := func(x *cpuMLP) {
		if x != nil {
			f(&x.gu)
			f(&x.down)
		}
	}
	for i := range m.layers {
		l := &m.layers[i]
		f(&l.wqkv)
		f(&l.wo)
		mlp(l.mlp)
		if l.moe != nil {
			for j := range l.moe.experts {
				mlp(&l.moe.experts[j])
			}
			mlp(l.moe.shared)
		}
	}
}

// allocPacked sizes the per-thread scratch of packed matmuls (none when
// no weight is packed).
func (m *cpuModel) allocPacked() {
	maxK := 0
	m.linears(func(w *linear) {
		if w.p != nil {
			maxK = max(maxK, w.p.k)
		}
	})
	if maxK == 0 {
		return
	}
	th := m.pool.Threads()
	m.qbuf, m.qcodes, m.qrow = make([][]float32, th), make([][]uint8, th), make([][]float32, th)
	for i := range m.qbuf {
		m.qbuf[i] = make([]float32, qScratchFloats(maxK))
		m.qcodes[i] = make([]uint8, maxK)
		m.qrow[i] = make([]float32, maxK)
	}
}

// weightBytes returns the resident bytes of the model's linear weights
// (lm_head counted only when untied).
func (m *cpuModel) weightBytes() int64 {
	var b int64
	m.linears(func(w *linear) { b += w.bytes() })
	if m.d.TieWordEmbeddings {
		b -= m.lmHead.bytes()
	}
	return b
}

// loadConcat loads tensors [rows[i], cols] and stacks them row-wise.
func loadConcat(src TensorSource, cols int, names []string, rows []int) ([]float32, error) {
	// Load (and so shape-check) every part before allocating the result: a
	// huge size in config.json must fail as a shape mismatch, not as an
	// allocation.
	parts := make([][]float32, len(names))
	total := 0
	for i, n := range names {
		w, err := loadF32(src, n, rows[i], cols)
		if err != nil {
			return nil, err
		}
		parts[i] = w
		total += len(w)
	}
	out := make([]float32, 0, total)
	for _, w := range parts {
		out = append(out, w...)
	}
	return out, nil
}

func (m *cpuModel) Description() *arch.Description { return m.d }

func (m *cpuModel) Close() error {
	m.pool.Close()
	return nil
}

// NewCache implements Model with an F32Cache.
func (m *cpuModel) NewCache(capacity int) KVCache {
	kv := make([]int, len(m.layers))
	hd := make([]int, len(m.layers))
	for i := range m.layers {
		kv[i], hd[i] = m.layers[i].kvdim, m.layers[i].hd
		m.layers[i].rope.ensure(capacity)
	}
	return NewF32Cache(kv, hd, capacity)
}

// SetObserver implements Model.
func (m *cpuModel) SetObserver(o any) {
	m.obsBlock, _ = o.(BlockObserver)
	m.obsQKV, _ = o.(QKVObserver)
	m.obsRouter, _ = o.(RouterObserver)
	m.obsFFN, _ = o.(FFNObserver)
	m.obsAttn, _ = o.(AttnObserver)
	m.obsAttnOut, _ = o.(AttnOutputObserver)
}

// scratch holds the activations of one Forward or ForwardBatch call (T
// rows: every sequence's new tokens); it grows to the
// largest call seen and is reused, so steady-state decode allocates nothing.
type scratch struct {
	T, ctx    int
	x, xn     []float32 // [T, H]
	qkv       []float32 // [T, max qkvdim]
	k, v      []float32 // [T, max kvdim]
	att       []float32 // [T, max qdim]
	scores    []float32 // [max heads, min(T, attnBlock)*ctx]
	kr, vr    []float32 // [max kv heads, ctx*head_dim] for caches without F32KV (splitKV)
	kw, vw    []float32 // [ctx*head_dim] one head's rows before the Write (splitKV)
	kvaS      []float32 // [heads, KVAttender scratch] (splitKV, attnTask)
	gu        []float32 // [T, 2*max I]
	h         []float32 // [T, max I] (observer copy)
	out       []float32 // [T, H]
	moeX      []float32 // [T, H]
	moeY      []float32 // [T, H]
	moeLogits []float32 // [T, E]
	moeSel    []int32   // [T, K]
	moeW      []float32 // [T, K]
	moeP      []float32 // [E]
	moeTok    [][]int32 // [E][<=T]
	moeWt     [][]float32
	logitsRow []float32 // [T, H]
	logits    []float32 // [T, V] when several sequences want logits
}

func grow(b []float32, n int) []float32 {
	if cap(b) < n {
		return make([]float32, n)
	}
	return b[:n]
}

func (m *cpuModel) ensureScratch(T, ctxLen int) {
	s := &m.s
	if T <= s.T && ctxLen <= s.ctx {
		return
	}
	T, ctxLen = max(T, s.T), max(ctxLen, s.ctx)
	H := m.d.HiddenSize
	var qkv, kvd, qd, inter, heads, kvh, hd, E, K int
	for i := range m.layers {
		l := &m.layers[i]
		qkv, kvd, qd = max(qkv, l.qkvdim), max(kvd, l.kvdim), max(qd, l.qdim)
		heads, kvh, hd = max(heads, l.nh), max(kvh, l.nkv), max(hd, l.hd)
		if l.mlp != nil {
			inter = max(inter, l.mlp.inter)
		}
		if l.moe != nil {
			E, K = max(E, len(l.moe.experts)), max(K, l.moe.topK)
			for _, e := range l.moe.experts {
				inter = max(inter, e.inter)
			}
			if l.moe.shared != nil {
				inter = max(inter, l.moe.shared.inter)
			}
		}
	}
	s.T, s.ctx = T, ctxLen
	s.x, s.xn = grow(s.x, T*H), grow(s.xn, T*H)
	s.qkv = grow(s.qkv, T*qkv)
	s.k, s.v = grow(s.k, T*kvd), grow(s.v, T*kvd)
	s.att = grow(s.att, T*qd)
	s.scores = grow(s.scores, heads*min(T, attnBlock)*ctxLen)
	s.kr, s.vr = grow(s.kr, kvh*ctxLen*hd), grow(s.vr, kvh*ctxLen*hd)
	s.gu = grow(s.gu, T*2*inter)
	s.h = grow(s.h, T*inter)
	s.out = grow(s.out, T*H)
	s.logitsRow = grow(s.logitsRow, T*H)
	if E > 0 {
		s.moeX, s.moeY = grow(s.moeX, T*H), grow(s.moeY, T*H)
		s.moeLogits = grow(s.moeLogits, T*E)
		s.moeSel = make([]int32, T*K)
		s.moeW = grow(s.moeW, T*K)
		s.moeP = grow(s.moeP, E)
		s.moeTok = make([][]int32, E)
		s.moeWt = make([][]float32, E)
		for e := range s.moeTok {
			s.moeTok[e] = make([]int32, 0, T)
			s.moeWt[e] = make([]float32, 0, T)
		}
	}
}

// attention runs the attention half of block li on the rows of the call's
// sequences m.bs, x [T, H] with T = m.rows (in place: x += attn): the
// linear maps once over all rows, RoPE at each row's own position, the
// attention itself per sequence against its own cache (attendSeq).
func (m *cpuModel) attention(li int, l *cpuLayer, eps float32) {
	s := &m.s
	H := m.d.HiddenSize
	T, pos := m.rows, m.bs[0].pos // pos: for the observers (one sequence)
	x, xn := s.x[:T*H], s.xn[:T*H]
	for i := 0; i < T; i++ {
		kernels.RMSNorm(xn[i*H:(i+1)*H], x[i*H:(i+1)*H], l.attnNorm, eps)
	}
	if m.obsAttn != nil {
		m.obsAttn.AttnInput(li, pos, T, xn)
	}
	qkv := s.qkv[:T*l.qkvdim]
	m.matMul(T, l.qkvdim, H, xn, H, &l.wqkv, qkv, l.qkvdim)
	k, v := s.k[:T*l.kvdim], s.v[:T*l.kvdim]
	for i, si := 0, 0; i < T; i++ {
		for i >= m.bs[si].r0+m.bs[si].T {
			si++
		}
		p0 := m.bs[si].pos + i - m.bs[si].r0 // the row's position in its sequence
		row := qkv[i*l.qkvdim : (i+1)*l.qkvdim]
		if l.bqkv != nil {
			for j, b := range l.bqkv {
				row[j] += b
			}
		}
		q := row[:l.qdim]
		kr := row[l.qdim : l.qdim+l.kvdim]
		if l.qNorm != nil {
			for h := 0; h < l.nh; h++ {
				kernels.RMSNorm(q[h*l.hd:(h+1)*l.hd], q[h*l.hd:(h+1)*l.hd], l.qNorm, eps)
			}
			for h := 0; h < l.nkv; h++ {
				kernels.RMSNorm(kr[h*l.hd:(h+1)*l.hd], kr[h*l.hd:(h+1)*l.hd], l.kNorm, eps)
			}
		}
		l.rope.apply(q, l.nh, p0)
		l.rope.apply(kr, l.nkv, p0)
		copy(k[i*l.kvdim:(i+1)*l.kvdim], kr)
		copy(v[i*l.kvdim:(i+1)*l.kvdim], row[l.qdim+l.kvdim:])
	}
	if m.obsQKV != nil {
		// q is strided inside qkv; hand the observer a contiguous copy.
		q := s.att[:T*l.qdim]
		for i := 0; i < T; i++ {
			copy(q[i*l.qdim:(i+1)*l.qdim], qkv[i*l.qkvdim:])
		}
		m.obsQKV.QKV(li, pos, T, q, k, v)
	}
	for si := range m.bs {
		m.attendSeq(li, l, &m.bs[si])
	}
	if m.groupMask != nil || m.obsAttnOut != nil {
		m.attnOutputHook(li, l, pos, T)
	}

	att := s.att[:T*l.qdim]
	if m.obsAttn != nil {
		m.obsAttn.OProjInput(li, pos, T, att)
	}
	out := s.out[:T*H]
	m.matMul(T, H, l.qdim, att, l.qdim, &l.wo, out, H)
	for i := range x {
		x[i] += out[i]
	}
	if l.bo != nil {
		for i := 0; i < T; i++ {
			r := x[i*H : (i+1)*H]
			for j, b := range l.bo {
				r[j] += b
			}
		}
	}
}

// attendSeq writes sequence bq's fresh keys and values (its rows of m.s.k,
// m.s.v) into its cache and computes its rows of m.s.att from its rows of
// m.s.qkv: attention over the sequence's own cache only, exactly as when
// the sequence runs alone.
func (m *cpuModel) attendSeq(li int, l *cpuLayer, bq *batchSeq) {
	s := &m.s
	pos, T, cache := bq.pos, bq.T, bq.cache
	k, v := s.k[bq.r0*l.kvdim:(bq.r0+T)*l.kvdim], s.v[bq.r0*l.kvdim:(bq.r0+T)*l.kvdim]
	n := pos + T
	t := &m.attn
	t.l, t.pos, t.T, t.n, t.r0 = l, pos, T, n, bq.r0
	t.scale = float32(1 / math.Sqrt(float64(l.hd)))
	t.ext, t.ra = 0, 0
	if f, ok := cache.(F32KV); ok {
		// float32 storage: the stored rows are the fresh ones.
		cache.Write(li, pos, T, k, v)
		t.k, t.v = f.F32(li)
		t.ldkv = l.kvdim
		t.direct = true
		t.nk = n
		t.kva = nil
	} else {
		m.splitKV(li, l, pos, T, cache, k, v)
	}
	if t.kva != nil && T == 1 {
		// Decode through a KVAttender: one call per kv head for all the
		// query heads of its GQA group, so the packed rows are decoded
		// once per kv head, as Read does.
		m.pool.Run(l.nkv, kvDecodeTask{t})
		return
	}
	m.pool.Run(l.nh, t)
}

// kvDecodeTask is attnTask for one query (T = 1) through a KVAttender,
// over a range of kv heads.
type kvDecodeTask struct{ t *attnTask }

func (d kvDecodeTask) Run(lo, hi int) {
	t := d.t
	s := &t.m.s
	l := t.l
	hd, pos, n := l.hd, t.pos, t.n // n = pos+1 = t.nk (no extension rows for T = 1)
	group := l.nh / l.nkv
	p0 := 0
	if w := l.window; w > 0 {
		p0 = min(pos, max(0, pos-w+1))
	}
	for g := lo; g < hi; g++ {
		h0 := g * group
		K, V := t.k[g*n*hd:(g+1)*n*hd], t.v[g*n*hd:(g+1)*n*hd]
		q := s.qkv[t.r0*l.qkvdim+h0*hd:]
		sc := s.scores[h0*n : (h0+group)*n]
		out := s.att[t.r0*l.qdim+h0*hd:]
		scr := s.kvaS[g*t.kvaN : (g+1)*t.kvaN]
		if p0 < pos {
			t.kva.Scores(t.li, g, p0, pos, group, q, hd, sc[p0:], n, scr)
		}
		for j := 0; j < group; j++ {
			row := sc[j*n : (j+1)*n]
			qh := q[j*hd : (j+1)*hd]
			row[pos] = kernels.Dot(qh, K[pos*hd:(pos+1)*hd])
			clear(row[:p0])
			vis := row[p0:n]
			kernels.SoftmaxScaled(t.scale, vis)
			o := out[j*hd : (j+1)*hd]
			clear(o)
			kernels.Axpy(row[pos], V[pos*hd:(pos+1)*hd], o)
		}
		if p0 < pos {
			t.kva.AccumV(t.li, g, p0, pos, group, sc[p0:], n, out, hd, scr)
		}
	}
}

// attnTask computes softmax(q·Kᵀ/√d + mask)·V for a range of heads.
type attnTask struct {
	m         *cpuModel
	l         *cpuLayer
	pos, T, n int
	r0        int // the sequence's first row in m.s.qkv and m.s.att
	scale     float32
	k, v      []float32
	ldkv      int
	direct    bool
	// nk is the number of key rows per kv head in k, v: n, or n+ext when
	// rows [n, n+ext) hold positions [ra, ra+ext) of earlier calls in the
	// fp16 window they had before this call's Write (splitKV); qend[i] is
	// where query i stops reading earlier tokens quantized (rows < pos)
	// and reads them from those rows instead.
	nk, ra, ext int
	qend        []int
	// kva, when set, serves positions [0, pos) (rows [0, pos) of k, v
	// are then not filled); kvaN is its scratch per head in m.s.kvaS.
	kva  KVAttender
	li   int
	kvaN int
}

// attnBlock is the number of queries whose attention scores are held at
// once per head: scratch is heads×attnBlock×ctx floats instead of
// heads×T×ctx, and causal prefill only scores the keys a block can see.
const attnBlock = 64

func (t *attnTask) Run(lo, hi int) {
	s := &t.m.s
	l := t.l
	T, n, nk, hd := t.T, t.n, t.nk, l.hd
	group := l.nh / l.nkv
	blk := min(T, attnBlock)
	for h := lo; h < hi; h++ {
		g := h / group
		var K, V []float32
		if t.direct {
			K, V = t.k[g*hd:], t.v[g*hd:]
		} else {
			K, V = t.k[g*nk*hd:(g+1)*nk*hd], t.v[g*nk*hd:(g+1)*nk*hd]
		}
		for i0 := 0; i0 < T; i0 += blk {
			tb := min(blk, T-i0)
			nv := t.pos + i0 + tb // keys visible to the block's last query
			if t.ext > 0 {
				nv = nk // and the extension rows
			}
			sc := s.scores[h*blk*nk : h*blk*nk+tb*nv]
			q := s.qkv[(t.r0+i0)*l.qkvdim+h*hd:]
			p0 := 0 // the first earlier position some query of the block sees
			if t.kva != nil {
				if w := l.window; w > 0 {
					p0 = min(t.pos, max(0, t.pos+i0-w+1))
				}
				scr := s.kvaS[h*t.kvaN : (h+1)*t.kvaN]
				for i := 0; i < tb; i++ {
					clear(sc[i*nv : i*nv+p0])
				}
				if p0 < t.pos {
					t.kva.Scores(t.li, g, p0, t.pos, tb, q, l.qkvdim, sc[p0:], nv, scr)
				}
				kernels.MatMulNT(tb, nv-t.pos, hd, q, l.qkvdim, K[t.pos*hd:], t.ldkv, sc[t.pos:], nv)
			} else {
				kernels.MatMulNT(tb, nv, hd, q, l.qkvdim, K, t.ldkv, sc, nv)
			}
			for i := 0; i < tb; i++ {
				p := t.pos + i0 + i // the query's position: keys [lo, p] are visible
				lo := 0
				if l.window > 0 && p-l.window+1 > 0 {
					lo = p - l.window + 1
				}
				row := sc[i*nv : (i+1)*nv]
				if t.ext == 0 {
					clear(row[:lo])
					clear(row[p+1:])
					vis := row[lo : p+1]
					kernels.SoftmaxScaled(t.scale, vis)
					continue
				}
				// Earlier tokens [ra, ra+ext) are read quantized (rows
				// < pos) below qe and from the fp16 rows n+j−ra from qe on.
				qe, re := t.qend[i0+i], t.ra+t.ext
				rs := [4][2]int{
					{lo, max(lo, qe)},
					{max(lo, re), max(lo, t.pos)},
					{max(lo, t.pos), p + 1},
					{n + max(qe, lo) - t.ra, nk},
				}
				softmaxRanges(row, rs[:], t.scale)
			}
			out := s.att[(t.r0+i0)*l.qdim+h*hd:]
			if t.kva != nil {
				kernels.MatMulNN(tb, hd, nv-t.pos, sc[t.pos:], nv, V[t.pos*hd:], t.ldkv, out, l.qdim)
				if p0 < t.pos {
					t.kva.AccumV(t.li, g, p0, t.pos, tb, sc[p0:], nv, out, l.qdim, s.kvaS[h*t.kvaN:(h+1)*t.kvaN])
				}
				continue
			}
			kernels.MatMulNN(tb, hd, nv, sc, nv, V, t.ldkv, out, l.qdim)
		}
	}
}

// softmaxRanges scales by scale and applies softmax over the union of the
// ascending, disjoint column ranges rs of row (empty ranges allowed) and
// zeroes every other column.
func softmaxRanges(row []float32, rs [][2]int, scale float32) {
	off := 0
	for _, r := range rs {
		if r[1] > r[0] {
			off += copy(row[off:], row[r[0]:r[1]])
		}
	}
	vis := row[:off]
	kernels.SoftmaxScaled(scale, vis)
	end := len(row)
	for i := len(rs) - 1; i >= 0; i-- {
		r := rs[i]
		if r[1] <= r[0] {
			continue
		}
		off -= r[1] - r[0]
		clear(row[r[1]:end])
		copy(row[r[0]:r[1]], row[off:off+r[1]-r[0]])
		end = r[0]
	}
	clear(row[:end])
}

// splitKV writes the call's keys and values k, v ([T, kvdim]) into a cache
// without float32 storage and lays out m.s.kr, m.s.vr for attnTask, per kv
// head g rows [g*nk, (g+1)*nk) of head_dim: rows [0, pos) the earlier
// tokens as Read serves them after the Write, rows [pos, pos+T) the fresh
// float32 keys and values, and, when the cache is a QuantizedKV whose
// Write quantizes earlier tokens that some query of the call still sees in
// its fp16 window, rows [pos+T, nk) those tokens' fp16 rows read before
// the Write (QuantizedKV's semantics). When the cache is a KVAttender
// that serves layer li, rows [0, pos) are left unread: attnTask (and
// kvDecodeTask for T = 1) score and sum them through it.
func (m *cpuModel) splitKV(li int, l *cpuLayer, pos, T int, cache KVCache, k, v []float32) {
	s, t := &m.s, &m.attn
	hd, n := l.hd, pos+T
	qc, _ := cache.(QuantizedKV)
	ra, ext := 0, 0
	if qc != nil && pos > 0 && T > 1 {
		ra = qc.QuantizedEnd(li, pos+1)
		ext = max(0, min(pos, qc.QuantizedEnd(li, n))-ra)
	}
	nk := n + ext
	if need := l.nkv * nk * hd; len(s.kr) < need {
		s.kr, s.vr = grow(s.kr, need), grow(s.vr, need)
	}
	if need := l.nh * min(T, attnBlock) * nk; len(s.scores) < need {
		s.scores = grow(s.scores, need)
	}
	if ext > 0 {
		// Read before the Write: positions [ra, ra+ext) still in fp16.
		re := ra + ext
		s.kw, s.vw = grow(s.kw, re*hd), grow(s.vw, re*hd)
		for g := 0; g < l.nkv; g++ {
			cache.Read(li, g, re, s.kw[:re*hd], s.vw[:re*hd])
			base := (g*nk + n) * hd
			copy(s.kr[base:base+ext*hd], s.kw[ra*hd:re*hd])
			copy(s.vr[base:base+ext*hd], s.vw[ra*hd:re*hd])
		}
		if cap(t.qend) < T {
			t.qend = make([]int, T)
		}
		t.qend = t.qend[:T]
		for i := range t.qend {
			t.qend[i] = min(max(qc.QuantizedEnd(li, pos+i+1), ra), ra+ext)
		}
	}
	cache.Write(li, pos, T, k, v)
	// A KVAttender serves the earlier tokens from its packed storage
	// (attnTask): rows [0, pos) are not read.
	t.kva, t.li, t.kvaN = nil, li, 0
	if ka, ok := cache.(KVAttender); ok && pos > 0 && ka.AttendsKV(li) {
		t.kva = ka
		t.kvaN = ka.AttendScratch(li, max(min(T, attnBlock), l.nh/l.nkv))
		s.kvaS = grow(s.kvaS, l.nh*t.kvaN)
	}
	for g := 0; g < l.nkv; g++ {
		kr, vr := s.kr[g*nk*hd:(g+1)*nk*hd], s.vr[g*nk*hd:(g+1)*nk*hd]
		if pos > 0 && t.kva == nil {
			cache.Read(li, g, pos, kr[:pos*hd], vr[:pos*hd])
		}
		for i := 0; i < T; i++ {
			copy(kr[(pos+i)*hd:(pos+i+1)*hd], k[i*l.kvdim+g*hd:])
			copy(vr[(pos+i)*hd:(pos+i+1)*hd], v[i*l.kvdim+g*hd:])
		}
	}
	t.k, t.v = s.kr, s.vr
	t.ldkv = hd
	t.direct = false
	t.nk, t.ra, t.ext = nk, ra, ext
}

// ffn runs the FFN half of block li on x, the m.rows rows of the call's
// sequences (in place: x += ffn).
func (m *cpuModel) ffn(li int, l *cpuLayer, eps float32) {
	s := &m.s
	T, pos := m.rows, m.bs[0].pos // pos: for the observers (one sequence)
	H := m.d.HiddenSize
	x, xn := s.x[:T*H], s.xn[:T*H]
	for i := 0; i < T; i++ {
		kernels.RMSNorm(xn[i*H:(i+1)*H], x[i*H:(i+1)*H], l.ffnNorm, eps)
	}
	out := s.out[:T*H]
	if l.mlp != nil {
		h := m.mlp(l.mlp, T, xn, out)
		if m.obsFFN != nil {
			I := l.mlp.inter
			hc := s.h[:T*I]
			for i := 0; i < T; i++ {
				copy(hc[i*I:(i+1)*I], h[i*2*I:i*2*I+I])
			}
			m.obsFFN.FFNInput(li, pos, T, xn, hc)
		}
	} else {
		if m.obsFFN != nil {
			m.obsFFN.FFNInput(li, pos, T, xn, nil)
		}
		m.moeFFN(li, l.moe, pos, T, xn, out)
	}
	for i := range x {
		x[i] += out[i]
	}
}

// mlp computes out[T,H] = down(silu(gate(x)) * up(x)) and returns the
// gate/up buffer [T, 2I] whose first I columns per row hold silu(g)*u.
func (m *cpuModel) mlp(w *cpuMLP, T int, x, out []float32) []float32 {
	H, I := m.d.HiddenSize, w.inter
	gu := m.s.gu[:T*2*I]
	m.matMul(T, 2*I, H, x, H, &w.gu, gu, 2*I)
	for i := 0; i < T; i++ {
		kernels.SiLUMul(gu[i*2*I:i*2*I+I], gu[i*2*I+I:(i+1)*2*I])
	}
	m.matMul(T, H, I, gu, 2*I, &w.down, out, H)
	return gu
}

// moeFFN routes each token to its top-k experts: p = softmax(router·x),
// keep the k largest (ties to the lower id), renormalise them when norm,
// out = Σ p_e·expert_e(x) (+ sigmoid(g·x)·shared(x)).
func (m *cpuModel) moeFFN(li int, e *cpuMoE, pos, T int, x, out []float32) {
	s := &m.s
	H := m.d.HiddenSize
	E, K := len(e.experts), e.topK
	logits := s.moeLogits[:T*E]
	m.pool.MatMulNTRows(T, E, H, x, H, e.router, H, logits, E)
	sel, wts := s.moeSel[:T*K], s.moeW[:T*K]
	for ex := range s.moeTok {
		s.moeTok[ex] = s.moeTok[ex][:0]
		s.moeWt[ex] = s.moeWt[ex][:0]
	}
	probs := s.moeP[:E]
	for i := 0; i < T; i++ {
		copy(probs, logits[i*E:(i+1)*E])
		kernels.Softmax(probs)
		var sum float32
		for j := 0; j < K; j++ {
			best := -1
			for ex := 0; ex < E; ex++ {
				taken := false
				for jj := 0; jj < j; jj++ {
					if int(sel[i*K+jj]) == ex {
						taken = true
						break
					}
				}
				if !taken && (best < 0 || probs[ex] > probs[best]) {
					best = ex
				}
			}
			sel[i*K+j] = int32(best)
			wts[i*K+j] = probs[best]
			sum += probs[best]
		}
		for j := 0; j < K; j++ {
			w := wts[i*K+j]
			if e.norm {
				w /= sum
			}
			ex := sel[i*K+j]
			s.moeTok[ex] = append(s.moeTok[ex], int32(i))
			s.moeWt[ex] = append(s.moeWt[ex], w)
		}
	}
	if m.obsRouter != nil {
		m.obsRouter.RouterLogits(li, pos, T, logits, sel)
	}
	clear(out)
	for ex := 0; ex < E; ex++ {
		toks := s.moeTok[ex]
		if len(toks) == 0 {
			continue
		}
		n := len(toks)
		xs := s.moeX[:n*H]
		for j, t := range toks {
			copy(xs[j*H:(j+1)*H], x[int(t)*H:(int(t)+1)*H])
		}
		ys := s.moeY[:n*H]
		m.mlp(&e.experts[ex], n, xs, ys)
		for j, t := range toks {
			kernels.Axpy(s.moeWt[ex][j], ys[j*H:(j+1)*H], out[int(t)*H:(int(t)+1)*H])
		}
	}
	if e.shared != nil {
		ys := s.moeY[:T*H]
		m.mlp(e.shared, T, x, ys)
		for i := 0; i < T; i++ {
			g := float32(1)
			if e.sharedGate != nil {
				g = sigmoid(kernels.Dot(e.sharedGate, x[i*H:(i+1)*H]))
			}
			kernels.Axpy(g, ys[i*H:(i+1)*H], out[i*H:(i+1)*H])
		}
	}
}

func sigmoid(x float32) float32 { return float32(1 / (1 + math.Exp(-float64(x)))) }
