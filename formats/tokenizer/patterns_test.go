package tokenizer

import (
	"math/rand"
	"reflect"
	"strings"
	"testing"
)

// regexp2 is the reference for the hand-written scanner.
func compareWordFinder(t *testing.T, pat string, s string) {
	t.Helper()
	fast, ok := knownPatterns[pat]
	if !ok {
		t.Fatalf("pattern not recognised: %s", pat)
	}
	re, err := compileRegex(pat)
	if err != nil {
		t.Fatal(err)
	}
	if s == "" {
		return
	}
	want := regexFinder{re}.spans(s, nil)
	got := fast.spans(s, nil)
	if !reflect.DeepEqual(got, want) {
		for k := range min(len(got), len(want)) {
			if got[k] != want[k] {
				t.Fatalf("pattern %q, text %q: span %d fast %q regexp2 %q", pat, s, k, s[got[k].start:got[k].end], s[want[k].start:want[k].end])
			}
		}
		t.Fatalf("pattern %q, text %q: %d spans, regexp2 %d", pat, s, len(got), len(want))
	}
}

var trickyRunes = []rune("aZé中 \t\n\r\v\f\u00a0\u2028\u3000\u0085'sStTrReEvVmMlLdDſ\u212a\u0130K0123²½Ⅻ٣.,!?-_\"()@#\u0301\u200d🤖\x00\x7f")

func randomTricky(rng *rand.Rand, n int) string {
	var sb strings.Builder
	for range n {
		sb.WriteRune(trickyRunes[rng.Intn(len(trickyRunes))])
	}
	return sb.String()
}

func TestWordFinderMatchesRegexp2(t *testing.T) {
	pats := []string{gpt2Pattern, cl100kPattern(""), cl100kPattern("{1,3}"), cl100kPattern("+")}
	texts := []string{
		"Hello world", " leading space and  double  spaces\n\nnew paragraph\ttab",
		"It's, we'll, they're, I'M, you've, he'd 'x ''s", "a \n\n b  \r\n  c   ", "x!!\n\n", " !? \r",
		"Numbers: 1234567 3.14159 2025-01-01 ²½Ⅻ", "def f(x):\n    return x**2  # comment\n",
	}
	texts = append(texts, wikiLines(t)...)
	texts = append(texts, string(readShared(t, "tinystories-valid", "tinystories_val.txt"))[:20000])
	rng := rand.New(rand.NewSource(7))
	for range 3000 {
		texts = append(texts, randomTricky(rng, 1+rng.Intn(24)))
	}
	for _, p := range pats {
		for _, s := range texts {
			compareWordFinder(t, p, s)
		}
	}
}

// FuzzWordFinder compares the hand-written scanner with regexp2 on the
// Qwen2 and GPT-2 patterns.
func FuzzWordFinder(f *testing.F) {
	for _, s := range []string{"Hello world", "a \n\n b  ", "I'M 'll 123", "\u00a0\u3000x", "ſ'S"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		s = toValidUTF8(s)
		compareWordFinder(t, cl100kPattern(""), s)
		compareWordFinder(t, cl100kPattern("{1,3}"), s)
		compareWordFinder(t, gpt2Pattern, s)
	})
}
