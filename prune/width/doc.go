// Package width holds the FFN half of Putri's width pruning as pure math:
// statistics accumulated at a down_proj input, node (intermediate-channel)
// scores, top-k selection, the least-squares refit of down_proj on the kept
// nodes, and the attention/FFN split of a parameter budget.
//
// Sources:
//   - Putri — Prune, Update and Trim (arXiv 2605.18331), FFN stage and the
//     budget split; docs/METHODS.md §6.
//   - 2SSP, two-stage structured pruning (arXiv 2501.17771), which Putri
//     builds on: n_attn = round(L · s^((P_mlp/P_attn)/1.5)).
//
// Shapes follow Hugging Face Llama-style checkpoints: down_proj.weight is W
// [D, F] float32 row-major (D = hidden_size, F = intermediate_size), so the
// down_proj input X is [n, F] and its output Y = X Wᵀ is [n, D], one token per
// row. Sums are kept in float64.
//
// Typical use, per layer l, in order (the statistics of layer l must be
// collected on a model whose layers < l are already pruned):
//
//	st, _ := width.NewFFNStats(F, D)
//	for each calibration batch { st.Add(x, y, n) }
//	kept, scores, _ := width.SelectFFN(st, W, keep)
//	Wnew, _ := width.RefitDown(st, kept, width.DefaultDamping) // or SliceColumns(W, D, F, kept)
//	gate/up: SliceRows(w, F, D, kept)
//
// What this package is not for: it reads and writes no files, runs no model
// and knows no tensor names. Capturing X and Y belongs to the runtime and
// calibrate side; writing the pruned checkpoint belongs to the prune command
// and the formats packages. Attention head-group scoring (masked perplexity)
// needs model execution and is not here either.
package width
