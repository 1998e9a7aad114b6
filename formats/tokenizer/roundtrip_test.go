package tokenizer

import (
	"math/rand"
	"strings"
	"testing"
)

// roundTrip checks decode(encode(x)) == x and stream == Decode on each text.
func roundTrip(t *testing.T, tk *Tokenizer, name string, texts []string) {
	t.Helper()
	bad := 0
	for i, x := range texts {
		ids := tk.Encode(x, true)
		if got := tk.Decode(ids, true); got != x {
			bad++
			if bad <= 3 {
				t.Errorf("%s[%d]: Decode(Encode(x)) = %q, want %q", name, i, got, x)
			}
			continue
		}
		if got := streamAll(tk, ids, true); got != x {
			bad++
			if bad <= 3 {
				t.Errorf("%s[%d]: stream decode = %q, want %q", name, i, got, x)
			}
		}
	}
	if bad > 0 {
		t.Errorf("%s: %d of %d texts fail", name, bad, len(texts))
	}
}

func tinyStoriesLines(t *testing.T) []string {
	var out []string
	for _, l := range strings.Split(string(readShared(t, "tinystories-valid", "tinystories_val.txt")), "\n") {
		if l != "" {
			out = append(out, l)
		}
	}
	return out
}

func TestRoundTripStories(t *testing.T) {
	tk := storiesTokenizer(t)
	wiki := wikiLines(t)
	if len(wiki) != 2891 {
		t.Fatalf("wiki.test.raw: %d non-empty lines, SOURCE.md says 2,891", len(wiki))
	}
	roundTrip(t, tk, "wikitext", wiki)
	roundTrip(t, tk, "tinystories", tinyStoriesLines(t))
}

func TestRoundTripQwen3(t *testing.T) {
	tk := qwenTokenizer(t)
	roundTrip(t, tk, "wikitext", wikiLines(t))
	roundTrip(t, tk, "tinystories", tinyStoriesLines(t))
	// The whole files as single strings too (CRLF, blank lines, mojibake).
	roundTrip(t, tk, "files", []string{
		string(readShared(t, "tinystories-valid", "tinystories_val.txt")),
		string(readShared(t, "wikitext-2-raw-test", "wiki.test.raw"))[:200000],
	})
}

// TestStreamMatchesDecodeRandomIDs feeds arbitrary id sequences (including
// lone and invalid <0xNN> runs, specials, unknown ids) through the stream
// decoder: the concatenation must equal Decode exactly.
func TestStreamMatchesDecodeRandomIDs(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	for _, tc := range []struct {
		name string
		tk   *Tokenizer
	}{{"stories260K", storiesTokenizer(t)}, {"qwen3", qwenTokenizer(t)}} {
		n := tc.tk.VocabSize()
		for trial := 0; trial < 300; trial++ {
			ids := make([]int, rng.Intn(40))
			for i := range ids {
				switch rng.Intn(4) {
				case 0: // byte tokens / first ids
					ids[i] = rng.Intn(300)
				case 1: // top ids: the added tokens of Qwen3
					ids[i] = n - 1 - rng.Intn(40)
				case 2:
					ids[i] = rng.Intn(n+4) - 2 // includes invalid ids
				default:
					ids[i] = rng.Intn(n)
				}
			}
			for _, skip := range []bool{false, true} {
				want := tc.tk.Decode(ids, skip)
				if got := streamAll(tc.tk, ids, skip); got != want {
					t.Fatalf("%s ids %v skip=%v: stream %q, Decode %q", tc.name, ids, skip, got, want)
				}
			}
		}
	}
}

// TestStreamAfterPrefix: NewStreamDecoderAfter(prefix) returns exactly
// the text Decode(prefix+rest) adds after Decode(prefix), for random ids
// split at random points: a SentencePiece decoder's leading-space strip
// applies only at the start of the whole sequence. With the stories260K
// tokenizer "the" + " park" streams " park", and after BOS alone the
// first token's space is stripped as Decode strips it.
func TestStreamAfterPrefix(t *testing.T) {
	tk := storiesTokenizer(t)
	ids := tk.Encode("the park", true) // BOS, ▁the, then " park" in pieces
	if len(ids) < 3 || tk.Decode(ids[:2], true) != "the" {
		t.Fatalf("Encode(the park) = %v: want BOS and ▁the first", ids)
	}
	stream := func(d *StreamDecoder, rest []int) string {
		var b strings.Builder
		for _, id := range rest {
			b.WriteString(d.Next(id))
		}
		return b.String() + d.Flush()
	}
	if got := stream(tk.NewStreamDecoderAfter(ids[:2], true), ids[2:]); got != " park" {
		t.Errorf("after %v: %q, want \" park\"", ids[:2], got)
	}
	if got := stream(tk.NewStreamDecoderAfter(ids[:1], true), ids[1:]); got != "the park" {
		t.Errorf("after BOS: %q, want \"the park\"", got)
	}
	rng := rand.New(rand.NewSource(2))
	for _, tc := range []struct {
		name string
		tk   *Tokenizer
	}{{"stories260K", tk}, {"qwen3", qwenTokenizer(t)}} {
		n := tc.tk.VocabSize()
		for trial := 0; trial < 300; trial++ {
			all := make([]int, 1+rng.Intn(30))
			for i := range all {
				if rng.Intn(3) == 0 {
					all[i] = 3 + rng.Intn(300) // byte tokens of stories260K
				} else {
					all[i] = rng.Intn(n)
				}
			}
			k := rng.Intn(len(all) + 1)
			for _, skip := range []bool{false, true} {
				whole, pre := tc.tk.Decode(all, skip), tc.tk.Decode(all[:k], skip)
				if !strings.HasPrefix(whole, pre) {
					continue // a byte run across the split decodes differently
				}
				d := tc.tk.NewStreamDecoderAfter(all[:k], skip)
				var got strings.Builder
				for _, id := range all[k:] {
					got.WriteString(d.Next(id))
				}
				got.WriteString(d.Flush())
				if got.String() != whole[len(pre):] {
					t.Fatalf("%s ids %v split %d skip=%v: stream %q, want %q", tc.name, all, k, skip, got.String(), whole[len(pre):])
				}
			}
		}
	}
}
