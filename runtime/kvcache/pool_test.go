package kvcache

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/internal/shared"
	"github.com/lmpack/lmpack/runtime"
)

// poolLayers have head_dims that are powers of two (Hadamard methods) and
// different num_key_value_heads per layer.
var poolLayers = []Layer{{NumKVHeads: 2, HeadDim: 64}, {NumKVHeads: 1, HeadDim: 32}, {NumKVHeads: 4, HeadDim: 8}}

// poolLayersFor returns poolLayers, or ggmlTestLayers for a method that
// refuses head_dim 8 (llama.cpp's q8_0/q4_0).
func poolLayersFor(name string) []Layer {
	if _, err := New(name, poolLayers, 1, poolOpt(newRand(1), poolLayers, Options{})); errors.Is(err, ErrBadShape) {
		return ggmlTestLayers
	}
	return poolLayers
}

// poolOpt is opt with rotations for the methods that need them.
func poolOpt(rng *rand.Rand, layers []Layer, opt Options) Options {
	opt.Rotations = randRotations(rng, layers, 0.96, 0.92)
	return opt
}

// specOf returns the spec of a method name (fp32 included).
func specOf(t testing.TB, name string) spec {
	if name == "fp32" {
		return fp32Spec
	}
	sp, ok := methods[name]
	if !ok {
		t.Fatalf("unknown method %q", name)
	}
	sp.name = name
	return sp
}

// sameState fails unless a and b hold the same length, bytes and, for
// every layer and kv head, the same Read values bit for bit.
func sameState(t *testing.T, what string, a, b runtime.KVCache, layers []Layer) {
	t.Helper()
	if a.Len() != b.Len() || a.Bytes() != b.Bytes() {
		t.Fatalf("%s: Len %d / %d, Bytes %d / %d", what, a.Len(), b.Len(), a.Bytes(), b.Bytes())
	}
	for i, l := range layers {
		ka, va := readAll(a, l, i, a.Len())
		kb, vb := readAll(b, l, i, b.Len())
		for j := range ka {
			if math.Float32bits(ka[j]) != math.Float32bits(kb[j]) || math.Float32bits(va[j]) != math.Float32bits(vb[j]) {
				t.Fatalf("%s: layer %d element %d: K %v / %v, V %v / %v", what, i, j, ka[j], kb[j], va[j], vb[j])
			}
		}
	}
}

// churn applies the same random sequence of chunked writes, commits and
// truncations (truncate: when allowed) to every cache in cs, checking
// after each step that they agree with cs[0].
func churn(t *testing.T, what string, rng *rand.Rand, layers []Layer, capacity, steps int, truncate bool, cs ...runtime.KVCache) {
	t.Helper()
	k, v := tokens(rng, layers, capacity, outlierStd), tokens(rng, layers, capacity, nil)
	for step := 0; step < steps; step++ {
		n := cs[0].Len()
		if r := rng.IntN(10); truncate && r < 2 && n > 0 {
			m := n - rng.IntN(min(n, 80)+1)
			for _, c := range cs {
				c.Truncate(m)
			}
		} else {
			t1 := min(capacity-n, 1+rng.IntN(40))
			if rng.IntN(3) == 0 {
				t1 = min(capacity-n, 1)
			}
			if t1 == 0 {
				break
			}
			for _, c := range cs {
				for i, l := range layers {
					d := l.NumKVHeads * l.HeadDim
					c.Write(i, n, t1, k[i][n*d:(n+t1)*d], v[i][n*d:(n+t1)*d])
				}
				c.Commit(t1)
			}
		}
		for j, c := range cs[1:] {
			sameState(t, fmt.Sprintf("%s step %d cache %d", what, step, j+1), cs[0], c, layers)
		}
	}
}

// Paging changes no decoded value: for every method and windows, caches
// with pages of 1, 3, 16, 32 and 48 tokens (multiples of the method's
// block) give, after every write and truncation, the values and bytes of
// New's cache, whose one page holds the whole capacity laid out
// [kv head][capacity][row] as the stores were before paging (that layout
// was also checked bit for bit against the code before paging, on this
// scenario). A Pool's caches (no ring slack) agree with New's on writes
// without truncation.
func TestPagedMatchesOnePage(t *testing.T) {
	const capacity = 300
	for _, name := range Methods() {
		sp := specOf(t, name)
		pl := poolLayersFor(name)
		for vi, w := range []Options{{}, {Sink: 5, Recent: 7}, {Sink: 16, Recent: 64}, {Recent: 1}} {
			rng := newRand(uint64(100 + vi))
			opt := poolOpt(rng, pl, w)
			what := fmt.Sprintf("%s sink %d recent %d", name, w.Sink, w.Recent)
			ref := mustNew(t, name, pl, capacity, opt)
			cs := []runtime.KVCache{ref}
			if name != "fp32" {
				for _, bt := range []int{1, 3, 16, 32, 48} {
					if bt%sp.block != 0 {
						continue
					}
					c, err := newCachePaged(sp, pl, capacity, opt, bt, ringSlack)
					if err != nil {
						t.Fatal(err)
					}
					cs = append(cs, c)
				}
			}
			churn(t, what, rng, pl, capacity, 50, true, cs...)

			// Pool caches, including a reused one with dirty blocks.
			bt := 16
			if sp.block > 1 {
				bt = 32
			}
			p, err := NewPool(name, pl, opt, 1<<30, bt)
			if err != nil {
				t.Fatal(err)
			}
			for round := 0; round < 2; round++ {
				ref := mustNew(t, name, pl, capacity, opt)
				c, err := p.NewCache(capacity)
				if err != nil {
					t.Fatal(err)
				}
				churn(t, what+" pool", rng, pl, capacity, 30, false, ref, c)
				p.Release(c)
			}
			if name != "fp32" && len(cs) < 2 {
				t.Fatalf("%s: no paged cache compared", what)
			}
		}
	}
}

// elementBits returns the bits per K and per V element of method on a
// layer (index i), from the table of New's doc comment.
func elementBits(t *testing.T, method string, i int, l Layer) (bk, bv float64) {
	hd, kvDim := float64(l.HeadDim), float64(l.NumKVHeads*l.HeadDim)
	switch method {
	case "oscar-mixed":
		k, v := testBits(i)
		return float64(k) + 32/hd, float64(v) + 32/hd
	case "fp32":
		return 32, 32
	case "fp16":
		return 16, 16
	case "int8":
		return 8 + 32/hd, 8 + 32/hd
	case "int4", "oscar4":
		return 4 + 32/hd, 4 + 32/hd
	case "int2-naive":
		return 2 + 16/hd, 2 + 16/hd
	case "quarot2", "oscar2":
		return 2 + 32/hd, 2 + 32/hd
	case "kivi2":
		g := hd
		if l.HeadDim%32 == 0 {
			g = 32
		}
		return 3, 2 + 32/g
	case "oscar2-g32":
		g := hd
		if l.HeadDim%32 == 0 {
			g = 32
		}
		return 2 + 32/g, 2 + 32/g
	case "oscars2":
		return 3 + 32/kvDim, 2 + 32/hd
	}
	t.Fatalf("no formula for %q", method)
	return 0, 0
}

// BytesFor: a block is BlockTokens tokens at the bits per element of
// New's table over all layers, K and V; BytesFor(capacity) adds the fp16
// sink and ring; a full cache without windows holds exactly BytesFor
// (capacity a multiple of the block), and a cache never holds more than
// it reserved.
func TestBytesForMatchesFormulas(t *testing.T) {
	rng := newRand(5)
	for _, name := range Methods() {
		sp := specOf(t, name)
		for _, bt := range []int{16, 32, 64} {
			if bt%sp.block != 0 {
				continue
			}
			pl := poolLayersFor(name)
			p, err := NewPool(name, pl, poolOpt(rng, pl, Options{}), 1<<30, bt)
			if err != nil {
				t.Fatal(err)
			}
			var want float64
			if slices.Contains(newKinds, name) {
				// The serving-engine kinds' formulas are checked against
				// Bytes() by TestNewKindsBytes: a block is bt tokens of it.
				want = float64(bt) * float64(fullBytes(t, name, pl, 64)) / 64
			} else {
				for i, l := range pl {
					bk, bv := elementBits(t, name, i, l)
					want += float64(bt) * float64(l.NumKVHeads*l.HeadDim) * (bk + bv) / 8
				}
			}
			if got := p.BlockBytes(); float64(got) != want {
				t.Errorf("%s blockTokens %d: BlockBytes %d, want %g", name, bt, got, want)
			}
		}
	}
	for _, name := range Methods() {
		sp := specOf(t, name)
		bt := 16
		if sp.block > 1 {
			bt = 32
		}
		pl := poolLayersFor(name)
		var sumKV int64
		for _, l := range pl {
			sumKV += int64(l.NumKVHeads * l.HeadDim)
		}
		for _, w := range []Options{{}, {Sink: 5, Recent: 7}, {Sink: 16, Recent: 64}, {Recent: 1}} {
			opt := poolOpt(rng, pl, w)
			p, err := NewPool(name, pl, opt, 1<<30, bt)
			if err != nil {
				t.Fatal(err)
			}
			for _, capacity := range []int{1, 5, 31, 64, 100, 256} {
				sink, recent := windows(sp, capacity, opt)
				ring := min(max(recent, sp.block-1), capacity)
				blocks := (capacity - sink + bt - 1) / bt
				want := int64(sink+ring)*4*sumKV + int64(blocks)*p.BlockBytes()
				if got := p.BytesFor(capacity); got != want {
					t.Errorf("%s %+v: BytesFor(%d) = %d, want %d", name, w, capacity, got, want)
				}
				c, err := p.NewCache(capacity)
				if err != nil {
					t.Fatal(err)
				}
				k, v := tokens(rng, pl, capacity, nil), tokens(rng, pl, capacity, nil)
				for pos := 0; pos < capacity; {
					n := min(capacity-pos, 1+rng.IntN(20))
					for i, l := range pl {
						d := l.NumKVHeads * l.HeadDim
						c.Write(i, pos, n, k[i][pos*d:(pos+n)*d], v[i][pos*d:(pos+n)*d])
					}
					c.Commit(n)
					pos += n
					if c.Bytes() > want {
						t.Fatalf("%s %+v capacity %d: Bytes %d after %d tokens, more than the %d reserved", name, w, capacity, c.Bytes(), pos, want)
					}
				}
				noWin := ring == 0 && sink == 0
				if noWin && capacity%bt == 0 && c.Bytes() != want {
					t.Errorf("%s capacity %d: full cache Bytes %d, BytesFor %d", name, capacity, c.Bytes(), want)
				}
				p.Release(c)
			}
		}
	}
	// oscar2 without windows has no fixed bytes.
	p, err := NewPool("oscar2", poolLayers, poolOpt(rng, poolLayers, Options{}), 1<<30, 16)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := p.BytesFor(256), 16*p.BlockBytes(); got != want {
		t.Errorf("oscar2: BytesFor(256) = %d, want 16 blocks = %d (no fixed bytes)", got, want)
	}
}

// Many random NewCache / Write / Truncate / Release interleavings over
// several pools: after every operation the reserved bytes stay within the
// budget, the blocks held within the reservations and equal to what the
// caches' page tables hold, NewCache fails exactly when the reservation
// does not fit (ErrNeverFits beyond the budget, ErrPoolFull beyond the
// free bytes), and reused (dirty) blocks give the values of a fresh New
// cache fed the same tokens. Blocks are reused: the pool never makes more
// than the most it held at once.
func TestPoolInvariantsRandom(t *testing.T) {
	type live struct {
		c, ref runtime.KVCache
		cap    int
	}
	for _, tc := range []struct {
		name string
		w    Options
		bt   int
	}{
		{"int4", Options{}, 16}, {"oscar2", Options{Sink: 4, Recent: 8}, 5}, {"kivi2", Options{Recent: 40}, 32}, {"fp16", Options{}, 1}, {"oscars2", Options{}, 64},
	} {
		rng := newRand(77)
		opt := poolOpt(rng, poolLayers, tc.w)
		probe, err := NewPool(tc.name, poolLayers, opt, 1, tc.bt)
		if err != nil {
			t.Fatal(err)
		}
		budget := probe.BytesFor(200) * 5 / 2
		p, err := NewPool(tc.name, poolLayers, opt, budget, tc.bt)
		if err != nil {
			t.Fatal(err)
		}
		const maxCap = 240
		k, v := tokens(rng, poolLayers, maxCap, outlierStd), tokens(rng, poolLayers, maxCap, nil)
		var caches []live
		maxHeld, full := 0, 0
		check := func(op string) {
			s := p.Stats()
			var used int64
			held := 0
			for _, l := range caches {
				c := l.c.(*cache)
				used += p.BytesFor(l.cap)
				held += c.pg.held()
				if c.pg.held() > (l.cap-c.sink+p.bt-1)/p.bt {
					t.Fatalf("%s %s: cache holds %d blocks for capacity %d", tc.name, op, c.pg.held(), l.cap)
				}
			}
			maxHeld = max(maxHeld, held)
			if s.UsedBytes != used || s.UsedBlocks != held || s.Sequences != len(caches) || s.FreeBytes != s.TotalBytes-s.UsedBytes ||
				s.UsedBytes > s.TotalBytes || int64(s.UsedBlocks)*p.BlockBytes() > s.UsedBytes || s.TotalBlocks != int(budget/p.BlockBytes()) {
				t.Fatalf("%s %s: stats %+v, want %d bytes, %d blocks, %d sequences", tc.name, op, s, used, held, len(caches))
			}
		}
		for step := 0; step < 1500; step++ {
			switch r := rng.IntN(10); {
			case r < 2:
				capacity := 1 + rng.IntN(maxCap)
				if rng.IntN(20) == 0 {
					capacity = 10000
				}
				need, free := p.BytesFor(capacity), p.Stats().FreeBytes
				c, err := p.NewCache(capacity)
				switch {
				case need > budget:
					if !errors.Is(err, ErrNeverFits) {
						t.Fatalf("%s: NewCache(%d) needs %d > budget %d: %v", tc.name, capacity, need, budget, err)
					}
				case need > free:
					if !errors.Is(err, ErrPoolFull) {
						t.Fatalf("%s: NewCache(%d) needs %d > free %d: %v", tc.name, capacity, need, free, err)
					}
					full++
				case err != nil:
					t.Fatalf("%s: NewCache(%d) needs %d ≤ free %d: %v", tc.name, capacity, need, free, err)
				default:
					if c.Len() != 0 || c.Cap() != capacity || c.Bytes() != 0 {
						t.Fatalf("%s: new cache Len %d Cap %d Bytes %d", tc.name, c.Len(), c.Cap(), c.Bytes())
					}
					caches = append(caches, live{c, mustNew(t, tc.name, poolLayers, capacity, opt), capacity})
				}
			case r < 3 && len(caches) > 0:
				i := rng.IntN(len(caches))
				l := caches[i]
				sameState(t, tc.name+" before Release", l.ref, l.c, poolLayers)
				p.Release(l.c)
				caches = slices.Delete(caches, i, i+1)
			case len(caches) > 0:
				l := caches[rng.IntN(len(caches))]
				n := l.c.Len()
				t1 := min(l.cap-n, 1+rng.IntN(30))
				if t1 == 0 {
					break
				}
				for _, c := range []runtime.KVCache{l.c, l.ref} {
					for i, ly := range poolLayers {
						d := ly.NumKVHeads * ly.HeadDim
						c.Write(i, n, t1, k[i][n*d:(n+t1)*d], v[i][n*d:(n+t1)*d])
					}
					c.Commit(t1)
				}
			}
			check(fmt.Sprint("step ", step))
		}
		for _, l := range caches {
			p.Release(l.c)
		}
		caches = nil
		check("end")
		if p.Stats().UsedBlocks != 0 || p.Stats().UsedBytes != 0 {
			t.Errorf("%s: after releasing all: %+v", tc.name, p.Stats())
		}
		if p.made > maxHeld+p.dropped {
			t.Errorf("%s: pool made %d blocks (%d given up), at most %d were held at once: released blocks are not reused", tc.name, p.made, p.dropped, maxHeld)
		}
		if full == 0 {
			t.Errorf("%s: the pool was never full: the test does not exercise admission", tc.name)
		}
		t.Logf("%s blockTokens %d: %d blocks made (%d given up), at most %d held at once, %d NewCache refused as full", tc.name, tc.bt, p.made, p.dropped, maxHeld, full)
	}
}

// Caches of one pool used from several goroutines at once (each cache by
// one), as a batched forward does: blocks are taken concurrently; the
// pool ends empty with every block back (run with -race).
func TestPoolConcurrentCaches(t *testing.T) {
	p, err := NewPool("int4", poolLayers, Options{}, 1<<22, 4)
	if err != nil {
		t.Fatal(err)
	}
	const workers, capacity = 4, 64
	rng := newRand(11)
	k, v := tokens(rng, poolLayers, capacity, nil), tokens(rng, poolLayers, capacity, nil)
	want := mustNew(t, "int4", poolLayers, capacity, Options{})
	writeSteps(want, poolLayers, k, v, 0, capacity, 3)
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		go func() {
			for round := 0; round < 5; round++ {
				c, err := p.NewCache(capacity)
				if err != nil {
					errs <- err
					return
				}
				writeSteps(c, poolLayers, k, v, 0, capacity, 3)
				for i, l := range poolLayers {
					gk, _ := readAll(c, l, i, capacity)
					wk, _ := readAll(want, l, i, capacity)
					if !slices.Equal(gk, wk) {
						errs <- fmt.Errorf("round %d layer %d: keys differ from New's cache", round, i)
						return
					}
				}
				p.Release(c)
			}
			errs <- nil
		}()
	}
	for w := 0; w < workers; w++ {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	if s := p.Stats(); s.UsedBytes != 0 || s.UsedBlocks != 0 || s.Sequences != 0 {
		t.Errorf("after all releases: %+v", s)
	}
}

// The pool's internal assertion panics with a message naming the
// violation.
func TestPoolAssertionPanics(t *testing.T) {
	p, err := NewPool("int8", poolLayers, Options{}, 1<<20, 16)
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []func(){
		func() { p.used = p.total + 1 },
		func() { p.used, p.held = p.blockBytes, 2 },
		func() { p.phys = p.total + 1 },
	} {
		bad()
		func() {
			defer func() {
				r := recover()
				if s, _ := r.(string); !strings.Contains(s, "Pool invariant violated") {
					t.Errorf("check: recovered %v, want an invariant panic", r)
				}
			}()
			p.check()
		}()
		p.used, p.held, p.phys = 0, 0, 0
	}
}

func TestPoolErrors(t *testing.T) {
	rot := randRotations(newRand(1), poolLayers, 0, 0)
	for _, c := range []struct {
		method string
		opt    Options
		budget int64
		bt     int
		want   string
		is     error
	}{
		{"int4", Options{}, 0, 16, "budgetBytes 0", nil},
		{"int4", Options{}, -5, 16, "budgetBytes -5", nil},
		{"int4", Options{}, 1 << 20, 0, "blockTokens 0", nil},
		{"kivi2", Options{}, 1 << 20, 16, "blockTokens 16", nil},
		{"oscars2", Options{}, 1 << 20, 48, "blockTokens 48", nil},
		{"int3", Options{}, 1 << 20, 16, "int3", ErrUnknownMethod},
		{"oscar2", Options{}, 1 << 20, 16, "oscar2", ErrNoRotations},
		{"oscar2", Options{Rotations: &Rotations{K: rot.K[:1], V: rot.V}}, 1 << 20, 16, "Rotations", ErrBadShape},
		{"int4", Options{Sink: -1}, 1 << 20, 16, "Sink", ErrBadShape},
	} {
		_, err := NewPool(c.method, poolLayers, c.opt, c.budget, c.bt)
		if err == nil || !strings.Contains(err.Error(), c.want) || (c.is != nil && !errors.Is(err, c.is)) {
			t.Errorf("NewPool(%s, budget %d, blockTokens %d): %v, want an error naming %q", c.method, c.budget, c.bt, err, c.want)
		}
	}
	p, err := NewPool("int4", poolLayers, Options{}, 1<<16, 16)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.NewCache(0); !errors.Is(err, ErrBadShape) || !strings.Contains(err.Error(), "capacity 0") {
		t.Errorf("NewCache(0): %v", err)
	}
	per := p.BytesFor(64)
	var held []runtime.KVCache
	for p.Stats().FreeBytes >= per {
		c, err := p.NewCache(64)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	if _, err := p.NewCache(64); !errors.Is(err, ErrPoolFull) {
		t.Errorf("NewCache with %d free, %d needed: %v, want ErrPoolFull", p.Stats().FreeBytes, per, err)
	}
	p.Release(held[0])
	if _, err := p.NewCache(64); err != nil {
		t.Errorf("NewCache after a Release: %v", err)
	}
	for _, foreign := range []runtime.KVCache{held[0], mustNew(t, "int4", poolLayers, 64, Options{})} {
		func() {
			defer func() {
				if r := recover(); r == nil {
					t.Error("Release of a cache that is not live in the pool did not panic")
				}
			}()
			p.Release(foreign)
		}()
	}
}

// A model run through pool caches gives New's logits bit for bit
// (stories260K, prefill then decode); fp32 included, whose pool caches
// serve attention through Read instead of runtime.F32KV.
func TestPoolForwardMatchesNew(t *testing.T) {
	m, d := loadStories(t, 1)
	const T = 48
	V := d.VocabSize
	toks := storyTokens(t, T)
	layers := LayersOf(d)
	for _, c := range []struct {
		name string
		opt  Options
		bt   int
	}{
		{"fp32", Options{}, 16}, {"fp16", Options{}, 16}, {"int4", Options{}, 16}, {"oscar2", Options{Sink: 4, Recent: 8, Rotations: hadamardRotations(layers, 0.96, 0.92)}, 3}, {"kivi2", Options{Recent: 16}, 32},
	} {
		p, err := NewPool(c.name, layers, c.opt, 1<<24, c.bt)
		if err != nil {
			t.Fatal(err)
		}
		want := forwardSteps(t, m, V, mustNew(t, c.name, layers, T, c.opt), toks, 20)
		for round := 0; round < 2; round++ { // the second reuses the blocks
			pc, err := p.NewCache(T)
			if err != nil {
				t.Fatal(err)
			}
			got := forwardSteps(t, m, V, pc, toks, 20)
			for i := range want {
				if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
					t.Fatalf("%s round %d: logit %d: %v, New's cache gives %v", c.name, round, i, got[i], want[i])
				}
			}
			p.Release(pc)
		}
	}
}

// Capacity at a fixed budget (issue 14): on tiny1m (head_dim 64), a
// budget of what fp16 needs for 8 full-context sequences; the number of
// full-context caches NewCache admits per method, without windows and
// with a 16-token sink and a 64-token recent window. oscar2 without
// windows must admit at least 6× fp16's 8.
func TestPoolCapacityTiny1M(t *testing.T) {
	d, err := arch.Load(shared.Path(t, "tiny1m-hf"))
	if err != nil {
		t.Fatal(err)
	}
	layers := LayersOf(d)
	ctx := d.MaxPositionEmbeddings
	if ctx != 256 {
		t.Fatalf("tiny1m max_position_embeddings %d, want 256", ctx)
	}
	fp16, err := NewPool("fp16", layers, Options{}, 1<<40, 16)
	if err != nil {
		t.Fatal(err)
	}
	budget := 8 * fp16.BytesFor(ctx)
	var kvSum int
	for _, l := range layers {
		kvSum += l.NumKVHeads * l.HeadDim
	}
	if want := int64(8 * ctx * kvSum * 2 * 2); budget != want {
		t.Fatalf("fp16 budget %d, want 8·256·Σ kvDim·2·2 = %d", budget, want)
	}
	rot := randRotations(newRand(3), layers, 0.96, 0.92)
	admit := func(method string, opt Options, bt int) int {
		opt.Rotations = rot
		p, err := NewPool(method, layers, opt, budget, bt)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for {
			_, err := p.NewCache(ctx)
			if errors.Is(err, ErrPoolFull) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			n++
		}
		s := p.Stats()
		if s.UsedBytes > s.TotalBytes || s.Sequences != n {
			t.Fatalf("%s: %+v after admitting %d", method, s, n)
		}
		return n
	}
	t.Logf("budget %d bytes (fp16, 8 × %d tokens), blocks of 16 tokens (32 for kivi2)", budget, ctx)
	counts := map[string]int{}
	for _, c := range []struct {
		method string
		opt    Options
		bt     int
		label  string
	}{
		{"fp16", Options{}, 16, "fp16"},
		{"int8", Options{}, 16, "int8, no windows"},
		{"int4", Options{}, 16, "int4, no windows"},
		{"oscar2", Options{}, 16, "oscar2, no windows"},
		{"kivi2", Options{Recent: 1}, 32, "kivi2, smallest residual (Recent 1: ≤ 31 fp16 tokens)"},
		{"int4", Options{Sink: 16, Recent: 64}, 16, "int4, sink 16 + recent 64"},
		{"oscar2", Options{Sink: 16, Recent: 64}, 16, "oscar2, sink 16 + recent 64"},
		{"kivi2", Options{Sink: 16, Recent: 64}, 32, "kivi2, sink 16 + recent 64"},
	} {
		n := admit(c.method, c.opt, c.bt)
		counts[c.label] = n
		t.Logf("%-55s admits %3d full-context sequences (%.2f× fp16)", c.label, n, float64(n)/8)
	}
	if counts["fp16"] != 8 {
		t.Errorf("fp16 admits %d, want 8 (the budget is sized for 8)", counts["fp16"])
	}
	if n := counts["oscar2, no windows"]; n < 48 {
		t.Errorf("oscar2 without windows admits %d full-context sequences, want ≥ 6×8 = 48", n)
	}
	if a, b := counts["oscar2, sink 16 + recent 64"], counts["oscar2, no windows"]; a >= b {
		t.Errorf("oscar2 with windows admits %d, no fewer than without (%d): windows must cost", a, b)
	}
}

// NewCache + decode writes + Release churn through a pool: steady state
// takes its blocks from the free list (blocks made is reported).
func BenchmarkPoolChurn(b *testing.B) {
	layers := []Layer{{NumKVHeads: 2, HeadDim: 64}, {NumKVHeads: 2, HeadDim: 64}, {NumKVHeads: 2, HeadDim: 64}, {NumKVHeads: 2, HeadDim: 64}}
	rng := newRand(9)
	opt := Options{Rotations: randRotations(rng, layers, 0.96, 0.92)}
	const capacity, seqs = 128, 8
	for _, method := range []string{"fp16", "int4", "oscar2"} {
		b.Run(method, func(b *testing.B) {
			probe, err := NewPool(method, layers, opt, 1, 16)
			if err != nil {
				b.Fatal(err)
			}
			p, err := NewPool(method, layers, opt, seqs*probe.BytesFor(capacity), 16)
			if err != nil {
				b.Fatal(err)
			}
			k := tokens(rng, layers, capacity, nil)
			live := make([]runtime.KVCache, 0, seqs)
			b.ResetTimer()
			for it := 0; it < b.N; it++ {
				for len(live) < seqs {
					c, err := p.NewCache(capacity)
					if err != nil {
						b.Fatal(err)
					}
					live = append(live, c)
				}
				for _, c := range live {
					n := c.Len()
					for i := range layers {
						c.Write(i, n, 1, k[i][n*128:(n+1)*128], k[i][n*128:(n+1)*128])
					}
					c.Commit(1)
				}
				for j := 0; j < len(live); j++ {
					if c := live[j]; c.Len() == capacity || rng.IntN(64) == 0 {
						p.Release(c)
						live = slices.Delete(live, j, j+1)
						j--
					}
				}
			}
			b.ReportMetric(float64(b.N*seqs)/b.Elapsed().Seconds(), "tokens/s")
			b.ReportMetric(float64(p.made), "blocks-made")
		})
	}
}

// fullBytes is Bytes() of a New cache of name holding n tokens, without
// windows.
func fullBytes(t *testing.T, name string, layers []Layer, n int) int64 {
	t.Helper()
	c := mustNew(t, name, layers, n, poolOpt(newRand(2), layers, Options{}))
	k, v := tokens(newRand(3), layers, n, nil), tokens(newRand(4), layers, n, nil)
	for i, l := range layers {
		d := l.NumKVHeads * l.HeadDim
		c.Write(i, 0, n, k[i][:n*d], v[i][:n*d])
	}
	c.Commit(n)
	return c.Bytes()
}

// Allocation on demand: a cache from NewCacheReserve reserves its fixed
// bytes and the blocks of its first tokens only; Grow raises the
// reservation block by block, exactly (the pool's reserved bytes are the
// sum of BytesForReserve of its caches), refuses with ErrPoolFull when the
// free budget is short (the reservation unchanged) and with ErrBadShape
// beyond the capacity; storing a token beyond the reservation panics; the
// values written through growth are New's bit for bit; Release returns
// everything.
func TestPoolGrow(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	layers := poolLayersFor("int4")
	for _, c := range []struct {
		name string
		opt  Options
		bt   int
	}{
		{"fp16", Options{}, 16}, {"int4", Options{Sink: 4, Recent: 8}, 16}, {"kivi2", Options{Recent: 16}, 32},
	} {
		const capacity = 200
		probe, err := NewPool(c.name, layers, c.opt, 1<<30, c.bt)
		if err != nil {
			t.Fatal(err)
		}
		if probe.BytesForReserve(capacity, capacity) != probe.BytesFor(capacity) || probe.BytesForReserve(capacity, 10*capacity) != probe.BytesFor(capacity) {
			t.Fatalf("%s: BytesForReserve(c, c) %d, BytesFor(c) %d", c.name, probe.BytesForReserve(capacity, capacity), probe.BytesFor(capacity))
		}
		// Budget: one full cache and a half.
		budget := probe.BytesFor(capacity) * 3 / 2
		p, err := NewPool(c.name, layers, c.opt, budget, c.bt)
		if err != nil {
			t.Fatal(err)
		}
		a, err := p.NewCacheReserve(capacity, 1)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := p.Stats().UsedBytes, p.BytesForReserve(capacity, 1); got != want || want >= p.BytesFor(capacity) {
			t.Fatalf("%s: reserved %d after NewCacheReserve(%d, 1), want %d < BytesFor %d", c.name, got, capacity, want, p.BytesFor(capacity))
		}
		ref := mustNew(t, c.name, layers, capacity, c.opt)
		k, v := tokens(rng, layers, capacity, outlierStd), tokens(rng, layers, capacity, nil)
		n := 0
		write := func(cs runtime.KVCache, t1 int) {
			for i, l := range layers {
				d := l.NumKVHeads * l.HeadDim
				cs.Write(i, n, t1, k[i][n*d:(n+t1)*d], v[i][n*d:(n+t1)*d])
			}
			cs.Commit(t1)
		}
		// Grow token by token (a decode step each) to 150 tokens.
		for n < 150 {
			if err := p.Grow(a, n+1); err != nil {
				t.Fatalf("%s: Grow(%d): %v", c.name, n+1, err)
			}
			if got, want := p.Stats().UsedBytes, p.BytesForReserve(capacity, n+1); got != want {
				t.Fatalf("%s: reserved %d after Grow(%d), want %d", c.name, got, n+1, want)
			}
			write(a, 1)
			write(ref, 1)
			n++
			if st := p.Stats(); int64(st.UsedBlocks)*p.BlockBytes() > st.UsedBytes || st.UsedBytes > st.TotalBytes {
				t.Fatalf("%s: %+v", c.name, st)
			}
		}
		sameState(t, c.name+" grown", ref, a, layers)
		// A second cache takes what is left; growing a then fails.
		bt := 1
		for bt < capacity && p.BytesForReserve(capacity, bt+1) <= p.Stats().FreeBytes {
			bt++
		}
		b, err := p.NewCacheReserve(capacity, bt)
		if err != nil {
			t.Fatalf("%s: second cache: %v", c.name, err)
		}
		free := p.Stats().FreeBytes
		for tok := n + 1; tok <= capacity && p.BytesForReserve(capacity, tok)-p.BytesForReserve(capacity, n) <= free; tok++ {
			if tok == capacity {
				t.Fatalf("%s: the budget should not hold two full caches", c.name)
			}
			if err := p.Grow(a, tok); err != nil {
				t.Fatalf("%s: Grow(%d) within the free budget: %v", c.name, tok, err)
			}
		}
		before := p.Stats().UsedBytes
		err = p.Grow(a, capacity)
		if !errors.Is(err, ErrPoolFull) || p.Stats().UsedBytes != before {
			t.Errorf("%s: Grow beyond the free budget: %v, reserved %d → %d; want ErrPoolFull, unchanged", c.name, err, before, p.Stats().UsedBytes)
		}
		if err := p.Grow(a, capacity+1); !errors.Is(err, ErrBadShape) {
			t.Errorf("%s: Grow beyond the capacity: %v, want ErrBadShape", c.name, err)
		}
		// Storing beyond the reservation is a caller bug: it panics.
		p.Release(a)
		c2, err := p.NewCacheReserve(capacity, 1)
		if err != nil {
			t.Fatal(err)
		}
		{
			func() {
				defer func() {
					if r := recover(); r == nil {
						t.Errorf("%s: a write beyond the reservation did not panic", c.name)
					}
				}()
				save := n
				n = 0
				defer func() { n = save }()
				write(c2, 100)
			}()
		}
		p.Release(b)
		p.Release(c2)
		if st := p.Stats(); st.UsedBytes != 0 || st.UsedBlocks != 0 || st.Sequences != 0 {
			t.Errorf("%s: after Release: %+v", c.name, st)
		}
	}
}
