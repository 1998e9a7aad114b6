package tokenizer

import (
	"strings"
	"sync"
	"unicode/utf8"
)

// mergeRule is the outcome of merging one ordered pair of token ids: the
// rule's rank (its index in model.merges; lower merges first) and the id of
// the merged token.
type mergeRule struct {
	rank int32
	id   int32
}

func pairKey(a, b int32) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

// bpeModel is a Hugging Face "BPE" model: a vocabulary, ranked merge rules
// and the options that decide what happens to characters outside the
// vocabulary.
type bpeModel struct {
	vocab        map[string]int32
	merges       map[uint64]mergeRule
	unk          int32 // -1 when there is no unk token
	unkName      string
	fuseUnk      bool
	byteFallback bool
	ignoreMerges bool
	prefix       string // continuing_subword_prefix ("" when none)
	suffix       string // end_of_word_suffix ("" when none)
	byteIDs      [256]int32
	runeIDs      map[rune]int32 // single-character vocabulary entries

	cacheMu  sync.RWMutex
	cache    map[string][]int32
	cacheCap int
}

const (
	// wordCacheCap bounds the per-word cache (as the Hugging Face BPE
	// model's default capacity); once full, new words are not cached.
	wordCacheCap = 10000
	// wordCacheMaxLen: words of this many bytes or more are never cached.
	wordCacheMaxLen = 256
)

func (m *bpeModel) initLookups() {
	for b := 0; b < 256; b++ {
		m.byteIDs[b] = -1
		if id, ok := m.vocab[byteToken(byte(b))]; ok {
			m.byteIDs[b] = id
		}
	}
	m.runeIDs = make(map[rune]int32)
	for tok, id := range m.vocab {
		r, n := utf8.DecodeRuneInString(tok)
		if n == len(tok) && (r != utf8.RuneError || n == 3) {
			m.runeIDs[r] = id
		}
	}
	m.cache = make(map[string][]int32)
	m.cacheCap = wordCacheCap
}

const hexDigits = "0123456789ABCDEF"

// byteToken is the byte-fallback token name of b: "<0xNN>", NN uppercase hex.
func byteToken(b byte) string {
	return string([]byte{'<', '0', 'x', hexDigits[b>>4], hexDigits[b&15], '>'})
}

func (m *bpeModel) clearCache() {
	m.cacheMu.Lock()
	m.cache = make(map[string][]int32)
	m.cacheMu.Unlock()
}

// tokenize appends the ids of word w (valid UTF-8) to out.
func (m *bpeModel) tokenize(w string, out []int) []int {
	if w == "" {
		return out
	}
	if m.ignoreMerges {
		if id, ok := m.vocab[w]; ok {
			return append(out, int(id))
		}
	}
	cacheable := len(w) < wordCacheMaxLen
	if cacheable {
		m.cacheMu.RLock()
		ids, ok := m.cache[w]
		m.cacheMu.RUnlock()
		if ok {
			for _, id := range ids {
				out = append(out, int(id))
			}
			return out
		}
	}
	ids := m.mergeWord(w)
	if cacheable {
		m.cacheMu.Lock()
		if len(m.cache) < m.cacheCap {
			m.cache[strings.Clone(w)] = ids
		}
		m.cacheMu.Unlock()
	}
	for _, id := range ids {
		out = append(out, int(id))
	}
	return out
}

// symbol is one node of the doubly linked list of a word being merged.
type symbol struct {
	id         int32
	prev, next int32 // indices into the symbol slice, -1 at the ends
	dead       bool  // merged into its left neighbour
}

// initialSymbols splits w into characters and maps each to an id: the
// vocabulary entry (with continuing_subword_prefix on every character but
// the first and end_of_word_suffix on the last), else its <0xNN> byte tokens
// when byte_fallback is on and all of them exist, else the unk token (a run
// of unknown characters becomes one unk when fuse_unk is set), else the
// character is dropped (no unk token), as in Hugging Face tokenizers.
func (m *bpeModel) initialSymbols(w string) []symbol {
	syms := make([]symbol, 0, len(w))
	add := func(id int32) {
		n := int32(len(syms))
		syms = append(syms, symbol{id: id, prev: n - 1, next: n + 1})
	}
	pendingUnk := false // an unk is waiting (fuse_unk) to be emitted
	flushUnk := func() {
		if pendingUnk {
			add(m.unk)
			pendingUnk = false
		}
	}
	plain := m.prefix == "" && m.suffix == ""
	var sb strings.Builder
	for i, r := range w {
		size := utf8.RuneLen(r)
		var id int32
		found := false
		if plain {
			id, found = m.runeIDs[r]
		} else {
			sb.Reset()
			if i > 0 {
				sb.WriteString(m.prefix)
			}
			sb.WriteString(w[i : i+size])
			if i+size == len(w) {
				sb.WriteString(m.suffix)
			}
			id, found = m.vocab[sb.String()]
		}
		if found {
			flushUnk()
			add(id)
			continue
		}
		if m.byteFallback {
			all := true
			for k := 0; k < size; k++ {
				if m.byteIDs[w[i+k]] < 0 {
					all = false
					break
				}
			}
			if all {
				flushUnk()
				for k := 0; k < size; k++ {
					add(m.byteIDs[w[i+k]])
				}
				continue
			}
		}
		if m.unk < 0 {
			continue
		}
		// (Hugging Face keeps a pending unk waiting across byte-fallback
		// characters and so can emit it after them; with byte_fallback on
		// and a complete <0x00>..<0xFF> set unknowns never occur, and here
		// the unk is emitted in text order.)
		if !m.fuseUnk {
			flushUnk()
		}
		pendingUnk = true
	}
	flushUnk()
	if len(syms) > 0 {
		syms[len(syms)-1].next = -1
	}
	return syms
}

// mergeItem is a candidate merge of the symbol at pos with its right
// neighbour; the queue pops the lowest rank first, then the leftmost pos.
type mergeItem struct {
	rank, pos, id int32
}

func (a mergeItem) less(b mergeItem) bool {
	if a.rank != b.rank {
		return a.rank < b.rank
	}
	return a.pos < b.pos
}

// mergeQueue is a binary min-heap of merge candidates.
type mergeQueue []mergeItem

func (q *mergeQueue) push(it mergeItem) {
	h := append(*q, it)
	i := len(h) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !h[i].less(h[p]) {
			break
		}
		h[i], h[p] = h[p], h[i]
		i = p
	}
	*q = h
}

func (q *mergeQueue) pop() mergeItem {
	h := *q
	top := h[0]
	last := len(h) - 1
	h[0] = h[last]
	h = h[:last]
	i := 0
	for {
		l := 2*i + 1
		if l >= len(h) {
			break
		}
		c := l
		if r := l + 1; r < len(h) && h[r].less(h[l]) {
			c = r
		}
		if !h[c].less(h[i]) {
			break
		}
		h[i], h[c] = h[c], h[i]
		i = c
	}
	*q = h
	return top
}

// mergeWord runs BPE on one word: it repeatedly applies the lowest-ranked
// merge rule present among adjacent symbols (leftmost first on ties) until
// none applies. Candidates sit in a min-heap over a linked list of symbols,
// so a word of n characters costs O(n log n) (Sennrich et al. 2016 define
// BPE; the heap-with-lazy-invalidation scheme is the one Hugging Face
// tokenizers uses: a popped candidate is applied only if its left symbol is
// alive, has a right neighbour, and that pair still merges into the same id).
func (m *bpeModel) mergeWord(w string) []int32 {
	syms := m.initialSymbols(w)
	if len(syms) > 1 {
		q := make(mergeQueue, 0, len(syms))
		for i := 0; i+1 < len(syms); i++ {
			if r, ok := m.merges[pairKey(syms[i].id, syms[i+1].id)]; ok {
				q.push(mergeItem{r.rank, int32(i), r.id})
			}
		}
		for len(q) > 0 {
			top := q.pop()
			s := &syms[top.pos]
			if s.dead || s.next < 0 {
				continue
			}
			nx := s.next
			r, ok := m.merges[pairKey(s.id, syms[nx].id)]
			if !ok || r.id != top.id {
				continue
			}
			s.id = top.id
			syms[nx].dead = true
			s.next = syms[nx].next
			if s.next >= 0 {
				syms[s.next].prev = top.pos
			}
			if s.prev >= 0 {
				if r, ok := m.merges[pairKey(syms[s.prev].id, s.id)]; ok {
					q.push(mergeItem{r.rank, s.prev, r.id})
				}
			}
			if s.next >= 0 {
				if r, ok := m.merges[pairKey(s.id, syms[s.next].id)]; ok {
					q.push(mergeItem{r.rank, top.pos, r.id})
				}
			}
		}
	}
	ids := make([]int32, 0, len(syms))
	for i := range syms {
		if !syms[i].dead {
			ids = append(ids, syms[i].id)
		}
	}
	return ids
}
