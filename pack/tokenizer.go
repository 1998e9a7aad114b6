package pack

import (
	"errors"
	"fmt"
	"io/fs"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/tokenizer"
)

// parseTokenizer builds the tokenizer a loader uses from the bytes of
// tokenizer.json and of tokenizer_config.json (nil: absent), as
// tokenizer.Load builds it from a directory holding the two files
// (tokenizer.ParseConfig), and checks that its vocabulary fits the
// model's vocab_size (a token id beyond the embedding would not run).
// Errors: tokenizer.ParseConfig's; a tokenizer with more tokens than
// vocabSize.
func parseTokenizer(tokenizerJSON, config []byte, vocabSize int) (*tokenizer.Tokenizer, error) {
	tok, err := tokenizer.ParseConfig(tokenizerJSON, config)
	if err != nil {
		return nil, err
	}
	if tok.VocabSize() > vocabSize {
		return nil, fmt.Errorf("tokenizer has %d tokens but vocab_size is %d", tok.VocabSize(), vocabSize)
	}
	return tok, nil
}

// Tokenizer builds the tokenizer run and eval use for the artifact: its
// embedded tokenizer.json and, when embedded, tokenizer_config.json (which
// sets add_bos_token and the special tokens), parsed as tokenizer.Load
// parses a checkpoint directory holding them (tokenizer.ParseConfig), and
// checks it against d's vocab_size (d: the artifact's Description).
//
// Errors (naming the artifact): no embedded tokenizer.json, or one whose
// section fails its checksum (ErrNoSection, ErrChecksum); a
// tokenizer_config.json section that fails its checksum (an error, never
// treated as absent: that would silently change BOS handling and the
// special tokens); the tokenizer errors (tokenizer.ErrMalformed,
// tokenizer.ErrUnsupported, naming the file and field); more tokens than
// vocab_size.
func (r *Reader) Tokenizer(d *arch.Description) (*tokenizer.Tokenizer, error) {
	tj, err := r.File("tokenizer.json")
	if err != nil {
		return nil, fmt.Errorf("pack: %s: the artifact embeds no usable tokenizer.json: %w", r.path, err)
	}
	cfg, err := r.File("tokenizer_config.json")
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("pack: %s: embedded tokenizer_config.json: %w", r.path, err)
	}
	tok, err := parseTokenizer(tj, cfg, d.VocabSize)
	if err != nil {
		return nil, fmt.Errorf("pack: %s: embedded %w", r.path, err)
	}
	return tok, nil
}
