package calibrate

import (
	"encoding/binary"
	"fmt"

	"github.com/lmpack/lmpack/formats/safetensors"
)

// StatTokens is the Header.Statistics name of the calibration token ids
// (tensor TokensTensor). Stages that must run the model again on the same
// data (sequential FFN statistics for width pruning, GPTQ Hessians,
// masked-perplexity head scores) read them back, so they need neither the
// text file nor the tokenizer.
const StatTokens = "tokens"

// TokensTensor is the name of the calibration token ids: I32, [Tokens],
// the first Header.Tokens ids of the tokenized calibration text (BOS
// first when the model has one). Header.Ctx splits them into windows
// (Windows).
const TokensTensor = "calibration.tokens"

// CalibrationWindows returns c.TokenIDs split into windows of
// c.Header.Ctx tokens (Windows), or nil when the file holds no token ids
// (files written before StatTokens existed).
func (c *Calibration) CalibrationWindows() [][]int {
	if len(c.TokenIDs) == 0 {
		return nil
	}
	w, err := Windows(c.TokenIDs, len(c.TokenIDs), c.Header.Ctx)
	if err != nil {
		return nil
	}
	return w
}

// tokensTensor encodes ids as the I32 TokensTensor. Errors: an id outside
// [0, 2³¹).
func tokensTensor(path string, ids []int) (safetensors.WriteTensor, error) {
	b := make([]byte, 4*len(ids))
	for i, id := range ids {
		if id < 0 || id > 1<<31-1 {
			return safetensors.WriteTensor{}, fmt.Errorf("calibrate: %s: tensor %q: token %d at position %d is not an int32 id: %w", path, TokensTensor, id, i, ErrBadStatistic)
		}
		binary.LittleEndian.PutUint32(b[4*i:], uint32(id))
	}
	return safetensors.WriteTensor{Name: TokensTensor, DType: safetensors.I32, Shape: []int{len(ids)}, Data: b}, nil
}

// readTokens reads TokensTensor: I32, [tokens], non-negative ids below
// vocab (when vocab > 0).
func readTokens(f *safetensors.File, path string, tokens, vocab int) ([]int, error) {
	t, err := f.Tensor(TokensTensor)
	if err != nil {
		return nil, fmt.Errorf("calibrate: %w: %w", err, ErrBadStatistic)
	}
	if t.DType != safetensors.I32 || len(t.Shape) != 1 || t.Shape[0] != tokens {
		return nil, fmt.Errorf("calibrate: %s: tensor %q: %s %v, want I32 [%d] (the header's tokens): %w", path, TokensTensor, t.DType, t.Shape, tokens, ErrBadStatistic)
	}
	ids := make([]int, tokens)
	for i := range ids {
		id := int(int32(binary.LittleEndian.Uint32(t.Data[4*i:])))
		if id < 0 || (vocab > 0 && id >= vocab) {
			return nil, fmt.Errorf("calibrate: %s: tensor %q: token %d at position %d is outside the vocabulary [0, %d): %w", path, TokensTensor, id, i, vocab, ErrBadStatistic)
		}
		ids[i] = id
	}
	return ids, nil
}
