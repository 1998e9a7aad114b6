package tokenizer

import (
	"sort"
	"unicode"
	"unicode/utf8"
)

// addedToken is one entry of tokenizer.json's "added_tokens".
type addedToken struct {
	id         int
	content    string
	singleWord bool
	lstrip     bool
	rstrip     bool
	normalized bool
	special    bool
}

// addedMatcher finds added tokens in text, leftmost first and, among those
// starting at the same byte, the longest (the "leftmost-longest" rule of
// Hugging Face's Aho-Corasick search).
type addedMatcher struct {
	first   [256]bool
	byText  map[string]int // pattern -> index into toks
	lengths []int          // distinct pattern lengths, longest first
	toks    []addedToken
}

func newAddedMatcher(toks []addedToken, patterns []string) *addedMatcher {
	m := &addedMatcher{byText: make(map[string]int), toks: toks}
	seen := map[int]bool{}
	for i, p := range patterns {
		if p == "" {
			continue
		}
		if _, dup := m.byText[p]; dup {
			continue // the first token listed wins
		}
		m.byText[p] = i
		m.first[p[0]] = true
		if !seen[len(p)] {
			seen[len(p)] = true
			m.lengths = append(m.lengths, len(p))
		}
	}
	sort.Sort(sort.Reverse(sort.IntSlice(m.lengths)))
	return m
}

// segment is a stretch of text that is either an added token (id >= 0) or
// ordinary text (id < 0).
type segment struct {
	s  string
	id int
	// first: ordinary text that begins at byte 0 of the input.
	first bool
}

// isWordRune is Rust regex's Unicode \w (Alphabetic, marks, decimal digits,
// connector punctuation, joiners), used by single_word.
func isWordRune(r rune) bool {
	return unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsMark(r) ||
		unicode.Is(unicode.Nl, r) || unicode.Is(unicode.Other_Alphabetic, r) ||
		unicode.Is(unicode.Pc, r) || r == 0x200C || r == 0x200D
}

// split cuts s around added tokens. The flags act as in Hugging Face
// tokenizers: single_word keeps a match only when no word character touches
// it on either side; lstrip/rstrip make the token swallow the white space
// before/after it.
func (m *addedMatcher) split(s string, first bool, out []segment) []segment {
	if m == nil || len(m.byText) == 0 {
		return append(out, segment{s: s, id: -1, first: first})
	}
	prev := 0 // end of the last emitted token
	i := 0
	for i < len(s) {
		if !m.first[s[i]] {
			i++
			continue
		}
		k, n := -1, 0
		for _, l := range m.lengths {
			if i+l <= len(s) {
				if idx, ok := m.byText[s[i:i+l]]; ok {
					k, n = idx, l
					break
				}
			}
		}
		if k < 0 {
			i++
			continue
		}
		t := m.toks[k]
		start, stop := i, i+n
		if t.singleWord {
			before, _ := utf8.DecodeLastRuneInString(s[:start])
			after, _ := utf8.DecodeRuneInString(s[stop:])
			if (start > 0 && isWordRune(before)) || (stop < len(s) && isWordRune(after)) {
				i = stop
				continue
			}
		}
		if t.lstrip {
			for start > prev {
				r, size := utf8.DecodeLastRuneInString(s[:start])
				if !unicode.IsSpace(r) {
					break
				}
				start -= size
			}
		}
		if t.rstrip {
			for stop < len(s) {
				r, size := utf8.DecodeRuneInString(s[stop:])
				if !unicode.IsSpace(r) {
					break
				}
				stop += size
			}
		}
		if start > prev {
			out = append(out, segment{s: s[prev:start], id: -1, first: first && prev == 0})
		}
		out = append(out, segment{s: s[start:stop], id: t.id})
		prev, i = stop, stop
	}
	if prev < len(s) {
		out = append(out, segment{s: s[prev:], id: -1, first: first && prev == 0})
	}
	return out
}
