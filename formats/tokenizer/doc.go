// Package tokenizer is a pure-Go implementation of Hugging Face
// tokenizer.json files with a BPE model, for the two layouts LLM checkpoints
// use:
//
//   - SentencePiece-style BPE with byte fallback, the Llama-2 "legacy"
//     layout (e.g. stories260K): normalizer Prepend("▁") + Replace(" "→"▁"),
//     no pre-tokenizer (the whole text is one BPE word), <0xNN> byte tokens
//     for characters outside the vocabulary, decoder Replace / ByteFallback /
//     Fuse / Strip.
//   - Byte-level BPE (GPT-2's bytes→unicode map) behind a regex split:
//     GPT-2 (ByteLevel with use_regex), Llama-3 and Qwen2/2.5/3 (Split on a
//     pattern with the look-ahead \s+(?!\S), then ByteLevel).
//
// Why our own: no pure-Go library handles these files. Go's regexp (RE2)
// has no look-around, so the Llama-3/Qwen split pattern does not compile
// there, and github.com/sugarme/tokenizer panics on it. Split patterns run on
// github.com/dlclark/regexp2 (a backtracking, .NET-syntax engine: \p{L},
// \p{N}, (?i:...), look-ahead; each match is bounded by a 5 s timeout, after
// which the rest of the piece stays unsplit). The three common patterns
// (GPT-2, and the cl100k family with \p{N}, \p{N}{1,n} or \p{N}+) are
// recognised by their text and run by a hand-written scanner that gives the
// same matches as regexp2 (checked on WikiText, TinyStories, random strings
// of tricky characters and by FuzzWordFinder), faster
// (BenchmarkEncodeWikiTextQwen3Regexp2 compares the two).
//
// Semantics follow the Rust reference implementation (huggingface/tokenizers):
// added tokens are cut out first (leftmost, then longest; single_word,
// lstrip, rstrip and normalized honoured; all added tokens match whether
// special or not), each remaining stretch is normalized, pre-tokenized and
// BPE-encoded word by word; BPE merges by rank with a heap over a linked list
// of symbols (O(n log n); a 794 KB single-word text takes about 0.2 s), with
// byte_fallback, unk_token, fuse_unk, ignore_merges,
// continuing_subword_prefix and end_of_word_suffix. Words shorter than 256
// bytes are cached (up to 10,000). Verified against: run.c/tokenizers.js ids
// of the whole TinyStories excerpt (393,019 ids) for stories260K; the
// tokenizers.js reference encodings for Qwen3.
//
// Supported components. Normalizers: Sequence, Prepend, Append, Replace
// (string or regex), NFC, NFD, NFKC, NFKD, Lowercase, Strip.
// Pre-tokenizers: Sequence, Split (all five behaviours, invert), ByteLevel,
// Metaspace, Digits, Whitespace, WhitespaceSplit. Post-processors:
// TemplateProcessing (single template), ByteLevel, Sequence,
// RobertaProcessing, BertProcessing. Decoders: Sequence, Replace, ByteFallback,
// Fuse, Strip, ByteLevel, Metaspace. Anything else is rejected by Parse with
// ErrUnsupported, naming the field.
//
// Not for: WordPiece, Unigram and WordLevel models; the Precompiled
// (SentencePiece charsmap) normalizer; BPE dropout; sentence pairs; offsets,
// attention masks, truncation and padding (those tokenizer.json sections are
// ignored); chat templates.
//
// Round trip. Decode(Encode(x, true), skipSpecial) == x is tested on every
// line of TinyStories and WikiText-2, the TinyStories file as one string,
// and the Qwen3 reference strings, and is fuzzed (FuzzEncode). It holds:
//
//   - stories260K (skipSpecial true): for valid UTF-8 x that contains
//     neither U+2581 "▁" (decoded as a space) nor the literal texts "<s>",
//     "</s>", "<unk>" (they become those tokens; with skipSpecial they are
//     dropped, without it the decoder yields e.g. "a<s> b" for "a<s>b"
//     because the text after the token gets its own "▁"). Leading spaces
//     round-trip: the Strip decoder removes exactly the one "▁" the
//     normalizer prepends.
//   - Qwen3 (skipSpecial false): for valid UTF-8 x already in NFC (the NFC
//     normalizer changes other text). Added-token texts such as
//     "<|im_start|>" come back verbatim; with skipSpecial those marked
//     special are dropped.
//
// Invalid UTF-8: Encode never panics; it first replaces each maximal
// ill-formed subsequence with U+FFFD (Unicode's "maximal subpart" practice,
// as Rust's from_utf8_lossy and Python's errors="replace"). Decode output is
// always valid UTF-8 (ill-formed byte sequences from byte tokens become
// U+FFFD the same way; a <0xNN> run that is not valid UTF-8 becomes one
// U+FFFD per byte, as Hugging Face's ByteFallback decoder does).
//
// Streaming: StreamDecoder emits text as ids arrive and its output
// concatenates to exactly Decode's, for any id sequence (tested on random
// ids and by FuzzStreamDecode).
//
// Regex caveat: matches follow regexp2 and Go's unicode tables, not
// Oniguruma (used by the Rust library); the two can differ on rarely used
// characters (e.g. newly assigned code points, case-insensitive matching of
// non-ASCII letters in (?i:'s|...)).
//
// A Tokenizer is safe for concurrent use; a StreamDecoder is not.
//
// Encode (warm and cold word cache), decode and load speeds are measured by
// the benchmarks of bench_test.go.
//
// References: Sennrich, Haddow, Birch, "Neural Machine Translation of Rare
// Words with Subword Units" (ACL 2016) for BPE; Radford et al., "Language
// Models are Unsupervised Multitask Learners" (2019) for byte-level BPE; the
// huggingface/tokenizers documentation and source for the file format and
// the behaviour of each component.
package tokenizer
