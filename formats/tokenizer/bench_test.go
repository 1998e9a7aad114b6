package tokenizer

import (
	"testing"
)

// wikiChunk is the first 256 KiB of WikiText-2 test, cut at a line end.
func wikiChunk(b *testing.B) string {
	raw := string(readShared(b, "wikitext-2-raw-test", "wiki.test.raw"))
	n := 256 << 10
	for n < len(raw) && raw[n-1] != '\n' {
		n++
	}
	return raw[:n]
}

func benchEncode(b *testing.B, tk *Tokenizer, text string, cold bool) {
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	b.ResetTimer()
	tokens := 0
	for b.Loop() {
		if cold {
			b.StopTimer()
			tk.model.clearCache()
			b.StartTimer()
		}
		tokens += len(tk.Encode(text, true))
	}
	b.ReportMetric(float64(tokens)/b.Elapsed().Seconds(), "tokens/s")
}

// BenchmarkEncodeTinyStoriesStories260K encodes the whole 794 KB
// tinystories_val.txt as one string (one BPE word of 793k characters).
func BenchmarkEncodeTinyStoriesStories260K(b *testing.B) {
	tk := storiesTokenizer(b)
	benchEncode(b, tk, string(readShared(b, "tinystories-valid", "tinystories_val.txt")), false)
}

// BenchmarkEncodeWikiTextQwen3 encodes 256 KiB of WikiText with Qwen3, the
// per-word cache warm after the first iteration.
func BenchmarkEncodeWikiTextQwen3(b *testing.B) {
	benchEncode(b, qwenTokenizer(b), wikiChunk(b), false)
}

// BenchmarkEncodeWikiTextQwen3Cold is the same with the word cache cleared
// before every iteration.
func BenchmarkEncodeWikiTextQwen3Cold(b *testing.B) {
	benchEncode(b, qwenTokenizer(b), wikiChunk(b), true)
}

// BenchmarkDecodeWikiTextQwen3 decodes the ids of the same chunk.
func BenchmarkDecodeWikiTextQwen3(b *testing.B) {
	tk := qwenTokenizer(b)
	text := wikiChunk(b)
	ids := tk.Encode(text, false)
	b.SetBytes(int64(len(text)))
	b.ResetTimer()
	for b.Loop() {
		_ = tk.Decode(ids, false)
	}
	b.ReportMetric(float64(len(ids)*b.N)/b.Elapsed().Seconds(), "tokens/s")
}

// BenchmarkLoadQwen3 parses the gzip-compressed 11 MB Qwen3 tokenizer.json.
func BenchmarkLoadQwen3(b *testing.B) {
	data := readShared(b, "qwen3-tokenizer", "tokenizer.json.gz")
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if _, err := Parse(data); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEncodeWikiTextQwen3Regexp2 is BenchmarkEncodeWikiTextQwen3 with
// the split pattern run by regexp2 instead of the hand-written scanner.
func BenchmarkEncodeWikiTextQwen3Regexp2(b *testing.B) {
	tk := qwenTokenizer(b)
	seq, ok := tk.pre.(seqPreTokenizer)
	if !ok || len(seq) != 2 {
		b.Fatalf("unexpected Qwen3 pre-tokenizer %T", tk.pre)
	}
	sp := seq[0].(splitPreTokenizer)
	re, err := compileRegex(cl100kPattern(""))
	if err != nil {
		b.Fatal(err)
	}
	sp.f = regexFinder{re}
	slow := &Tokenizer{model: tk.model, normalizer: tk.normalizer, pre: seqPreTokenizer{sp, seq[1]},
		addedRaw: tk.addedRaw, addedNorm: tk.addedNorm}
	benchEncode(b, slow, wikiChunk(b), false)
}
