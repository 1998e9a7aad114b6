package tokenizer

import (
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
)

// piece is one split of the input on its way to the model.
type piece struct {
	s string
	// first: the piece begins at byte 0 of the original input (used by the
	// Metaspace pre-tokenizer's prepend_scheme "first").
	first bool
}

// preTokenizer cuts pieces into smaller pieces (words); the model then sees
// each word on its own.
type preTokenizer interface {
	apply(in []piece) []piece
}

// span is a half-open byte range [start, end) of a piece and whether it is a
// match of the split pattern.
type span struct {
	start, end int
	match      bool
}

// finder finds the non-overlapping matches of a split pattern, left to right.
type finder interface {
	// spans covers s with matches and the gaps between them, in order
	// (empty gaps omitted). s is never empty.
	spans(s string, dst []span) []span
}

// literalFinder matches a fixed string.
type literalFinder struct{ pat string }

func (f literalFinder) spans(s string, dst []span) []span {
	prev := 0
	if f.pat == "" {
		// An empty pattern matches (emptily) at every character boundary.
		for i := range s {
			if i > prev {
				dst = append(dst, span{prev, i, false})
			}
			dst = append(dst, span{i, i, true})
			prev = i
		}
		return append(dst, span{prev, len(s), false})
	}
	for {
		k := strings.Index(s[prev:], f.pat)
		if k < 0 {
			break
		}
		start := prev + k
		if start > prev {
			dst = append(dst, span{prev, start, false})
		}
		dst = append(dst, span{start, start + len(f.pat), true})
		prev = start + len(f.pat)
	}
	if prev < len(s) {
		dst = append(dst, span{prev, len(s), false})
	}
	return dst
}

// charFinder matches every single character for which pred is true (each
// character is its own match, as Hugging Face's char-predicate patterns).
type charFinder struct{ pred func(rune) bool }

func (f charFinder) spans(s string, dst []span) []span {
	prev := 0
	for i, r := range s {
		if f.pred(r) {
			if i > prev {
				dst = append(dst, span{prev, i, false})
			}
			n := utf8.RuneLen(r)
			dst = append(dst, span{i, i + n, true})
			prev = i + n
		}
	}
	if prev < len(s) {
		dst = append(dst, span{prev, len(s), false})
	}
	return dst
}

// regexMatchTimeout bounds one regexp2 match call (a backtracking engine can
// be driven into exponential time by a hostile pattern in a tokenizer.json).
// On timeout the rest of the piece is kept as one unsplit gap.
const regexMatchTimeout = 5 * time.Second

// regexFinder matches a regexp2 (.NET-syntax backtracking) regular
// expression. regexp2 handles the look-ahead "\s+(?!\S)" that the GPT-2,
// Llama-3 and Qwen2 split patterns need and Go's regexp (RE2) rejects; its
// \s is unicode.IsSpace and \p{L}, \p{N} use Go's Unicode tables.
type regexFinder struct {
	re *regexp2.Regexp
}

func compileRegex(pat string) (*regexp2.Regexp, error) {
	re, err := regexp2.Compile(pat, regexp2.None)
	if err != nil {
		return nil, err
	}
	re.MatchTimeout = regexMatchTimeout
	return re, nil
}

func (f regexFinder) spans(s string, dst []span) []span {
	runes := []rune(s)
	prev := 0      // byte offset of the end of the last match
	ri, bi := 0, 0 // rune index and byte offset cursor
	toByte := func(r int) int {
		for ri < r {
			_, n := utf8.DecodeRuneInString(s[bi:])
			bi += n
			ri++
		}
		return bi
	}
	m, err := f.re.FindRunesMatch(runes)
	for err == nil && m != nil {
		start := toByte(m.Index)
		end := toByte(m.Index + m.Length)
		if start > prev {
			dst = append(dst, span{prev, start, false})
		}
		dst = append(dst, span{start, end, true})
		prev = end
		m, err = f.re.FindNextMatch(m)
	}
	if prev < len(s) {
		dst = append(dst, span{prev, len(s), false})
	}
	return dst
}

// splitBehavior says what happens to the matches of a Split pattern.
type splitBehavior int

const (
	splitRemoved splitBehavior = iota
	splitIsolated
	splitMergedWithPrevious
	splitMergedWithNext
	splitContiguous
)

var splitBehaviors = map[string]splitBehavior{
	"Removed":            splitRemoved,
	"Isolated":           splitIsolated,
	"MergedWithPrevious": splitMergedWithPrevious,
	"MergedWithNext":     splitMergedWithNext,
	"Contiguous":         splitContiguous,
}

// splitPiece splits p at the matches of f according to behavior (with
// invert, the gaps play the role of the matches). Empty results are dropped.
func splitPiece(p piece, f finder, behavior splitBehavior, invert bool, out []piece) []piece {
	if p.s == "" {
		return out
	}
	sp := f.spans(p.s, nil)
	if invert {
		for i := range sp {
			sp[i].match = !sp[i].match
		}
	}
	type cut struct {
		start, end int
		remove     bool
	}
	var cuts []cut
	switch behavior {
	case splitIsolated:
		for _, x := range sp {
			cuts = append(cuts, cut{x.start, x.end, false})
		}
	case splitRemoved:
		for _, x := range sp {
			cuts = append(cuts, cut{x.start, x.end, x.match})
		}
	case splitMergedWithPrevious:
		prevMatch := false
		for _, x := range sp {
			if x.match && !prevMatch && len(cuts) > 0 {
				cuts[len(cuts)-1].end = x.end
			} else {
				cuts = append(cuts, cut{x.start, x.end, false})
			}
			prevMatch = x.match
		}
	case splitMergedWithNext:
		prevMatch := false
		for i := len(sp) - 1; i >= 0; i-- {
			x := sp[i]
			if x.match && !prevMatch && len(cuts) > 0 {
				cuts[len(cuts)-1].start = x.start
			} else {
				cuts = append(cuts, cut{x.start, x.end, false})
			}
			prevMatch = x.match
		}
		for i, j := 0, len(cuts)-1; i < j; i, j = i+1, j-1 {
			cuts[i], cuts[j] = cuts[j], cuts[i]
		}
	case splitContiguous:
		prevMatch := false
		for i, x := range sp {
			if i > 0 && x.match == prevMatch {
				cuts[len(cuts)-1].end = x.end
			} else {
				cuts = append(cuts, cut{x.start, x.end, false})
			}
			prevMatch = x.match
		}
	}
	first := p.first
	for _, c := range cuts {
		if c.remove || c.end <= c.start {
			continue
		}
		out = append(out, piece{s: p.s[c.start:c.end], first: first && c.start == 0})
	}
	return out
}

// seqPreTokenizer applies its members in order.
type seqPreTokenizer []preTokenizer

func (q seqPreTokenizer) apply(in []piece) []piece {
	for _, p := range q {
		in = p.apply(in)
	}
	return in
}

// splitPreTokenizer is Hugging Face's "Split": cut on a pattern.
type splitPreTokenizer struct {
	f        finder
	behavior splitBehavior
	invert   bool
}

func (s splitPreTokenizer) apply(in []piece) []piece {
	out := make([]piece, 0, len(in)*4)
	for _, p := range in {
		out = splitPiece(p, s.f, s.behavior, s.invert, out)
	}
	return out
}

// gpt2Pattern is the GPT-2 word-splitting regular expression, which the
// ByteLevel pre-tokenizer applies when use_regex is true.
const gpt2Pattern = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`

// byteLevelPreTokenizer is Hugging Face's "ByteLevel" pre-tokenizer: an
// optional leading space, an optional GPT-2 regex split, then every byte
// replaced by its byte-level character (see byteToRune).
type byteLevelPreTokenizer struct {
	addPrefixSpace bool
	split          finder // nil when use_regex is false
}

func (b byteLevelPreTokenizer) apply(in []piece) []piece {
	out := make([]piece, 0, len(in)*2)
	for _, p := range in {
		if p.s == "" {
			continue
		}
		if b.addPrefixSpace && p.s[0] != ' ' {
			p.s = " " + p.s
		}
		start := len(out)
		if b.split != nil {
			out = splitPiece(p, b.split, splitIsolated, false, out)
		} else {
			out = append(out, p)
		}
		for i := start; i < len(out); i++ {
			out[i].s = byteLevelEncode(out[i].s)
		}
	}
	return out
}

// prependScheme is the Metaspace pre-tokenizer's rule for adding the
// replacement character in front of a piece.
type prependScheme int

const (
	prependAlways prependScheme = iota
	prependFirst
	prependNever
)

// metaspacePreTokenizer is Hugging Face's "Metaspace" (SentencePiece-style)
// pre-tokenizer: spaces become the replacement character (usually U+2581),
// which is prepended per prependScheme, and pieces are split in front of each
// replacement character when split is set.
type metaspacePreTokenizer struct {
	repl   rune
	scheme prependScheme
	split  bool
}

func (m metaspacePreTokenizer) apply(in []piece) []piece {
	rs := string(m.repl)
	out := make([]piece, 0, len(in)*4)
	for _, p := range in {
		if p.s == "" {
			continue
		}
		p.s = strings.ReplaceAll(p.s, " ", rs)
		if !strings.HasPrefix(p.s, rs) && (m.scheme == prependAlways || (m.scheme == prependFirst && p.first)) {
			p.s = rs + p.s
		}
		if m.split {
			out = splitPiece(p, literalFinder{rs}, splitMergedWithNext, false, out)
		} else {
			out = append(out, p)
		}
	}
	return out
}

// digitsPreTokenizer is Hugging Face's "Digits": numeric characters are
// isolated, one by one (individual) or as runs.
type digitsPreTokenizer struct{ individual bool }

func (d digitsPreTokenizer) apply(in []piece) []piece {
	b := splitContiguous
	if d.individual {
		b = splitIsolated
	}
	out := make([]piece, 0, len(in)*2)
	for _, p := range in {
		out = splitPiece(p, charFinder{unicode.IsNumber}, b, false, out)
	}
	return out
}
