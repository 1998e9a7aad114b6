package export

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"slices"
	"strings"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/gguf"
)

// llama.cpp's token types (llama_token_type, gguf-py TokenType).
const (
	tokNormal      int32 = 1
	tokUnknown     int32 = 2
	tokControl     int32 = 3
	tokUserDefined int32 = 4
	tokUnused      int32 = 5
	tokByte        int32 = 6
)

// Pre-tokenizer regexes of the byte-level BPE tokenizers whose llama.cpp
// pre-tokenizer name (tokenizer.ggml.pre) export recognises: Qwen2/Qwen3
// ("qwen2": single digits) and Llama 3 ("llama-bpe": digits in runs of up
// to three).
const (
	qwen2Pattern  = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	llama3Pattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

var byteToken = regexp.MustCompile(`^<0x[0-9A-Fa-f]{2}>$`)

type tjAdded struct {
	ID      int    `json:"id"`
	Content string `json:"content"`
	Special bool   `json:"special"`
}

type tjModel struct {
	Type         string          `json:"type"`
	Vocab        json.RawMessage `json:"vocab"`
	Merges       json.RawMessage `json:"merges"`
	UnkToken     *string         `json:"unk_token"`
	UnkID        *int            `json:"unk_id"`
	ByteFallback bool            `json:"byte_fallback"`
}

type tokenizerJSON struct {
	Model         tjModel         `json:"model"`
	AddedTokens   []tjAdded       `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	Decoder       json.RawMessage `json:"decoder"`
	PostProcessor json.RawMessage `json:"post_processor"`
}

// tokenizerKVs converts tokenizer.json (and tokenizer_config.json when
// present) of src into llama.cpp's tokenizer metadata for a vocabulary of
// vocab rows (the embedding's), returning warnings for what it had to
// guess. SentencePiece-style tokenizers (BPE with byte fallback and a
// "▁" normalizer or Metaspace pre-tokenizer, or Unigram) become
// tokenizer.ggml.model "llama" with scores and token types; byte-level
// BPE becomes "gpt2" with merges and the pre-tokenizer name.
func tokenizerKVs(src *source, vocab int) ([]gguf.KV, []string, error) {
	raw, err := src.file("tokenizer.json")
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil, fmt.Errorf("export: %s has no tokenizer.json; GGUF carries the tokenizer (llama.cpp cannot run without one)", src.path)
		}
		return nil, nil, err
	}
	var cfg map[string]json.RawMessage
	if b, err := src.file("tokenizer_config.json"); err == nil {
		if err := json.Unmarshal(b, &cfg); err != nil {
			return nil, nil, fmt.Errorf("export: %s: tokenizer_config.json: %w", src.path, err)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, nil, err
	}
	return convertTokenizer(raw, cfg, src.desc, vocab)
}

func convertTokenizer(raw []byte, cfg map[string]json.RawMessage, d *arch.Description, vocab int) ([]gguf.KV, []string, error) {
	var tj tokenizerJSON
	if err := json.Unmarshal(raw, &tj); err != nil {
		return nil, nil, fmt.Errorf("export: tokenizer.json: %w", err)
	}
	var warn []string
	// id → token, and its score for Unigram.
	var toks []string
	var uniScores []float32
	var present []bool
	ids := map[string]int{}
	switch tj.Model.Type {
	case "BPE":
		var m map[string]int
		if err := json.Unmarshal(tj.Model.Vocab, &m); err != nil {
			return nil, nil, fmt.Errorf("export: tokenizer.json: model.vocab: %w", err)
		}
		n := 0
		for _, id := range m {
			n = max(n, id+1)
		}
		for _, a := range tj.AddedTokens {
			n = max(n, a.ID+1)
		}
		toks = make([]string, n)
		present = make([]bool, n)
		for s, id := range m {
			if id < 0 {
				return nil, nil, fmt.Errorf("export: tokenizer.json: model.vocab: token %q has id %d", s, id)
			}
			toks[id] = s
			present[id] = true
			ids[s] = id
		}
	case "Unigram":
		var v [][2]json.RawMessage
		if err := json.Unmarshal(tj.Model.Vocab, &v); err != nil {
			return nil, nil, fmt.Errorf("export: tokenizer.json: model.vocab (Unigram, want [piece, score] pairs): %w", err)
		}
		toks = make([]string, len(v))
		present = make([]bool, len(v))
		uniScores = make([]float32, len(v))
		for i, p := range v {
			var s string
			var sc float64
			if json.Unmarshal(p[0], &s) != nil || json.Unmarshal(p[1], &sc) != nil {
				return nil, nil, fmt.Errorf("export: tokenizer.json: model.vocab[%d]: want [piece, score]", i)
			}
			toks[i], uniScores[i], present[i] = s, float32(sc), true
			ids[s] = i
		}
	default:
		return nil, nil, fmt.Errorf("export: tokenizer.json: model.type %q: GGUF export handles BPE (SentencePiece-style or byte-level) and Unigram", tj.Model.Type)
	}
	added := map[int]tjAdded{}
	for _, a := range tj.AddedTokens {
		if a.ID < 0 {
			return nil, nil, fmt.Errorf("export: tokenizer.json: added token %q has id %d", a.Content, a.ID)
		}
		if a.ID >= len(toks) {
			toks = append(toks, make([]string, a.ID+1-len(toks))...)
			present = append(present, make([]bool, a.ID+1-len(present))...)
		}
		toks[a.ID], present[a.ID] = a.Content, true
		ids[a.Content] = a.ID
		added[a.ID] = a
	}
	if len(toks) > vocab {
		return nil, nil, fmt.Errorf("export: tokenizer.json has %d tokens, the embedding only %d rows (vocab_size): llama.cpp needs one row per token", len(toks), vocab)
	}
	byteLevel := hasType(tj.PreTokenizer, "ByteLevel") || hasType(tj.Decoder, "ByteLevel")
	spm := tj.Model.Type == "Unigram" || !byteLevel && (tj.Model.ByteFallback || hasType(tj.PreTokenizer, "Metaspace") || strings.Contains(string(tj.Normalizer), `"\u2581"`) || strings.Contains(string(tj.Normalizer), "▁"))
	if !spm && !byteLevel {
		return nil, nil, fmt.Errorf("export: tokenizer.json: a BPE tokenizer that is neither SentencePiece-style (byte_fallback, ▁ for spaces) nor byte-level (ByteLevel pre-tokenizer): llama.cpp has no tokenizer model for it")
	}
	unk := -1
	if tj.Model.UnkToken != nil {
		if id, ok := ids[*tj.Model.UnkToken]; ok {
			unk = id
		}
	}
	if tj.Model.UnkID != nil {
		unk = *tj.Model.UnkID
	}
	tokens := make([]string, vocab)
	types := make([]int32, vocab)
	pads := 0
	for i := range tokens {
		if i >= len(toks) || !present[i] {
			tokens[i], types[i] = fmt.Sprintf("[PAD%d]", i), tokUnused
			pads++
			continue
		}
		tokens[i] = toks[i]
		a, isAdded := added[i]
		switch {
		case i == unk:
			types[i] = tokUnknown
		case isAdded && a.Special:
			types[i] = tokControl
		case isAdded:
			types[i] = tokUserDefined
			if spm {
				tokens[i] = strings.ReplaceAll(tokens[i], "▁", " ")
			}
		case spm && tj.Model.ByteFallback && byteToken.MatchString(toks[i]):
			types[i] = tokByte
		default:
			types[i] = tokNormal
		}
	}
	if pads > 0 {
		warn = append(warn, fmt.Sprintf("tokenizer: %d of %d vocabulary rows have no token; written as [PADn] of type UNUSED (as convert_hf_to_gguf does)", pads, vocab))
	}
	var kvs []gguf.KV
	add := func(k string, v any) { kvs = append(kvs, gguf.KV{Key: k, Value: v}) }
	if spm {
		// SentencePiece BPE scores are the negated merge order, which in a
		// converted tokenizer.json is the id order of the normal pieces:
		// score −k for the k-th normal token, 0 for the others (as in the
		// SentencePiece model proto).
		scores := make([]float32, vocab)
		k := 0
		for i := range scores {
			switch {
			case uniScores != nil && i < len(uniScores):
				scores[i] = uniScores[i]
			case uniScores == nil && types[i] == tokNormal:
				scores[i] = -float32(k)
				k++
			}
		}
		add("tokenizer.ggml.model", "llama")
		add("tokenizer.ggml.pre", "default")
		add("tokenizer.ggml.tokens", tokens)
		add("tokenizer.ggml.scores", scores)
		add("tokenizer.ggml.token_type", types)
		add("tokenizer.ggml.add_space_prefix", strings.Contains(string(tj.Normalizer), "Prepend") || metaspacePrefix(tj.PreTokenizer))
	} else {
		merges, err := parseMerges(tj.Model.Merges)
		if err != nil {
			return nil, nil, err
		}
		pre, w := preName(tj.PreTokenizer, d)
		if w != "" {
			warn = append(warn, w)
		}
		add("tokenizer.ggml.model", "gpt2")
		add("tokenizer.ggml.pre", pre)
		add("tokenizer.ggml.tokens", tokens)
		add("tokenizer.ggml.token_type", types)
		add("tokenizer.ggml.merges", merges)
	}
	// Special ids: tokenizer_config.json's tokens, else config.json's.
	special := func(key string) (int, bool) {
		s, ok := configToken(cfg, key)
		if !ok {
			return 0, false
		}
		id, ok := ids[s]
		return id, ok
	}
	bos, hasBOS := special("bos_token")
	if !hasBOS && d.BOSTokenID >= 0 {
		bos, hasBOS = d.BOSTokenID, true
	}
	eos, hasEOS := special("eos_token")
	if !hasEOS && len(d.EOSTokenIDs) > 0 {
		eos, hasEOS = d.EOSTokenIDs[0], true
	}
	if hasBOS {
		add("tokenizer.ggml.bos_token_id", uint32(bos))
	}
	if hasEOS {
		add("tokenizer.ggml.eos_token_id", uint32(eos))
	}
	if unk >= 0 {
		add("tokenizer.ggml.unknown_token_id", uint32(unk))
	}
	if pad, ok := special("pad_token"); ok {
		add("tokenizer.ggml.padding_token_id", uint32(pad))
	}
	addBOS, ok := configBool(cfg, "add_bos_token")
	if !ok {
		addBOS = hasBOS && postPrepends(tj.PostProcessor, tokens, bos)
	}
	addEOS, _ := configBool(cfg, "add_eos_token")
	add("tokenizer.ggml.add_bos_token", addBOS)
	add("tokenizer.ggml.add_eos_token", addEOS)
	if t, ok := chatTemplate(cfg); ok {
		add("tokenizer.chat_template", t)
	}
	return kvs, warn, nil
}

// hasType reports whether the JSON component raw (a normalizer,
// pre-tokenizer or decoder, possibly a Sequence) has a part of type t.
func hasType(raw json.RawMessage, t string) bool {
	return strings.Contains(string(raw), `"type":"`+t+`"`) || strings.Contains(string(raw), `"type": "`+t+`"`)
}

func metaspacePrefix(raw json.RawMessage) bool {
	if !hasType(raw, "Metaspace") {
		return false
	}
	s := string(raw)
	return !strings.Contains(s, `"prepend_scheme":"never"`) && !strings.Contains(s, `"prepend_scheme": "never"`) &&
		!strings.Contains(s, `"add_prefix_space":false`) && !strings.Contains(s, `"add_prefix_space": false`)
}

// preName picks llama.cpp's pre-tokenizer name from the Split regex of
// the byte-level pre-tokenizer, else from the architecture; the warning is
// non-empty when it had to guess.
func preName(raw json.RawMessage, d *arch.Description) (string, string) {
	var v any
	_ = json.Unmarshal(raw, &v)
	var pats []string
	var walk func(x any)
	walk = func(x any) {
		switch y := x.(type) {
		case map[string]any:
			if p, ok := y["pattern"].(map[string]any); ok {
				if r, ok := p["Regex"].(string); ok {
					pats = append(pats, r)
				}
			}
			for _, z := range y {
				walk(z)
			}
		case []any:
			for _, z := range y {
				walk(z)
			}
		}
	}
	walk(v)
	for _, p := range pats {
		switch p {
		case qwen2Pattern:
			return "qwen2", ""
		case llama3Pattern:
			return "llama-bpe", ""
		}
	}
	if len(pats) == 0 && hasType(raw, "ByteLevel") {
		return "gpt2", ""
	}
	if strings.HasPrefix(d.ModelType, "qwen") {
		return "qwen2", "tokenizer: pre-tokenizer regex not recognised; tokenizer.ggml.pre \"qwen2\" chosen from the architecture"
	}
	return "default", "tokenizer: pre-tokenizer regex not recognised; tokenizer.ggml.pre \"default\" (llama.cpp may split text differently from the Hugging Face tokenizer)"
}

func parseMerges(raw json.RawMessage) ([]string, error) {
	var any []json.RawMessage
	if err := json.Unmarshal(raw, &any); err != nil {
		return nil, fmt.Errorf("export: tokenizer.json: model.merges: %w", err)
	}
	out := make([]string, len(any))
	for i, m := range any {
		var s string
		if json.Unmarshal(m, &s) == nil {
			out[i] = s
			continue
		}
		var p []string
		if json.Unmarshal(m, &p) != nil || len(p) != 2 {
			return nil, fmt.Errorf("export: tokenizer.json: model.merges[%d]: want \"a b\" or [a, b]", i)
		}
		out[i] = p[0] + " " + p[1]
	}
	return out, nil
}

// configToken returns tokenizer_config.json's key as a token string (a
// string or an {"content": ...} object).
func configToken(cfg map[string]json.RawMessage, key string) (string, bool) {
	raw, ok := cfg[key]
	if !ok {
		return "", false
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, true
	}
	var o struct {
		Content *string `json:"content"`
	}
	if json.Unmarshal(raw, &o) == nil && o.Content != nil {
		return *o.Content, true
	}
	return "", false
}

func configBool(cfg map[string]json.RawMessage, key string) (bool, bool) {
	var b bool
	if raw, ok := cfg[key]; ok && json.Unmarshal(raw, &b) == nil {
		return b, true
	}
	return false, false
}

// chatTemplate returns tokenizer_config.json's chat_template (a string, or
// the "default" entry of a list of named templates).
func chatTemplate(cfg map[string]json.RawMessage) (string, bool) {
	raw, ok := cfg["chat_template"]
	if !ok {
		return "", false
	}
	var s string
	if json.Unmarshal(raw, &s) == nil && s != "" {
		return s, true
	}
	var list []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if json.Unmarshal(raw, &list) == nil {
		i := slices.IndexFunc(list, func(x struct {
			Name     string `json:"name"`
			Template string `json:"template"`
		}) bool {
			return x.Name == "default"
		})
		if i >= 0 {
			return list[i].Template, true
		}
	}
	return "", false
}

// postPrepends reports whether the TemplateProcessing post-processor puts
// the bos token first.
func postPrepends(raw json.RawMessage, tokens []string, bos int) bool {
	var p struct {
		Type   string `json:"type"`
		Single []struct {
			SpecialToken *struct {
				ID string `json:"id"`
			} `json:"SpecialToken"`
		} `json:"single"`
	}
	if json.Unmarshal(raw, &p) != nil || p.Type != "TemplateProcessing" || len(p.Single) == 0 || p.Single[0].SpecialToken == nil {
		return false
	}
	return bos < len(tokens) && p.Single[0].SpecialToken.ID == tokens[bos]
}
