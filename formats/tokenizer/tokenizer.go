package tokenizer

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"github.com/lmpack/lmpack/internal/fsx"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// Sentinel errors; every error of this package wraps one of them (or an
// *os.PathError / *fs.PathError from reading files).
var (
	// ErrMalformed: the file is not valid JSON or a field has the wrong
	// type, a missing required value or an inconsistent value (e.g. a merge
	// naming a token that is not in the vocabulary).
	ErrMalformed = errors.New("malformed tokenizer file")
	// ErrUnsupported: a well-formed component this package does not
	// implement (e.g. model.type "WordPiece", normalizer "Precompiled").
	ErrUnsupported = errors.New("unsupported tokenizer component")
	// ErrNotFound: Load was given a directory without tokenizer.json or
	// tokenizer.json.gz.
	ErrNotFound = errors.New("tokenizer file not found")
)

// fieldError is an error about one field of one file.
type fieldError struct {
	file  string
	field string // e.g. `model.merges[12]`; "" for the whole file
	msg   string
	kind  error // ErrMalformed or ErrUnsupported
	cause error // underlying error (JSON, regex, gzip), may be nil
}

func (e *fieldError) Error() string {
	s := "tokenizer: " + e.file + ": "
	if e.field != "" {
		s += e.field + " "
	}
	s += e.msg
	if e.cause != nil {
		s += ": " + e.cause.Error()
	}
	return s
}

func (e *fieldError) Unwrap() []error {
	if e.cause != nil {
		return []error{e.kind, e.cause}
	}
	return []error{e.kind}
}

// Tokenizer is a loaded Hugging Face tokenizer.json with a BPE model. It
// is safe for concurrent use (the per-word cache is mutex-protected).
type Tokenizer struct {
	model      *bpeModel
	normalizer normalizer   // nil: none
	pre        preTokenizer // nil: none
	addedRaw   *addedMatcher
	addedNorm  *addedMatcher
	special    map[int]bool
	addedIDs   map[string]int // added token content -> id
	idToTok    []string       // "" for ids without a token
	prefix     []int          // added in front by the post-processor
	suffix     []int          // added at the end by the post-processor
	decoder    []decStep
	hasDecoder bool
	streamOK   bool
	bos, eos   int // -1 when unknown
}

// Load reads a tokenizer from path: a tokenizer.json file, a gzip-compressed
// tokenizer.json.gz, or a directory holding one of them (tokenizer.json is
// preferred). A tokenizer_config.json in the same directory, when present,
// supplies bos_token / eos_token (for BOS and EOS) and, for the Llama and
// Gemma tokenizer classes, add_bos_token / add_eos_token, which those
// classes use to rebuild the post-processor in Hugging Face transformers
// (defaults true / false); for every other class the post_processor of
// tokenizer.json alone decides what Encode adds.
//
// Errors: file-system errors (wrapped, naming the path), ErrNotFound for a
// directory without a tokenizer file, and the errors of Parse (naming the
// file).
func Load(path string) (*Tokenizer, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	if st.IsDir() {
		found := ""
		for _, name := range []string{"tokenizer.json", "tokenizer.json.gz"} {
			p := filepath.Join(path, name)
			if _, err := os.Stat(p); err == nil {
				found = p
				break
			}
		}
		if found == "" {
			return nil, fmt.Errorf("tokenizer: %s: no tokenizer.json or tokenizer.json.gz: %w", path, ErrNotFound)
		}
		path = found
	}
	data, err := fsx.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	t, err := parse(filepath.Base(path), data)
	if err != nil {
		return nil, err
	}
	cfgPath := filepath.Join(filepath.Dir(path), "tokenizer_config.json")
	cfg, err := fsx.ReadFile(cfgPath)
	switch {
	case err == nil:
		if err := t.applyConfig("tokenizer_config.json", cfg); err != nil {
			return nil, err
		}
	case !errors.Is(err, os.ErrNotExist):
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	return t, nil
}

// Parse builds a tokenizer from the contents of a tokenizer.json (plain or
// gzip-compressed). Errors wrap ErrMalformed or ErrUnsupported and name the
// field, e.g. `tokenizer: tokenizer.json: model.type "WordPiece" unsupported
// (want BPE)`. Parse never panics, whatever the input.
func Parse(data []byte) (*Tokenizer, error) {
	return parse("tokenizer.json", data)
}

// ParseConfig builds a tokenizer from the contents of a tokenizer.json
// (plain or gzip-compressed, as Parse) and, when config is not nil, of the
// tokenizer_config.json beside it, applied exactly as Load applies the one
// it finds in the directory (bos_token / eos_token, add_bos_token /
// add_eos_token). It lets a caller holding both files in memory (an lmpack
// artifact embeds them) get the tokenizer Load would give for a directory
// holding them. Errors: Parse's; a tokenizer_config.json that is not a JSON
// object or names a token the tokenizer lacks (ErrMalformed, naming the
// file and the key).
func ParseConfig(data, config []byte) (*Tokenizer, error) {
	t, err := parse("tokenizer.json", data)
	if err != nil {
		return nil, err
	}
	if config != nil {
		if err := t.applyConfig("tokenizer_config.json", config); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// maxUnzipped bounds the size of a decompressed tokenizer.json (1 GiB).
const maxUnzipped = 1 << 30

func parse(file string, data []byte) (*Tokenizer, error) {
	if len(data) >= 2 && data[0] == 0x1f && data[1] == 0x8b {
		zr, err := gzip.NewReader(bytes.NewReader(data))
		if err != nil {
			return nil, &fieldError{file: file, msg: "bad gzip stream", kind: ErrMalformed, cause: err}
		}
		plain, err := io.ReadAll(io.LimitReader(zr, maxUnzipped+1))
		if err != nil {
			return nil, &fieldError{file: file, msg: "bad gzip stream", kind: ErrMalformed, cause: err}
		}
		if len(plain) > maxUnzipped {
			return nil, &fieldError{file: file, msg: "decompresses to more than 1 GiB", kind: ErrMalformed}
		}
		data = plain
	}
	p := &parser{file: file}
	return p.tokenizer(data)
}

// Encode returns the token ids of text. With addSpecial the post-processor
// template is applied (e.g. BOS in front for Llama-2; nothing for Qwen3).
//
// The pipeline follows Hugging Face tokenizers: the text is first split
// around added tokens (each becomes its id); every other stretch is
// normalized, then split around normalized added tokens, pre-tokenized into
// words, and each word is encoded by BPE.
//
// Invalid UTF-8 never panics: before anything else, each maximal ill-formed
// subsequence is replaced by U+FFFD (as Python's bytes.decode with
// errors="replace" does), so Encode(s) == Encode of that repaired string.
func (t *Tokenizer) Encode(text string, addSpecial bool) []int {
	text = toValidUTF8(text)
	ids := make([]int, 0, len(text)/3+4)
	if addSpecial {
		ids = append(ids, t.prefix...)
	}
	var pieces []piece
	for _, sg := range t.addedRaw.split(text, true, nil) {
		if sg.id >= 0 {
			ids = append(ids, sg.id)
			continue
		}
		s := sg.s
		if t.normalizer != nil {
			s = t.normalizer.normalize(s)
		}
		for _, sub := range t.addedNorm.split(s, sg.first, nil) {
			if sub.id >= 0 {
				ids = append(ids, sub.id)
				continue
			}
			if sub.s == "" {
				continue
			}
			pieces = append(pieces[:0], piece{s: sub.s, first: sub.first})
			if t.pre != nil {
				pieces = t.pre.apply(pieces)
			}
			for _, pc := range pieces {
				ids = t.model.tokenize(pc.s, ids)
			}
		}
	}
	if addSpecial {
		ids = append(ids, t.suffix...)
	}
	return ids
}

// decodeToken returns the token string of id for decoding, false when the
// id has no token or is a special token being skipped.
func (t *Tokenizer) decodeToken(id int, skipSpecial bool) (string, bool) {
	if id < 0 || id >= len(t.idToTok) {
		return "", false
	}
	tok := t.idToTok[id]
	if tok == "" {
		return "", false
	}
	if skipSpecial && t.special[id] {
		return "", false
	}
	return tok, true
}

// Decode returns the text of ids, running the tokenizer.json decoder (for
// Llama-2: "▁" to space, <0xNN> byte runs to UTF-8, one leading space
// stripped; for byte-level BPE: characters back to bytes, ill-formed UTF-8
// replaced by U+FFFD per maximal subpart). With skipSpecial, added tokens
// marked "special" are dropped. Ids without a token (negative, beyond the
// vocabulary, or holes) are ignored, as in Hugging Face tokenizers. Without
// a decoder the tokens are joined with single spaces.
func (t *Tokenizer) Decode(ids []int, skipSpecial bool) string {
	toks := make([]string, 0, len(ids))
	for _, id := range ids {
		if tok, ok := t.decodeToken(id, skipSpecial); ok {
			toks = append(toks, tok)
		}
	}
	if !t.hasDecoder {
		return strings.Join(toks, " ")
	}
	for i := range t.decoder {
		toks = t.decoder[i].batch(toks)
	}
	return strings.Join(toks, "")
}

// VocabSize returns the largest token id plus one, counting the model
// vocabulary and the added tokens (e.g. 512 for stories260K, 151669 for
// Qwen3).
func (t *Tokenizer) VocabSize() int { return len(t.idToTok) }

// BOS returns the beginning-of-sequence id: tokenizer_config.json's
// bos_token when Load found that file (false when it is null), else the
// first id the post-processor puts in front (false when none).
func (t *Tokenizer) BOS() (int, bool) { return t.bos, t.bos >= 0 }

// EOS returns the end-of-sequence id: tokenizer_config.json's eos_token when
// Load found that file (false when it is null), else the last id the
// post-processor appends (false when none).
func (t *Tokenizer) EOS() (int, bool) { return t.eos, t.eos >= 0 }

// TokenID returns the id of the token string s (added tokens first, then the
// model vocabulary; model tokens are in their internal form, e.g. "▁the" or
// "Ġthe").
func (t *Tokenizer) TokenID(s string) (int, bool) {
	if id, ok := t.addedIDs[s]; ok {
		return id, true
	}
	if id, ok := t.model.vocab[s]; ok {
		return int(id), true
	}
	return 0, false
}

// Token returns the token string of id ("" when id has none).
func (t *Tokenizer) Token(id int) string {
	if id < 0 || id >= len(t.idToTok) {
		return ""
	}
	return t.idToTok[id]
}

// IsSpecial reports whether id is an added token marked "special" (the
// tokens Decode drops with skipSpecial).
func (t *Tokenizer) IsSpecial(id int) bool { return t.special[id] }
