package kvcache

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/lmpack/lmpack/runtime"
)

// Errors of Pool.NewCache.
var (
	// ErrPoolFull: the free budget is too small for the cache now; it may
	// fit once other caches are released.
	ErrPoolFull = errors.New("kvcache: KV pool is full")
	// ErrNeverFits: the cache needs more than the whole budget.
	ErrNeverFits = errors.New("kvcache: KV cache can never fit in the pool's budget")
)

// PoolStats is a Pool's use now (serve.PoolStats is this type).
type PoolStats struct {
	// BlockTokens is the tokens per block; TotalBlocks the budget in
	// blocks, ⌊TotalBytes / block bytes⌋; UsedBlocks the blocks that live
	// caches hold now (taken as tokens are stored, at most what they
	// reserved).
	BlockTokens             int
	TotalBlocks, UsedBlocks int
	// Bytes: the budget, what live caches reserved (BytesFor of their
	// capacities), and what is free (TotalBytes − UsedBytes).
	TotalBytes, UsedBytes, FreeBytes int64
	// Sequences is the number of caches not yet released.
	Sequences int
}

// Pool is KV memory as a budget: caches of one method and model shape
// whose storage is handed out in blocks of blockTokens tokens, so that
// caches of different lengths share the budget without fragmentation
// (paged KV memory: a cache's tokens need not be contiguous, only its
// blocks' table is per cache).
//
// A block holds blockTokens tokens of every layer, K and V, of the
// method's quantized storage: codes, binary16 scales and zero points and
// OScaR's fp32 token norms (see store.go). Besides its blocks, a cache has
// fixed bytes for its fp16 sink (Sink tokens) and recent ring. NewCache
// reserves BytesFor(capacity) of the budget; the cache then takes blocks
// as its tokens are stored (never more than it reserved) and Release
// returns them to a free list that later caches reuse, so in steady state
// no block is allocated.
//
// The ring of a pool cache is exactly the fp16 window, max(Recent,
// block−1) tokens with no slack (New's caches keep 32 more): a serving
// scheduler checks for cancellation between Forward calls, never inside
// one, so no cancelled Forward needs rows pushed out of the window. After
// a Truncate a pool cache may so keep more tokens quantized than a New
// cache would (documented Truncate behaviour: tokens whose rows are gone
// stay quantized).
//
// The sink and ring are the cache's fixed bytes, reserved from the same
// budget. Released caches keep their sink and ring buffers for a later
// cache of the same window sizes, and released blocks stay on the free
// list, while the memory so kept (blocks held or free, windows live or
// spare) fits the budget; beyond it the pool gives spares up, so its
// allocated KV memory never exceeds the budget (an internal assertion).
// Working memory that is not KV data — page tables, scratch rows, ring
// bookkeeping, rotation matrices — is not counted.
//
// A Pool is safe for concurrent use; each cache it returns is not.
type Pool struct {
	method string
	sp     spec
	layers []Layer
	opt    Options
	bt     int
	lay    layout
	// blockBytes is lay.bytes(); sumKV is Σ_layers kvDim.
	blockBytes int64
	sumKV      int64

	mu          sync.Mutex
	total, used int64
	held, seqs  int
	// made counts the blocks ever allocated (the rest came from free),
	// dropped those given up to the garbage collector.
	made, dropped int
	// phys is the memory the pool has allocated and keeps: every block
	// (held or free) and the sink and ring buffers of every cache (live
	// or spare); trim keeps it within the budget.
	phys  int64
	free  []*block
	spare []*cache
	// live maps every cache not released to the blocks it reserved (at
	// most len(pg.tab)).
	live map[*cache]int
}

// fp32Spec is fp32 as a paged method: float32 rows, no windows (a pool's
// fp32 caches do not have runtime.F32KV; Read copies rows).
var fp32Spec = spec{name: "fp32", k: sideSpec{store: storeF32}, v: sideSpec{store: storeF32}, block: 1, noWindows: true}

// NewPool returns a pool of budgetBytes bytes handing out caches of method
// (one of Methods(), options as for New) for layers, in blocks of
// blockTokens tokens. Block methods (kivi2, oscars2) need blockTokens a
// multiple of their 32-token quantization block.
//
// Errors: ErrUnknownMethod, ErrNoRotations and ErrBadShape as New (for
// layers, windows and rotations); a non-positive budgetBytes or
// blockTokens, or a blockTokens that is not a multiple of the method's
// block, names the parameter.
func NewPool(method string, layers []Layer, opt Options, budgetBytes int64, blockTokens int) (*Pool, error) {
	if budgetBytes <= 0 {
		return nil, fmt.Errorf("kvcache: NewPool: budgetBytes %d, want > 0", budgetBytes)
	}
	if blockTokens <= 0 {
		return nil, fmt.Errorf("kvcache: NewPool: blockTokens %d, want > 0", blockTokens)
	}
	if err := checkLayers(layers, 1, opt); err != nil {
		return nil, err
	}
	sp := fp32Spec
	if method != "fp32" {
		var ok bool
		if sp, ok = methods[method]; !ok {
			return nil, fmt.Errorf("%w %q (known: %s)", ErrUnknownMethod, method, strings.Join(Methods(), ", "))
		}
		sp.name = method
	}
	if blockTokens%sp.block != 0 {
		return nil, fmt.Errorf("kvcache: NewPool: blockTokens %d for %s, want a multiple of its %d-token quantization block", blockTokens, method, sp.block)
	}
	if err := checkSpec(sp, layers, opt); err != nil {
		return nil, err
	}
	p := &Pool{method: method, sp: sp, layers: append([]Layer(nil), layers...), opt: opt, bt: blockTokens,
		total: budgetBytes, live: map[*cache]int{}}
	probe := &cache{}
	p.lay = probe.init(sp, p.layers, 1, opt, blockTokens, 0)
	p.blockBytes = p.lay.bytes()
	for _, l := range layers {
		p.sumKV += int64(l.NumKVHeads * l.HeadDim)
	}
	return p, nil
}

// BlockBytes is the size of one block: every byte of codes, scales, zero
// points and norms of BlockTokens tokens over all layers, K and V.
func (p *Pool) BlockBytes() int64 { return p.blockBytes }

// shape returns the sink, ring and number of blocks of a cache of
// capacity tokens.
func (p *Pool) shape(capacity int) (sink, ring, blocks int) {
	sink, recent := windows(p.sp, capacity, p.opt)
	ring = ringSize(p.sp, recent, 0, capacity)
	return sink, ring, (capacity - sink + p.bt - 1) / p.bt
}

// BytesFor is the budget a cache of capacity tokens reserves, in bytes:
// its fixed bytes, the fp16 sink and ring, (sink + ring)·4·Σ kvDim (K and
// V, 2 bytes an element), plus ⌈(capacity − sink)/BlockTokens⌉ blocks of
// BlockBytes (with sink = min(Sink, capacity), ring = min(max(Recent,
// block−1), capacity), Recent as New resolves it (0 is 128 for kivi2 and
// oscars2); fp16 and fp32 have no windows, and per-token methods without
// a recent window no ring). 0 for capacity < 1.
func (p *Pool) BytesFor(capacity int) int64 {
	if capacity < 1 {
		return 0
	}
	sink, ring, blocks := p.shape(capacity)
	return int64(sink+ring)*4*p.sumKV + int64(blocks)*p.blockBytes
}

// BytesForReserve is the budget a cache of capacity tokens reserves when
// it reserves blocks for its first tokens tokens only (NewCacheReserve,
// Grow): its fixed bytes, the fp16 sink and ring of a capacity-token
// cache as in BytesFor, plus ⌈(min(tokens, capacity) − sink)/BlockTokens⌉
// blocks (none when tokens ≤ sink). BytesForReserve(c, c) = BytesFor(c);
// 0 for capacity < 1.
func (p *Pool) BytesForReserve(capacity, tokens int) int64 {
	if capacity < 1 {
		return 0
	}
	sink, ring, _ := p.shape(capacity)
	return int64(sink+ring)*4*p.sumKV + int64(p.reserveBlocks(capacity, tokens))*p.blockBytes
}

// reserveBlocks is the number of blocks the first tokens tokens of a
// cache of capacity tokens fill.
func (p *Pool) reserveBlocks(capacity, tokens int) int {
	sink, _, blocks := p.shape(capacity)
	tokens = min(tokens, capacity)
	if tokens <= sink {
		return 0
	}
	return min(blocks, (tokens-sink+p.bt-1)/p.bt)
}

// NewCache reserves BytesFor(capacity) of the budget and returns an empty
// cache of capacity tokens (runtime.KVCache, Sizer, runtime.QuantizedKV)
// whose quantized storage comes from the pool's blocks. Its values are
// those of New's cache of the same method and options, bit for bit. It is
// NewCacheReserve(capacity, capacity).
//
// Errors: ErrBadShape for capacity < 1; ErrNeverFits (wrapped) when
// BytesFor(capacity) exceeds the whole budget; ErrPoolFull (wrapped)
// when it exceeds the free budget now.
func (p *Pool) NewCache(capacity int) (runtime.KVCache, error) {
	return p.NewCacheReserve(capacity, capacity)
}

// NewCacheReserve is NewCache for allocation on demand (vLLM's paged
// policy): the cache has room for capacity tokens (its fp16 sink and ring
// are those of a capacity-token cache, so its values are New's, bit for
// bit) but reserves only BytesForReserve(capacity, tokens) of the budget:
// its fixed bytes and the blocks of its first tokens tokens. Storing more
// tokens than the reservation covers panics (a caller bug): Grow the
// reservation first.
//
// Errors: ErrBadShape for capacity < 1 or tokens < 1; ErrNeverFits
// (wrapped) when BytesForReserve(capacity, tokens) exceeds the whole
// budget; ErrPoolFull (wrapped) when it exceeds the free budget now.
func (p *Pool) NewCacheReserve(capacity, tokens int) (runtime.KVCache, error) {
	if capacity < 1 {
		return nil, fmt.Errorf("%w: capacity %d, want ≥ 1 token", ErrBadShape, capacity)
	}
	if tokens < 1 {
		return nil, fmt.Errorf("%w: reservation of %d tokens, want ≥ 1", ErrBadShape, tokens)
	}
	need := p.BytesForReserve(capacity, tokens)
	tokens = min(tokens, capacity)
	p.mu.Lock()
	defer p.mu.Unlock()
	if need > p.total {
		return nil, fmt.Errorf("%w: %s cache of %d tokens (%d reserved) needs %d bytes, the budget is %d", ErrNeverFits, p.method, capacity, tokens, need, p.total)
	}
	if need > p.total-p.used {
		return nil, fmt.Errorf("%w: %s cache of %d tokens (%d reserved) needs %d bytes, %d of %d free", ErrPoolFull, p.method, capacity, tokens, need, p.total-p.used, p.total)
	}
	// Reuse a released cache whose sink and ring have this capacity's
	// sizes, so that a live cache's buffers are exactly what it reserved.
	sink, ring, _ := p.shape(capacity)
	var c *cache
	for i := len(p.spare) - 1; i >= 0; i-- {
		if sp := p.spare[i]; sp.sink == sink && sp.ring == ring {
			c = sp
			p.spare = slices.Delete(p.spare, i, i+1)
			c.reset(p.sp, capacity, p.opt, 0)
			break
		}
	}
	if c == nil {
		c = &cache{}
		c.init(p.sp, p.layers, capacity, p.opt, p.bt, 0)
		p.phys += p.fixedBytes(c)
	}
	c.pool, c.reserved = p, need
	c.pg.src = (*poolSource)(c)
	p.used += need
	p.seqs++
	p.live[c] = p.reserveBlocks(capacity, tokens)
	p.trim()
	p.check()
	return c, nil
}

// Grow raises the reservation of c (a live cache of p) to its first
// tokens tokens, BytesForReserve(capacity, tokens), taking the difference
// from the free budget; a reservation that already covers tokens is left
// as it is (reservations never shrink before Release). Exact: the pool's
// reserved bytes stay the sum of its live caches' BytesForReserve.
//
// Errors: ErrBadShape (wrapped) when tokens exceeds c's capacity;
// ErrPoolFull (wrapped) when the free budget is smaller than the
// difference now (c keeps its reservation). It panics when c is not a
// live cache of p (a caller bug).
func (p *Pool) Grow(c runtime.KVCache, tokens int) error {
	cc, ok := c.(*cache)
	p.mu.Lock()
	defer p.mu.Unlock()
	if !ok {
		panic(fmt.Sprintf("kvcache: Pool.Grow: %T is not a cache of this pool", c))
	}
	if _, ok := p.live[cc]; !ok {
		panic("kvcache: Pool.Grow: not a live cache of this pool (released, or from elsewhere)")
	}
	if tokens > cc.cap {
		return fmt.Errorf("%w: Grow to %d tokens, the cache's capacity is %d", ErrBadShape, tokens, cc.cap)
	}
	need := p.BytesForReserve(cc.cap, tokens)
	if need <= cc.reserved {
		return nil
	}
	if d := need - cc.reserved; d > p.total-p.used {
		return fmt.Errorf("%w: growing a %s cache to %d tokens needs %d more bytes, %d of %d free", ErrPoolFull, p.method, tokens, d, p.total-p.used, p.total)
	}
	p.used += need - cc.reserved
	cc.reserved = need
	p.live[cc] = p.reserveBlocks(cc.cap, tokens)
	p.check()
	return nil
}

// Release returns every block and byte of c to the pool. c must come
// from p's NewCache and not be used afterwards; it panics otherwise (a
// caller bug), as on a second Release.
func (p *Pool) Release(c runtime.KVCache) {
	cc, ok := c.(*cache)
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, live := p.live[cc]; !ok || !live {
		panic(fmt.Sprintf("kvcache: Pool.Release: %T is not a live cache of this pool (released twice, or from elsewhere)", c))
	}
	delete(p.live, cc)
	for j, b := range cc.pg.tab {
		if b != nil {
			p.free = append(p.free, b)
			p.held--
			cc.pg.tab[j] = nil
		}
	}
	p.used -= cc.reserved
	p.seqs--
	// The buffers go to a new shell for reuse; c itself stays dead, so a
	// stale handle can never alias a later cache.
	shell := new(cache)
	*shell = *cc
	shell.pool, shell.reserved, shell.pg.src = nil, 0, nil
	*cc = cache{name: cc.name + " (released)"}
	p.spare = append(p.spare, shell)
	p.check()
}

// Stats implements the pool's report of its use now.
func (p *Pool) Stats() PoolStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return PoolStats{BlockTokens: p.bt, TotalBlocks: int(p.total / p.blockBytes), UsedBlocks: p.held,
		TotalBytes: p.total, UsedBytes: p.used, FreeBytes: p.total - p.used, Sequences: p.seqs}
}

// fixedBytes is the size of c's sink and ring buffers.
func (p *Pool) fixedBytes(c *cache) int64 { return int64(c.sink+c.ring) * 4 * p.sumKV }

// trim gives spare caches, then free blocks, to the garbage collector
// while the pool's memory exceeds the budget (p.mu held). What live
// caches hold is at most what they reserved, so this always ends within
// the budget.
func (p *Pool) trim() {
	for p.phys > p.total && len(p.spare) > 0 {
		n := len(p.spare) - 1
		p.phys -= p.fixedBytes(p.spare[n])
		p.spare[n] = nil
		p.spare = p.spare[:n]
	}
	for p.phys > p.total && len(p.free) > 0 {
		n := len(p.free) - 1
		p.phys -= p.blockBytes
		p.free[n] = nil
		p.free = p.free[:n]
		p.dropped++
	}
}

// check asserts the pool's invariants (p.mu held): reservations within
// the budget, blocks held within what is reserved, the pool's memory
// within the budget. A violation is a bug in this package: it panics.
func (p *Pool) check() {
	if p.used < 0 || p.used > p.total {
		panic(fmt.Sprintf("kvcache: Pool invariant violated: %d bytes reserved, budget %d", p.used, p.total))
	}
	if int64(p.held)*p.blockBytes > p.used {
		panic(fmt.Sprintf("kvcache: Pool invariant violated: %d blocks of %d bytes held, only %d bytes reserved", p.held, p.blockBytes, p.used))
	}
	if p.phys > p.total {
		panic(fmt.Sprintf("kvcache: Pool invariant violated: %d bytes of blocks and windows allocated, budget %d", p.phys, p.total))
	}
}

// poolSource is a pool cache seen as the blockSource of its pages: it
// takes blocks from its pool's free list, within its reservation.
type poolSource cache

func (s *poolSource) take() *block {
	c := (*cache)(s)
	p := c.pool
	p.mu.Lock()
	defer p.mu.Unlock()
	if h, r := c.pg.held(), p.live[c]; h >= r {
		panic(fmt.Sprintf("kvcache: Pool: a cache stores a token beyond its reservation: it holds %d blocks, reserved %d (Grow first)", h, r))
	}
	var b *block
	if n := len(p.free); n > 0 {
		b, p.free = p.free[n-1], p.free[:n-1]
	} else {
		b = p.lay.newBlock()
		p.made++
		p.phys += p.blockBytes
		p.trim()
	}
	p.held++
	p.check()
	return b
}
