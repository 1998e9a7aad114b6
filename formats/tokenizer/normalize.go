package tokenizer

import (
	"strings"
	"unicode"

	"github.com/dlclark/regexp2"
	"golang.org/x/text/unicode/norm"
)

// normalizer rewrites a piece of text before pre-tokenization.
type normalizer interface {
	normalize(s string) string
}

type seqNormalizer []normalizer

func (q seqNormalizer) normalize(s string) string {
	for _, n := range q {
		s = n.normalize(s)
	}
	return s
}

// prependNormalizer adds a prefix to non-empty text.
type prependNormalizer struct{ prefix string }

func (p prependNormalizer) normalize(s string) string {
	if s == "" {
		return s
	}
	return p.prefix + s
}

// appendNormalizer adds a suffix to non-empty text.
type appendNormalizer struct{ suffix string }

func (a appendNormalizer) normalize(s string) string {
	if s == "" {
		return s
	}
	return s + a.suffix
}

// replaceNormalizer replaces every match of a literal or a regular
// expression with fixed content.
type replaceNormalizer struct {
	literal string
	re      *regexp2.Regexp // nil for a literal pattern
	content string
}

func (r replaceNormalizer) normalize(s string) string { return r.replace(s) }

func (r replaceNormalizer) replace(s string) string {
	if r.re == nil {
		return strings.ReplaceAll(s, r.literal, r.content)
	}
	out, err := r.re.ReplaceFunc(s, func(regexp2.Match) string { return r.content }, -1, -1)
	if err != nil { // match timeout: leave the text unchanged
		return s
	}
	return out
}

// unicodeNormalizer applies one of the four Unicode normalization forms
// (UAX #15) via golang.org/x/text.
type unicodeNormalizer struct{ form norm.Form }

func (u unicodeNormalizer) normalize(s string) string { return u.form.String(s) }

type lowercaseNormalizer struct{}

func (lowercaseNormalizer) normalize(s string) string { return strings.ToLower(s) }

// stripNormalizer removes leading and/or trailing white space.
type stripNormalizer struct{ left, right bool }

func (st stripNormalizer) normalize(s string) string {
	if st.left {
		s = strings.TrimLeftFunc(s, unicode.IsSpace)
	}
	if st.right {
		s = strings.TrimRightFunc(s, unicode.IsSpace)
	}
	return s
}
