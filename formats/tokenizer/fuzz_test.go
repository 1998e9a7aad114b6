package tokenizer

import (
	"strings"
	"testing"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// checkTokenizer exercises a parsed tokenizer on a few strings: ids must be
// in range and the stream decoder must agree with Decode.
func checkTokenizer(t *testing.T, tk *Tokenizer, texts ...string) {
	for _, s := range texts {
		ids := tk.Encode(s, true)
		for _, id := range ids {
			if id < 0 || id >= tk.VocabSize() {
				t.Fatalf("Encode(%q): id %d outside [0, %d)", s, id, tk.VocabSize())
			}
		}
		for _, skip := range []bool{false, true} {
			if a, b := tk.Decode(ids, skip), streamAll(tk, ids, skip); a != b {
				t.Fatalf("Encode(%q) = %v: Decode %q != stream %q", s, ids, a, b)
			}
		}
	}
}

// FuzzParse: Parse never panics on any input; whatever it accepts can
// encode and decode.
func FuzzParse(f *testing.F) {
	f.Add(readShared(f, "stories260K-hf", "tokenizer.json"))
	seeds := []string{
		tinyJSON(`{"type":"BPE","vocab":{"a":0,"b":1,"c":2,"ab":3,"bc":4,"abc":5},"merges":["b c","a b","a bc"]}`, ""),
		tinyJSON(`{"type":"BPE","vocab":{"a":0,"b":1,"ab":2},"merges":[["a","b"]],"ignore_merges":true}`,
			`"pre_tokenizer":{"type":"ByteLevel","add_prefix_space":true,"use_regex":true},"decoder":{"type":"ByteLevel"}`),
		tinyJSON(`{"type":"BPE","vocab":{"<unk>":0,"▁":1,"a":2},"merges":[],"unk_token":"<unk>","fuse_unk":true,"byte_fallback":true}`,
			`"normalizer":{"type":"Sequence","normalizers":[{"type":"NFKC"},{"type":"Replace","pattern":{"Regex":"\\s+"},"content":" "}]},
			"pre_tokenizer":{"type":"Metaspace","replacement":"▁","prepend_scheme":"first","split":false},
			"decoder":{"type":"Sequence","decoders":[{"type":"Replace","pattern":{"String":"▁"},"content":" "},{"type":"ByteFallback"},{"type":"Fuse"},{"type":"Strip","content":" ","start":1,"stop":1}]}`),
		tinyJSON(`{"type":"BPE","vocab":{"a":0,"1":1},"merges":[]}`,
			`"added_tokens":[{"id":5,"content":"<x>","lstrip":true,"rstrip":true,"single_word":true,"normalized":true,"special":true}],
			"pre_tokenizer":{"type":"Sequence","pretokenizers":[{"type":"Digits","individual_digits":true},{"type":"Split","pattern":{"String":"a"},"behavior":"MergedWithNext","invert":true}]},
			"post_processor":{"type":"RobertaProcessing","cls":["<x>",5],"sep":["<x>",5]}`),
		`{"model":{"type":"WordPiece"}}`,
		`{"model":{"vocab":{},"merges":[]},"decoder":{"type":"Fuse"}}`,
		`{"model":null}`,
		``,
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		tk, err := Parse(data)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "tokenizer: ") {
				t.Fatalf("error without package prefix: %v", err)
			}
			return
		}
		checkTokenizer(t, tk, "", "Hello wörld 123 ab", " <s>a\n\t▁é\xff")
	})
}

// FuzzEncode: Encode and Decode never panic, the stream decoder agrees with
// Decode, and the round trip holds where it should: for stories260K on
// valid UTF-8 without U+2581 and without the literal added-token texts; for
// Qwen3 on valid UTF-8 that is already in NFC.
func FuzzEncode(f *testing.F) {
	stories := storiesTokenizer(f)
	qwen := qwenTokenizer(f)
	for _, s := range []string{
		"", "Once upon a time, there was a little girl named Lily.",
		" leading space and  double  spaces\n\nnew paragraph\ttab",
		"Unicode: café naïve — “quotes” ü ß 中文字符 日本語 한국어 🤖🚀",
		"<|im_start|>user\nHi<|im_end|>\n", "a<s>b</s>", "\xff\xfe\xe2\x82", "e\u0301", "12345 3.14 'S 'll",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		checkTokenizer(t, stories, s)
		checkTokenizer(t, qwen, s)
		if !utf8.ValidString(s) {
			return
		}
		if !strings.ContainsRune(s, '▁') && !strings.Contains(s, "<s>") && !strings.Contains(s, "</s>") && !strings.Contains(s, "<unk>") {
			if got := stories.Decode(stories.Encode(s, true), true); got != s {
				t.Errorf("stories260K round trip: %q -> %q", s, got)
			}
		}
		if norm.NFC.IsNormalString(s) {
			if got := qwen.Decode(qwen.Encode(s, true), false); got != s {
				t.Errorf("qwen3 round trip: %q -> %q", s, got)
			}
		}
	})
}

// FuzzStreamDecode: arbitrary id sequences (two bytes per id, some out of
// range) decode identically through Decode and the stream decoder.
func FuzzStreamDecode(f *testing.F) {
	stories := storiesTokenizer(f)
	qwen := qwenTokenizer(f)
	f.Add([]byte{0, 1, 1, 147, 0, 200, 0, 13, 0, 203})
	f.Add([]byte{0xff, 0xff, 0x01, 0x02, 0x50, 0x50})
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, tk := range []*Tokenizer{stories, qwen} {
			n := tk.VocabSize()
			ids := make([]int, 0, len(data)/2)
			for i := 0; i+1 < len(data); i += 2 {
				v := int(data[i])<<8 | int(data[i+1])
				if tk == qwen {
					v = v*3 + int(data[i]&1)*(n-300) // reach the added tokens too
				}
				ids = append(ids, v%(n+4)-2)
			}
			for _, skip := range []bool{false, true} {
				if a, b := tk.Decode(ids, skip), streamAll(tk, ids, skip); a != b {
					t.Fatalf("ids %v skip=%v: Decode %q != stream %q", ids, skip, a, b)
				}
			}
		}
	})
}
