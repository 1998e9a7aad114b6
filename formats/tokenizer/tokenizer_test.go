package tokenizer

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestStoriesOnceUponATime(t *testing.T) {
	tk := storiesTokenizer(t)
	// Reference from stories260K-hf/SOURCE.md (llama2.c run.c encode).
	want := []int{1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426}
	got := tk.Encode("Once upon a time, there was a little girl named Lily.", true)
	if d := firstDiff(got, want); d >= 0 {
		t.Fatalf("ids differ at %d:\n got %v\nwant %v", d, got, want)
	}
}

func TestStoriesTinyStoriesWholeFile(t *testing.T) {
	tk := storiesTokenizer(t)
	text := string(readShared(t, "tinystories-valid", "tinystories_val.txt"))
	want := readU16(t, "stories260K-hf", "reference", "tinystories_val.tok512.u16")
	if len(want) != 393019 {
		t.Fatalf("reference has %d ids, SOURCE.md says 393,019", len(want))
	}
	got := tk.Encode(text, true)
	if d := firstDiff(got, want); d >= 0 {
		lo, hi := max(0, d-5), min(d+5, min(len(got), len(want)))
		t.Fatalf("%d ids (want %d); first difference at %d: got %v want %v", len(got), len(want), d, got[lo:hi], want[lo:hi])
	}
	if back := tk.Decode(got, true); back != text {
		t.Fatalf("Decode(Encode(text)) differs from text (len %d vs %d)", len(back), len(text))
	}
	if s := streamAll(tk, got, true); s != text {
		t.Fatalf("stream decode differs from text (len %d vs %d)", len(s), len(text))
	}
}

func TestStoriesGreedyText(t *testing.T) {
	tk := storiesTokenizer(t)
	var ref struct {
		PromptIDs    []int  `json:"prompt_ids"`
		GeneratedIDs []int  `json:"generated_ids"`
		Text         string `json:"text"`
	}
	readJSON(t, &ref, "stories260K-hf", "reference", "greedy_from_bos.json")
	if len(ref.GeneratedIDs) != 256 || len(ref.PromptIDs) != 1 || ref.Text == "" {
		t.Fatalf("unexpected reference layout: %d prompt ids, %d generated, text %d bytes", len(ref.PromptIDs), len(ref.GeneratedIDs), len(ref.Text))
	}
	all := append(append([]int{}, ref.PromptIDs...), ref.GeneratedIDs...)
	if got := tk.Decode(all, true); got != ref.Text {
		t.Errorf("Decode(prompt+generated, skip) =\n%q\nwant\n%q", got, ref.Text)
	}
	if got := tk.Decode(ref.GeneratedIDs, false); got != ref.Text {
		t.Errorf("Decode(generated) =\n%q\nwant\n%q", got, ref.Text)
	}
	// Without skipping, the BOS token text is kept and the Strip decoder
	// has no leading space to remove: "<s> Once ...".
	if got, want := tk.Decode(all, false), "<s> "+ref.Text; got != want {
		t.Errorf("Decode(prompt+generated, keep) = %q..., want %q...", got[:20], want[:20])
	}
	for _, skip := range []bool{false, true} {
		if got, want := streamAll(tk, all, skip), tk.Decode(all, skip); got != want {
			t.Errorf("skip=%v: stream %q != Decode %q", skip, got, want)
		}
	}
}

func TestQwen3ReferenceEncodings(t *testing.T) {
	tk := qwenTokenizer(t)
	var ref struct {
		Generator string `json:"generator"`
		Cases     []struct {
			Text      string `json:"text"`
			IDs       []int  `json:"ids"`
			Roundtrip bool   `json:"roundtrip"`
		} `json:"cases"`
	}
	readJSON(t, &ref, "qwen3-tokenizer", "reference_encodings.tokenizers-js.json")
	if len(ref.Cases) != 10 {
		t.Fatalf("reference has %d cases, SOURCE.md says 10", len(ref.Cases))
	}
	for _, c := range ref.Cases {
		got := tk.Encode(c.Text, true)
		if d := firstDiff(got, c.IDs); d >= 0 {
			t.Errorf("Encode(%q) = %v, want %v (first difference at %d)", c.Text, got, c.IDs, d)
		}
		if back := tk.Decode(got, false); back != c.Text {
			t.Errorf("Decode(Encode(%q)) = %q", c.Text, back)
		}
		if s := streamAll(tk, got, false); s != c.Text {
			t.Errorf("stream(Encode(%q)) = %q", c.Text, s)
		}
	}
}

func TestQwen3Specials(t *testing.T) {
	tk := qwenTokenizer(t)
	if n := tk.VocabSize(); n != 151669 {
		t.Errorf("VocabSize = %d, want 151669 (151,643 vocab + 26 added)", n)
	}
	if id, ok := tk.BOS(); ok {
		t.Errorf("BOS = %d, want none (tokenizer_config bos_token null)", id)
	}
	if id, ok := tk.EOS(); !ok || id != 151645 {
		t.Errorf("EOS = %d,%v, want 151645 <|im_end|>", id, ok)
	}
	ids := tk.Encode("<|im_start|>user\nHi<|im_end|>", false)
	if got := tk.Decode(ids, true); got != "user\nHi" {
		t.Errorf("Decode(skip special) = %q", got)
	}
	if id, ok := tk.TokenID("<think>"); !ok || id != 151667 || tk.Token(id) != "<think>" {
		t.Errorf("TokenID(<think>) = %d,%v", id, ok)
	}
}

// TestParseConfigMatchesLoad: ParseConfig of stories260K's tokenizer.json
// and tokenizer_config.json encodes as Load of the directory (BOS added,
// from add_bos_token); with add_bos_token false in the config it adds no
// BOS; a config that is not a JSON object is refused naming the file.
func TestParseConfigMatchesLoad(t *testing.T) {
	tj := readShared(t, "stories260K-hf", "tokenizer.json")
	cfg := readShared(t, "stories260K-hf", "tokenizer_config.json")
	want := storiesTokenizer(t).Encode("Once upon a time", true)
	got, err := ParseConfig(tj, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if ids := got.Encode("Once upon a time", true); !slices.Equal(ids, want) || len(ids) == 0 || ids[0] != 1 {
		t.Errorf("ParseConfig encodes %v, Load %v (want BOS 1 first)", ids, want)
	}
	noBOS, err := ParseConfig(tj, []byte(`{"tokenizer_class": "LlamaTokenizer", "add_bos_token": false}`))
	if err != nil {
		t.Fatal(err)
	}
	if ids := noBOS.Encode("Once upon a time", true); !slices.Equal(ids, want[1:]) {
		t.Errorf("add_bos_token false: %v, want %v", ids, want[1:])
	}
	if _, err := ParseConfig(tj, []byte("{bad")); err == nil || !strings.Contains(err.Error(), "tokenizer_config.json") || !errors.Is(err, ErrMalformed) {
		t.Errorf("config {bad: %v, want ErrMalformed naming tokenizer_config.json", err)
	}
}
