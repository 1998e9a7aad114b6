package arch

// DefaultContextTokens is the window length lmpack's calibrate and eval use
// when none is given, unless the model's context is shorter.
const DefaultContextTokens = 512

// DefaultContext is the window length in tokens for d when none is given:
// min(DefaultContextTokens, max_position_embeddings), or
// DefaultContextTokens when the config gives no max_position_embeddings.
func DefaultContext(d *Description) int {
	if mp := d.MaxPositionEmbeddings; mp > 0 && mp < DefaultContextTokens {
		return mp
	}
	return DefaultContextTokens
}
