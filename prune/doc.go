// Package prune applies pruning plans to Hugging Face checkpoints and is the
// entry point of `lmpack prune`.
//
// It lives in its own package, beside the selection math of prune/depth,
// because applying a plan needs files, the model configuration and the
// calibration file (formats/safetensors, formats/arch, calibrate), which the
// pure math package must not depend on. Later width pruning (heads, FFN
// units) will add its appliers here.
//
// Depth pruning today (docs/METHODS.md §5): [Run] reads the model and the
// calibration file, turns the "lorp" similarity statistic into a
// depth.Plan (LoRP, ShortGPT or an explicit list) and [ApplyDepth] writes
// the pruned checkpoint: the kept decoder blocks renumbered 0..L'−1 with
// their tensors copied byte for byte, config.json with num_hidden_layers
// (and the per-layer lists it knows) updated, and the tokenizer and other
// side files copied. The result loads with stock Hugging Face loaders.
//
// What it is not for: computing statistics (calibrate), choosing layers
// (prune/depth), running models (runtime). Width pruning (Putri) is not
// implemented yet.
package prune
