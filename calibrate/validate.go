package calibrate

import (
	"fmt"
	"strconv"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/internal/field"
)

// MaxTokens bounds Options.Tokens: statistics are streamed, but the
// token ids of the data file are held in memory (8 bytes each).
const MaxTokens = 1 << 30

// Validate checks opt's values without opening anything: Data and Out
// given, Tokens in [1, MaxTokens], Ctx 0 (the model's
// arch.DefaultContext) or >= 2, Tokens at least one window of Ctx,
// MaxExpertBytes and MinExpertTokens >= 0. Model-dependent limits are
// ValidateModel's.
//
// Errors: a *field.Error naming the Go field (cmd/lmpack and compress
// rename it to their flag or recipe key).
func (opt *Options) Validate() error {
	switch {
	case opt.Data == "":
		return field.New("Data", nil, "a UTF-8 calibration text file")
	case opt.Out == "":
		return field.New("Out", nil, "the calibration file to write")
	case opt.Tokens <= 0 || opt.Tokens > MaxTokens:
		return field.New("Tokens", opt.Tokens, "1 to 1073741824")
	case opt.Ctx < 0 || opt.Ctx == 1:
		return field.New("Ctx", opt.Ctx, ">= 2 (0: min(512, max_position_embeddings))")
	case opt.Tokens < opt.Ctx:
		return field.New("Tokens", opt.Tokens, "at least one window of {Ctx} tokens")
	case opt.MaxExpertBytes < 0:
		return field.New("MaxExpertBytes", opt.MaxExpertBytes, "bytes >= 0 (0: no limit)")
	case opt.MinExpertTokens < 0:
		return field.New("MinExpertTokens", opt.MinExpertTokens, fmt.Sprintf(">= 0 tokens (0: the default, %d)", DefaultMinExpertTokens))
	}
	return nil
}

// ValidateModel checks opt against the model d: Ctx (0: as Run resolves
// it, arch.DefaultContext(d)) at most max_position_embeddings (when the
// config gives it) and at most Tokens, AllExperts only on a model with a
// mixture-of-experts layer.
//
// Errors: a *field.Error naming the Go field.
func (opt *Options) ValidateModel(d *arch.Description) error {
	ctx := opt.Ctx
	if ctx == 0 {
		ctx = arch.DefaultContext(d)
	}
	if mp := d.MaxPositionEmbeddings; mp > 0 && ctx > mp {
		return field.New("Ctx", ctx, "at most the model's max_position_embeddings "+strconv.Itoa(mp))
	}
	if opt.Tokens < ctx {
		return field.New("Tokens", opt.Tokens, "at least one window of {Ctx} "+strconv.Itoa(ctx)+" tokens")
	}
	if opt.AllExperts && !hasMoE(d) {
		return field.New("AllExperts", opt.AllExperts, "a mixture-of-experts model (this one has no MoE layer)")
	}
	return nil
}

func hasMoE(d *arch.Description) bool {
	for _, l := range d.Layers {
		if l.MoE != nil {
			return true
		}
	}
	return false
}
