package tokenizer

import (
	"fmt"
	"unicode"
	"unicode/utf8"
)

// regexSplitter returns the finder for a split regular expression. The
// split patterns of GPT-2, of the cl100k family (Qwen2/2.5/3 with \p{N},
// Llama-3 with \p{N}{1,3}) are recognised by their exact text and run by a
// hand-written scanner (wordFinder) about ten times faster than regexp2;
// any other pattern runs on regexp2. The scanner reproduces regexp2's
// matches (same Unicode tables: unicode.IsLetter, IsNumber, IsSpace), which
// TestWordFinderMatchesRegexp2 and FuzzWordFinder check.
func regexSplitter(pat string) (finder, error) {
	re, err := compileRegex(pat)
	if err != nil {
		return nil, err
	}
	if f, ok := knownPatterns[pat]; ok {
		return f, nil
	}
	return regexFinder{re}, nil
}

// cl100kPattern returns the cl100k-style pattern text with the given digit
// quantifier ("" for \p{N}, "{1,3}", "+").
func cl100kPattern(digits string) string {
	return `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}` + digits +
		`| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
}

var knownPatterns = func() map[string]wordFinder {
	m := map[string]wordFinder{
		gpt2Pattern:          {gpt2: true},
		cl100kPattern(""):    {maxDigits: 1},
		cl100kPattern("+"):   {maxDigits: 0},
		cl100kPattern("{1}"): {maxDigits: 1},
	}
	for n := 2; n <= 9; n++ {
		m[cl100kPattern(fmt.Sprintf("{1,%d}", n))] = wordFinder{maxDigits: n}
	}
	return m
}()

// Character classes of the split patterns.
const (
	clsOther  = iota // [^\s\p{L}\p{N}]
	clsLetter        // \p{L}
	clsNumber        // \p{N}
	clsSpace         // \s (unicode.IsSpace)
)

var asciiClass = func() (t [utf8.RuneSelf]uint8) {
	for c := rune(0); c < utf8.RuneSelf; c++ {
		switch {
		case unicode.IsLetter(c):
			t[c] = clsLetter
		case unicode.IsNumber(c):
			t[c] = clsNumber
		case unicode.IsSpace(c):
			t[c] = clsSpace
		default:
			t[c] = clsOther
		}
	}
	return t
}()

func runeClass(r rune) uint8 {
	if r < utf8.RuneSelf {
		return asciiClass[r]
	}
	switch {
	case unicode.IsLetter(r):
		return clsLetter
	case unicode.IsNumber(r):
		return clsNumber
	case unicode.IsSpace(r):
		return clsSpace
	}
	return clsOther
}

// wordFinder scans one of the tiktoken-style split patterns by hand.
//
// gpt2:  's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// else:  (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,maxDigits}
//
//	| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+   (maxDigits 0: \p{N}+)
//
// Every character starts a match of one of the alternatives, so the matches
// tile the text. At each position the alternatives are tried in order, as a
// backtracking engine does; the comments give the outcome of backtracking.
type wordFinder struct {
	gpt2      bool
	maxDigits int
}

func (f wordFinder) spans(s string, dst []span) []span {
	for i := 0; i < len(s); {
		j := f.match(s, i)
		dst = append(dst, span{i, j, true})
		i = j
	}
	return dst
}

// at returns the rune at byte i and its size (0 at the end of s).
func at(s string, i int) (rune, int) {
	if i >= len(s) {
		return -1, 0
	}
	if c := s[i]; c < utf8.RuneSelf {
		return rune(c), 1
	}
	return utf8.DecodeRuneInString(s[i:])
}

// classAt returns the class of the rune at byte i (-1 at the end).
func classAt(s string, i int) int {
	r, n := at(s, i)
	if n == 0 {
		return -1
	}
	return int(runeClass(r))
}

// runOf returns the end of the run of class cls starting at i, taking at
// most limit runes (limit <= 0: no limit).
func runOf(s string, i int, cls int, limit int) int {
	for k := 0; limit <= 0 || k < limit; k++ {
		r, n := at(s, i)
		if n == 0 || int(runeClass(r)) != cls {
			break
		}
		i += n
	}
	return i
}

// contraction returns the end of 's|'t|'re|'ve|'m|'ll|'d at i (s[i] is
// '\”), or -1. fold: ASCII case-insensitive, as regexp2 applies (?i) to
// these letters.
func contraction(s string, i int, fold bool) int {
	low := func(k int) byte {
		if k >= len(s) {
			return 0
		}
		c := s[k]
		if fold && c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		return c
	}
	switch low(i + 1) {
	case 's', 't', 'm', 'd':
		return i + 2
	case 'r', 'v':
		if low(i+2) == 'e' {
			return i + 3
		}
	case 'l':
		if low(i+2) == 'l' {
			return i + 3
		}
	}
	return -1
}

func isCRLF(r rune) bool { return r == '\r' || r == '\n' }

// match returns the end of the match starting at i (< len(s)).
func (f wordFinder) match(s string, i int) int {
	c, n := at(s, i)
	cls := int(runeClass(c))
	if c == '\'' {
		if j := contraction(s, i, !f.gpt2); j > 0 {
			return j
		}
	}
	if f.gpt2 {
		// " ?X+" for X in letters, numbers, others.
		if c == ' ' {
			if nc := classAt(s, i+1); nc == clsLetter || nc == clsNumber || nc == clsOther {
				return runOf(s, i+1, nc, 0)
			}
		} else if cls != clsSpace {
			return runOf(s, i, cls, 0)
		}
	} else {
		switch {
		case cls == clsLetter: // \p{L}+ (the optional prefix matched nothing)
			return runOf(s, i, clsLetter, 0)
		case !isCRLF(c) && cls != clsNumber && classAt(s, i+n) == clsLetter:
			// [^\r\n\p{L}\p{N}]\p{L}+
			return runOf(s, i+n, clsLetter, 0)
		case cls == clsNumber:
			return runOf(s, i, clsNumber, f.maxDigits)
		}
		// " ?[^\s\p{L}\p{N}]+[\r\n]*"
		start := -1
		if c == ' ' && classAt(s, i+1) == clsOther {
			start = i + 1
		} else if cls == clsOther {
			start = i
		}
		if start >= 0 {
			j := runOf(s, start, clsOther, 0)
			for j < len(s) && (s[j] == '\r' || s[j] == '\n') {
				j++
			}
			return j
		}
		// "\s*[\r\n]+": up to and including the last \r or \n of the
		// white-space run.
		end, lastNL := i, -1
		for {
			r, m := at(s, end)
			if m == 0 || runeClass(r) != clsSpace {
				break
			}
			if isCRLF(r) {
				lastNL = end + m
			}
			end += m
		}
		if lastNL > 0 {
			return lastNL
		}
	}
	// White space: "\s+(?!\S)" leaves the last space of a run that is
	// followed by a non-space; a lone space falls through to "\s+".
	end, last := i, i
	for {
		r, m := at(s, end)
		if m == 0 || runeClass(r) != clsSpace {
			break
		}
		last = end
		end += m
	}
	if end < len(s) && last > i {
		return last
	}
	return end
}
