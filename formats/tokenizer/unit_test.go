package tokenizer

import (
	"errors"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func pieceStrings(ps []piece) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.s
	}
	return out
}

// The example of the Hugging Face docs for SplitDelimiterBehavior
// (delimiter "-", text "the-final--countdown").
func TestSplitBehaviors(t *testing.T) {
	want := map[splitBehavior][]string{
		splitRemoved:            {"the", "final", "countdown"},
		splitIsolated:           {"the", "-", "final", "-", "-", "countdown"},
		splitMergedWithPrevious: {"the-", "final-", "-", "countdown"},
		splitMergedWithNext:     {"the", "-final", "-", "-countdown"},
		splitContiguous:         {"the", "-", "final", "--", "countdown"},
	}
	for b, w := range want {
		got := pieceStrings(splitPiece(piece{s: "the-final--countdown"}, literalFinder{"-"}, b, false, nil))
		if !reflect.DeepEqual(got, w) {
			t.Errorf("behavior %d: got %q want %q", b, got, w)
		}
	}
	// invert: the pattern marks the content, the rest is the delimiter.
	got := pieceStrings(splitPiece(piece{s: "ab12cd3"}, charFinder{func(r rune) bool { return r >= '0' && r <= '9' }}, splitRemoved, true, nil))
	if w := []string{"1", "2", "3"}; !reflect.DeepEqual(got, w) {
		t.Errorf("inverted Removed: got %q want %q", got, w)
	}
}

// Unicode Core Specification 16.0, section 3.9, Table 3-8 ("U+FFFD for
// non-shortest form sequences" / maximal subparts example):
// 61 F1 80 80 E1 80 C2 62 80 63 80 BF 64 ->
// 0061 FFFD FFFD FFFD 0062 FFFD 0063 FFFD FFFD 0064.
func TestLossyMaximalSubparts(t *testing.T) {
	in := []byte{0x61, 0xF1, 0x80, 0x80, 0xE1, 0x80, 0xC2, 0x62, 0x80, 0x63, 0x80, 0xBF, 0x64}
	want := "a\uFFFD\uFFFD\uFFFDb\uFFFDc\uFFFD\uFFFDd"
	if got := toValidUTF8(string(in)); got != want {
		t.Errorf("got %+q want %+q", got, want)
	}
	// Surrogates (ED A0 80) and overlongs (C0 AF) are one U+FFFD per byte.
	if got := toValidUTF8("\xED\xA0\x80|\xC0\xAF"); got != "\uFFFD\uFFFD\uFFFD|\uFFFD\uFFFD" {
		t.Errorf("surrogate/overlong: got %+q", got)
	}
	// Streaming: an incomplete but valid prefix is held back until decided.
	out, n := appendLossy(nil, []byte("x\xE2\x82"), false)
	if string(out) != "x" || n != 1 {
		t.Errorf("incomplete tail: out %q n %d, want \"x\" 1", out, n)
	}
	out, n = appendLossy(nil, []byte("x\xE2\x82A"), false)
	if string(out) != "x\uFFFDA" || n != 4 {
		t.Errorf("broken sequence: out %+q n %d", out, n)
	}
}

// The GPT-2 byte table: Qwen3's vocabulary (like GPT-2's) starts with the
// 256 byte characters in the order bytes_to_unicode lists them: the
// printable ranges 33..126, 161..172, 174..255, then the other bytes.
func TestByteLevelTableMatchesQwenVocab(t *testing.T) {
	tk := qwenTokenizer(t)
	var order []int
	for b := 33; b <= 126; b++ {
		order = append(order, b)
	}
	for b := 161; b <= 172; b++ {
		order = append(order, b)
	}
	for b := 174; b <= 255; b++ {
		order = append(order, b)
	}
	for b := 0; b < 256; b++ {
		if !(b >= 33 && b <= 126) && !(b >= 161 && b <= 172) && !(b >= 174 && b <= 255) {
			order = append(order, b)
		}
	}
	for id, b := range order {
		if got := tk.Token(id); got != string(byteToRune[b]) {
			t.Fatalf("vocab id %d = %q, table maps byte %#x to %q", id, got, b, string(byteToRune[b]))
		}
	}
	if byteToRune[' '] != 'Ġ' || byteToRune['\n'] != 'Ċ' || byteToRune[0xAD] != 'Ń' {
		t.Errorf("well-known entries: space %q newline %q soft hyphen %q", byteToRune[' '], byteToRune['\n'], byteToRune[0xAD])
	}
}

// tinyJSON builds a small tokenizer.json around a BPE model.
func tinyJSON(model string, extra string) string {
	s := `{"version":"1.0","model":` + model
	if extra != "" {
		s += "," + extra
	}
	return s + "}"
}

func mustParse(t *testing.T, js string) *Tokenizer {
	t.Helper()
	tk, err := Parse([]byte(js))
	if err != nil {
		t.Fatalf("Parse: %v\n%s", err, js)
	}
	return tk
}

func toks(tk *Tokenizer, ids []int) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = tk.Token(id)
	}
	return out
}

// Hand-worked BPE cases.
func TestBPEMergeOrder(t *testing.T) {
	tk := mustParse(t, tinyJSON(`{"type":"BPE","vocab":{"a":0,"b":1,"c":2,"ab":3,"bc":4,"abc":5,"aa":6},
		"merges":["b c","a b","a bc","a a"]}`, ""))
	cases := []struct {
		in   string
		want []string
	}{
		// "b c" (rank 0) wins over "a b" (rank 1); then "a bc".
		{"abc", []string{"abc"}},
		// No "ab c" rule: once "a b" merged, "c" stays.
		{"abac", []string{"ab", "a", "c"}},
		// Equal ranks: leftmost first.
		{"aaa", []string{"aa", "a"}},
		{"aaaa", []string{"aa", "aa"}},
		{"", []string{}},
	}
	for _, c := range cases {
		if got := toks(tk, tk.Encode(c.in, false)); !reflect.DeepEqual(got, c.want) {
			t.Errorf("Encode(%q) = %q, want %q", c.in, got, c.want)
		}
	}
	// Pair-array merge form gives the same model.
	tk2 := mustParse(t, tinyJSON(`{"type":"BPE","vocab":{"a":0,"b":1,"c":2,"ab":3,"bc":4,"abc":5,"aa":6},
		"merges":[["b","c"],["a","b"],["a","bc"],["a","a"]]}`, ""))
	for _, c := range cases {
		if got := toks(tk2, tk2.Encode(c.in, false)); !reflect.DeepEqual(got, c.want) {
			t.Errorf("pair form: Encode(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestBPEUnknownAndIgnoreMerges(t *testing.T) {
	vocab := `"vocab":{"<unk>":0,"a":1,"b":2,"ab":3,"abb":4}`
	fused := mustParse(t, tinyJSON(`{"type":"BPE",`+vocab+`,"merges":["a b"],"unk_token":"<unk>","fuse_unk":true}`, ""))
	if got := toks(fused, fused.Encode("zzazy", false)); !reflect.DeepEqual(got, []string{"<unk>", "a", "<unk>"}) {
		t.Errorf("fuse_unk: %q", got)
	}
	plain := mustParse(t, tinyJSON(`{"type":"BPE",`+vocab+`,"merges":["a b"],"unk_token":"<unk>"}`, ""))
	if got := toks(plain, plain.Encode("zzazy", false)); !reflect.DeepEqual(got, []string{"<unk>", "<unk>", "a", "<unk>", "<unk>"}) {
		t.Errorf("no fuse_unk: %q", got)
	}
	noUnk := mustParse(t, tinyJSON(`{"type":"BPE",`+vocab+`,"merges":["a b"]}`, ""))
	if got := toks(noUnk, noUnk.Encode("zabbz", false)); !reflect.DeepEqual(got, []string{"ab", "b"}) {
		t.Errorf("no unk token (unknown chars dropped): %q", got)
	}
	// "abb" is in the vocabulary but no merge builds it: only
	// ignore_merges reaches it.
	ign := mustParse(t, tinyJSON(`{"type":"BPE",`+vocab+`,"merges":["a b"],"ignore_merges":true}`, ""))
	if got := toks(ign, ign.Encode("abb", false)); !reflect.DeepEqual(got, []string{"abb"}) {
		t.Errorf("ignore_merges: %q", got)
	}
	if got := toks(noUnk, noUnk.Encode("abb", false)); !reflect.DeepEqual(got, []string{"ab", "b"}) {
		t.Errorf("without ignore_merges: %q", got)
	}
}

func TestByteFallback(t *testing.T) {
	tk := storiesTokenizer(t)
	// "ü" (C3 BC) and "中" (E4 B8 AD) are not in the 512-token vocabulary
	// ("é" and "€" are).
	ids := tk.Encode("ü中é", false)
	want := []string{"▁", "<0xC3>", "<0xBC>", "<0xE4>", "<0xB8>", "<0xAD>", "é"}
	if got := toks(tk, ids); !reflect.DeepEqual(got, want) {
		t.Fatalf("Encode(ü中é) = %q, want %q", got, want)
	}
	if got := tk.Decode(ids, false); got != "ü中é" {
		t.Errorf("Decode = %q", got)
	}
	// A run with one invalid byte: Hugging Face's ByteFallback replaces
	// every byte of the run with U+FFFD, the stream decoder agrees.
	c3, _ := tk.TokenID("<0xC3>")
	a9, _ := tk.TokenID("<0xA9>")
	x, _ := tk.TokenID("▁a")
	bad := []int{x, c3, a9, c3, x}
	if got, want := tk.Decode(bad, false), "a\uFFFD\uFFFD\uFFFD a"; got != want {
		t.Errorf("Decode(invalid run) = %+q, want %+q", got, want)
	}
	if got := streamAll(tk, bad, false); got != tk.Decode(bad, false) {
		t.Errorf("stream(invalid run) = %+q", got)
	}
}

// Chunks emitted by the stream decoder: a byte-fallback run is held until
// it ends; the Strip decoder's leading space is removed once.
func TestStreamChunks(t *testing.T) {
	tk := storiesTokenizer(t)
	ids := tk.Encode("Hi ü!", true)
	d := tk.NewStreamDecoder(true)
	var chunks []string
	for _, id := range ids {
		chunks = append(chunks, d.Next(id))
	}
	chunks = append(chunks, d.Flush())
	// <s> ▁H i ▁ <0xC3> <0xBC> ! | flush: the byte run is released with
	// the token that ends it.
	want := []string{"", "H", "i", " ", "", "", "ü!", ""}
	if got := toks(tk, ids); len(got) != 7 {
		t.Fatalf("tokens %q (the chunk expectation assumes 7)", got)
	}
	if !reflect.DeepEqual(chunks, want) {
		t.Errorf("chunks %q, want %q (tokens %q)", chunks, want, toks(tk, ids))
	}
	// Byte-level: a 4-byte emoji split over tokens appears only when complete.
	q := qwenTokenizer(t)
	ids = q.Encode("🤖!", false)
	d = q.NewStreamDecoder(false)
	var got []string
	for _, id := range ids {
		got = append(got, d.Next(id))
	}
	got = append(got, d.Flush())
	if strings.Join(got, "") != "🤖!" {
		t.Fatalf("stream %q", got)
	}
	for _, c := range got {
		if strings.ContainsRune(c, '\uFFFD') {
			t.Errorf("chunk %q holds a partial character", c)
		}
	}
	// The decoder is reusable after Flush.
	if s := streamAll(tk, tk.Encode("Once", true), true); s != "Once" {
		t.Errorf("second sequence: %q", s)
	}
}

func TestAddedTokenFlags(t *testing.T) {
	model := `{"type":"BPE","vocab":{"a":0,"b":1," ":2,"x":3},"merges":[]}`
	added := `"added_tokens":[
		{"id":10,"content":"<L>","lstrip":true,"normalized":false,"special":true},
		{"id":11,"content":"<R>","rstrip":true,"normalized":false,"special":true},
		{"id":12,"content":"<W>","single_word":true,"normalized":false,"special":false},
		{"id":13,"content":"<WW>","normalized":false,"special":false},
		{"id":14,"content":"<WW","normalized":false,"special":false}]`
	tk := mustParse(t, tinyJSON(model, added))
	cases := []struct {
		in   string
		want []string
	}{
		{"a  <L>b", []string{"a", "<L>", "b"}},           // lstrip swallows the spaces before
		{"a<R>  b", []string{"a", "<R>", "b"}},           // rstrip swallows the spaces after
		{"a <W> b", []string{"a", " ", "<W>", " ", "b"}}, // single_word: stands alone
		// single_word: touches "a", so no match; '<', 'W', '>' are not in
		// the vocabulary and there is no unk token, so they vanish.
		{"a<W>", []string{"a"}},
		{"<WW>", []string{"<WW>"}}, // longest of "<WW>" and "<WW"
		{"x<WWa", []string{"x", "<WW", "a"}},
	}
	for _, c := range cases {
		if got := toks(tk, tk.Encode(c.in, false)); !reflect.DeepEqual(got, c.want) {
			t.Errorf("Encode(%q) = %q, want %q", c.in, got, c.want)
		}
	}
	// No decoder: tokens joined by spaces; the special <L>, <R> skipped.
	ids := tk.Encode("a <L>b<R> x", false)
	if got := tk.Decode(ids, true); got != "a b x" {
		t.Errorf("Decode(skip) = %q", got)
	}
	if got := tk.Decode(ids, false); got != "a <L> b <R> x" {
		t.Errorf("Decode(keep) = %q", got)
	}
	if !tk.IsSpecial(10) || tk.IsSpecial(12) {
		t.Errorf("IsSpecial flags wrong")
	}
}

func TestMetaspaceAndNoDecoder(t *testing.T) {
	model := `{"type":"BPE","vocab":{"▁":0,"H":1,"e":2,"y":3,"f":4,"r":5,"i":6,"n":7,"d":8,"!":9,"▁Hey":10,"▁friend!":11,"He":12,"▁He":13,"Hey":14},
		"merges":["H e","▁ He","▁He y"]}`
	pre := `"pre_tokenizer":{"type":"Metaspace","replacement":"▁","prepend_scheme":"always","split":true}`
	dec := `"decoder":{"type":"Metaspace","replacement":"▁","prepend_scheme":"always","split":true}`
	tk := mustParse(t, tinyJSON(model, pre+","+dec))
	ids := tk.Encode("Hey friend!", false)
	// Metaspace splits in front of each ▁: "▁Hey" | "▁friend!".
	if got := toks(tk, ids); got[0] != "▁Hey" || strings.Join(got[1:], "") != "▁friend!" {
		t.Errorf("tokens %q", got)
	}
	// Hugging Face docs example: decoding ["▁Hey", "▁friend!"] -> "Hey friend!".
	if got := tk.Decode([]int{10, 11}, false); got != "Hey friend!" {
		t.Errorf("Decode = %q", got)
	}
	if got := streamAll(tk, []int{10, 11}, false); got != "Hey friend!" {
		t.Errorf("stream = %q", got)
	}
	nodec := mustParse(t, tinyJSON(model, pre))
	if got := nodec.Decode([]int{10, 11}, false); got != "▁Hey ▁friend!" {
		t.Errorf("no decoder: %q", got)
	}
	if got := streamAll(nodec, []int{10, 11}, false); got != "▁Hey ▁friend!" {
		t.Errorf("no decoder stream: %q", got)
	}
}

func TestRegexFeatures(t *testing.T) {
	// Llama-3's split pattern: digits in groups of at most three.
	llama3 := `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	f, err := regexSplitter(llama3)
	if err != nil {
		t.Fatal(err)
	}
	split := func(s string) []string {
		return pieceStrings(splitPiece(piece{s: s}, f, splitIsolated, false, nil))
	}
	cases := map[string][]string{
		"12345":            {"123", "45"},
		"Hello   world":    {"Hello", "  ", " world"},    // \s+(?!\S) leaves one space
		"I'M you'Ve":       {"I", "'M", " you", "'Ve"},   // (?i:...)
		"naïve Ünïcödé 中文": {"naïve", " Ünïcödé", " 中文"}, // \p{L}
		"a\n\n b":          {"a", "\n\n", " b"},
		"x!!\n":            {"x", "!!\n"},
	}
	for in, want := range cases {
		if got := split(in); !reflect.DeepEqual(got, want) {
			t.Errorf("split(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestEncodeInvalidUTF8(t *testing.T) {
	for _, tk := range []*Tokenizer{storiesTokenizer(t), qwenTokenizer(t)} {
		got := tk.Encode("a\xffb\xe2\x82", false)
		want := tk.Encode("a\uFFFDb\uFFFD", false)
		if !reflect.DeepEqual(got, want) {
			t.Errorf("invalid UTF-8: %v, want %v", got, want)
		}
	}
}

func TestParseErrors(t *testing.T) {
	cases := []struct {
		js   string
		kind error
		msg  string
	}{
		{`{"model":{"type":"WordPiece","vocab":{}}}`, ErrUnsupported,
			`tokenizer: tokenizer.json: model.type "WordPiece" unsupported (want BPE)`},
		{`{"model":`, ErrMalformed, `tokenizer: tokenizer.json: is not a JSON object`},
		{`[]`, ErrMalformed, `tokenizer: tokenizer.json: is not a JSON object`},
		{`{}`, ErrMalformed, `tokenizer: tokenizer.json: model missing`},
		{`{"model":{"type":"BPE","vocab":{"a":0},"merges":["a b"]}}`, ErrMalformed,
			`tokenizer: tokenizer.json: model.merges[0] token "b" not in model.vocab`},
		{`{"model":{"type":"BPE","vocab":{"a":0,"b":1},"merges":["a b"]}}`, ErrMalformed,
			`tokenizer: tokenizer.json: model.merges[0] merged token "ab" not in model.vocab`},
		{`{"model":{"type":"BPE","vocab":{"a":0},"merges":["a"]}}`, ErrMalformed,
			`tokenizer: tokenizer.json: model.merges[0] "a" is not two space-separated tokens`},
		{`{"model":{"type":"BPE","vocab":{"a":-1},"merges":[]}}`, ErrMalformed,
			`tokenizer: tokenizer.json: model.vocab["a"] id -1 out of range [0, 2097152)`},
		{`{"model":{"type":"BPE","vocab":{"a":0},"merges":[]},"normalizer":{"type":"Precompiled"}}`, ErrUnsupported,
			`tokenizer: tokenizer.json: normalizer.type "Precompiled" unsupported (want Sequence, Prepend, Append, Replace, NFC, NFD, NFKC, NFKD, Lowercase or Strip)`},
		{`{"model":{"type":"BPE","vocab":{"a":0},"merges":[]},"pre_tokenizer":{"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":"(a"},"behavior":"Isolated"}]}}`, ErrMalformed,
			`tokenizer: tokenizer.json: pre_tokenizer.pretokenizers[0].pattern.Regex "(a" does not compile`},
		{`{"model":{"type":"BPE","vocab":{"a":0},"merges":[],"unk_token":"<unk>"}}`, ErrMalformed,
			`tokenizer: tokenizer.json: model.unk_token "<unk>" is neither in model.vocab nor in added_tokens`},
		{`{"model":{"type":"BPE","vocab":{"a":0},"merges":[]},"post_processor":{"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"<s>","type_id":0}},{"Sequence":{"id":"A","type_id":0}}],"special_tokens":{}}}`, ErrMalformed,
			`tokenizer: tokenizer.json: post_processor.single[0].SpecialToken.id "<s>" not in post_processor.special_tokens`},
		{`{"model":{"type":"BPE","vocab":{"a":0},"merges":[]},"post_processor":{"type":"BertProcessing","cls":["[CLS]",7],"sep":["a",0]}}`, ErrMalformed,
			`tokenizer: tokenizer.json: post_processor adds id 7, which has no token in model.vocab or added_tokens`},
		{`{"model":{"type":"BPE","vocab":{"a":0},"merges":[],"dropout":0.1}}`, ErrUnsupported,
			`tokenizer: tokenizer.json: model.dropout 0.1 unsupported (BPE dropout is random; want null or 0)`},
		{`{"model":{"type":"BPE","vocab":{"a":0},"merges":[]},"added_tokens":[{"id":1}]}`, ErrMalformed,
			`tokenizer: tokenizer.json: added_tokens[0].content missing (want a string)`},
	}
	for _, c := range cases {
		_, err := Parse([]byte(c.js))
		if err == nil {
			t.Errorf("Parse(%s): no error", c.js)
			continue
		}
		if !errors.Is(err, c.kind) {
			t.Errorf("Parse(%s): %v does not wrap %v", c.js, err, c.kind)
		}
		if !strings.HasPrefix(err.Error(), c.msg) {
			t.Errorf("Parse(%s):\n got %q\nwant %q", c.js, err.Error(), c.msg)
		}
	}
}

func TestLoadPathsAndConfig(t *testing.T) {
	dir := t.TempDir()
	if _, err := Load(dir); !errors.Is(err, ErrNotFound) {
		t.Errorf("empty dir: %v", err)
	}
	if _, err := Load(filepath.Join(dir, "missing.json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
	js := tinyJSON(`{"type":"BPE","vocab":{"<s>":0,"</s>":1,"a":2},"merges":[]}`,
		`"added_tokens":[{"id":0,"content":"<s>","special":true,"normalized":false},{"id":1,"content":"</s>","special":true,"normalized":false}],
		"post_processor":{"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"<s>","type_id":0}},{"Sequence":{"id":"A","type_id":0}}],
		"special_tokens":{"<s>":{"id":"<s>","ids":[0],"tokens":["<s>"]}}}`)
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), []byte(js), 0o644); err != nil {
		t.Fatal(err)
	}
	tk, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if bos, ok := tk.BOS(); !ok || bos != 0 {
		t.Errorf("BOS from template = %d,%v", bos, ok)
	}
	if _, ok := tk.EOS(); ok {
		t.Errorf("EOS without config should be unknown")
	}
	if got := fmt.Sprint(tk.Encode("a", true)); got != "[0 2]" {
		t.Errorf("Encode with template = %s", got)
	}
	// A Llama-class config turns on add_eos_token: the post-processor is
	// rebuilt as BOS ... EOS.
	cfg := `{"tokenizer_class":"LlamaTokenizer","add_bos_token":true,"add_eos_token":true,"bos_token":{"content":"<s>"},"eos_token":"</s>"}`
	if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	if tk, err = Load(dir); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(tk.Encode("a", true)); got != "[0 2 1]" {
		t.Errorf("Encode with Llama config = %s", got)
	}
	if eos, ok := tk.EOS(); !ok || eos != 1 {
		t.Errorf("EOS = %d,%v", eos, ok)
	}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(`{"eos_token":"<nope>"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(dir); !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "tokenizer_config.json: eos_token") {
		t.Errorf("bad config: %v", err)
	}
}

func TestStoriesAccessors(t *testing.T) {
	tk := storiesTokenizer(t)
	if n := tk.VocabSize(); n != 512 {
		t.Errorf("VocabSize = %d, want 512", n)
	}
	if id, ok := tk.BOS(); !ok || id != 1 {
		t.Errorf("BOS = %d,%v want 1", id, ok)
	}
	if id, ok := tk.EOS(); !ok || id != 2 {
		t.Errorf("EOS = %d,%v want 2", id, ok)
	}
	if tk.Token(13) != "<0x0A>" || tk.Token(-1) != "" || tk.Token(512) != "" {
		t.Errorf("Token: %q %q %q", tk.Token(13), tk.Token(-1), tk.Token(512))
	}
	// Round-trip exceptions (documented in doc.go): literal added-token
	// text becomes the token, U+2581 decodes as a space.
	if got := tk.Decode(tk.Encode("a<s>b", false), false); got != "a<s> b" {
		t.Errorf("literal <s>: %q", got)
	}
	if got := tk.Decode(tk.Encode("a▁b", false), false); got != "a b" {
		t.Errorf("literal ▁: %q", got)
	}
}

// Stream and batch decoding agree on handmade decoder chains that the two
// shipped tokenizers do not exercise (Replace and Strip after Fuse, Strip
// with stop, Metaspace after Fuse, non-streamable chains).
func TestStreamDecoderChains(t *testing.T) {
	vocab := `{"a":0,"b":1," ":2,"▁":3,"<0x41>":4,"<0xC3>":5,"<0xA9>":6,"ab":7,"▁▁":8,"xa":9,"bx":10,"  ":11}`
	chains := map[string]string{
		"fused replace":           `{"type":"Sequence","decoders":[{"type":"Fuse"},{"type":"Replace","pattern":{"String":"ab"},"content":"X"}]}`,
		"fused replace overlap":   `{"type":"Sequence","decoders":[{"type":"Fuse"},{"type":"Replace","pattern":{"String":"aba"},"content":"-"}]}`,
		"strip both ends":         `{"type":"Sequence","decoders":[{"type":"ByteFallback"},{"type":"Fuse"},{"type":"Strip","content":" ","start":2,"stop":2}]}`,
		"strip per token":         `{"type":"Sequence","decoders":[{"type":"Strip","content":"a","start":1,"stop":1},{"type":"Fuse"}]}`,
		"fused metaspace":         `{"type":"Sequence","decoders":[{"type":"Fuse"},{"type":"Metaspace","replacement":"▁","prepend_scheme":"first"}]}`,
		"regex after fuse":        `{"type":"Sequence","decoders":[{"type":"Fuse"},{"type":"Replace","pattern":{"Regex":"a+b"},"content":"Y"}]}`,
		"bytefallback after fuse": `{"type":"Sequence","decoders":[{"type":"Fuse"},{"type":"ByteFallback"}]}`,
		"bytelevel":               `{"type":"Sequence","decoders":[{"type":"Replace","pattern":{"String":"▁"},"content":"Ã"},{"type":"ByteLevel"},{"type":"Strip","content":" ","start":1,"stop":0}]}`,
	}
	rng := rand.New(rand.NewSource(3))
	for name, dec := range chains {
		tk := mustParse(t, tinyJSON(`{"type":"BPE","vocab":`+vocab+`,"merges":[]}`,
			`"added_tokens":[{"id":12,"content":"<s>","special":true,"normalized":false}],"decoder":`+dec))
		for trial := 0; trial < 400; trial++ {
			ids := make([]int, rng.Intn(12))
			for i := range ids {
				ids[i] = rng.Intn(14) - 1
			}
			for _, skip := range []bool{false, true} {
				if a, b := tk.Decode(ids, skip), streamAll(tk, ids, skip); a != b {
					t.Fatalf("%s: ids %v skip=%v: Decode %q, stream %q", name, ids, skip, a, b)
				}
			}
		}
	}
	// A concrete check of the fused Strip: "   a    " loses two spaces at
	// each end.
	tk := mustParse(t, tinyJSON(`{"type":"BPE","vocab":`+vocab+`,"merges":[]}`, `"decoder":`+chains["strip both ends"]))
	if got := tk.Decode([]int{11, 2, 0, 2, 11, 2}, false); got != " a  " {
		t.Errorf("strip both ends: %q, want %q", got, " a  ")
	}
}

// Concurrent Encode calls share the word cache; results must not change.
func TestConcurrentEncode(t *testing.T) {
	tk := storiesTokenizer(t)
	lines := tinyStoriesLines(t)[:600]
	want := make([][]int, len(lines))
	for i, l := range lines {
		want[i] = tk.Encode(l, true)
	}
	tk.model.clearCache()
	errs := make(chan error, 4)
	for g := 0; g < 4; g++ {
		go func(g int) {
			for k := range lines {
				i := (k*7 + g*131) % len(lines)
				if got := tk.Encode(lines[i], true); !reflect.DeepEqual(got, want[i]) {
					errs <- fmt.Errorf("goroutine %d line %d: %v, want %v", g, i, got, want[i])
					return
				}
			}
			errs <- nil
		}(g)
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}
