package eval

import (
	"strconv"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/internal/field"
)

// Validate checks opt's values: Ctx >= 2 (position 0 is never scored),
// MaxWindows >= 0 (0: all), Chunk >= 0, Prompt in [0, Ctx−2] (one
// position at least is scored) and 0 unless Chunk >= 1. Model-dependent limits are ValidateModel's.
//
// Errors: a *field.Error naming the Go field (cmd/lmpack and compress
// rename it to their flag or recipe key).
func (opt *PerplexityOptions) Validate() error {
	switch {
	case opt.Ctx < 2:
		return field.New("Ctx", opt.Ctx, ">= 2")
	case opt.MaxWindows < 0:
		return field.New("MaxWindows", opt.MaxWindows, ">= 0 (0: all)")
	case opt.Chunk < 0:
		return field.New("Chunk", opt.Chunk, ">= 0 tokens per decode call (0: each window in one call)")
	case opt.Prompt < 0 || opt.Prompt > opt.Ctx-2:
		return field.New("Prompt", opt.Prompt, "in [0, {Ctx} − 2 = "+strconv.Itoa(opt.Ctx-2)+"] (the prompt's positions are not scored; at least one must be)")
	case opt.Prompt > 0 && opt.Chunk == 0:
		return field.New("Prompt", opt.Prompt, "0 unless {Chunk} >= 1 (a prompt is only apart from decode)")
	}
	return nil
}

// ValidateModel checks opt against the model d: Ctx at most
// max_position_embeddings (when the config gives it).
//
// Errors: a *field.Error naming Ctx.
func (opt *PerplexityOptions) ValidateModel(d *arch.Description) error {
	if mp := d.MaxPositionEmbeddings; mp > 0 && opt.Ctx > mp {
		return field.New("Ctx", opt.Ctx, "at most the model's max_position_embeddings "+strconv.Itoa(mp))
	}
	return nil
}
