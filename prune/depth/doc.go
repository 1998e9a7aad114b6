// Package depth holds the math of depth (whole-block) pruning for lmpack: it
// accumulates the L×L cosine-similarity matrix of block inputs from calibration
// hidden states and turns it into a serialisable [Plan] naming the decoder
// blocks to remove.
//
// Methods (docs/METHODS.md §5):
//
//   - LoRP, Locality-Aware Redundancy Pruning (arXiv 2605.27786): the
//     Representation Locality Score RLS = −log2(mean_{i<j} S_ij) picks a number
//     of clusters K, spectral clustering of the affinity A = (S+1)/2 splits the
//     depth into K phases, and a two-stage allocation removes the most
//     redundant layers of each phase. A degenerate clustering (a layer to
//     remove alone in its cluster, e.g. K = L on a 4-layer model) falls
//     back to the lowest Block Influence and the plan says so
//     (Plan.Fallback). See [LoRP].
//   - ShortGPT (arXiv 2403.03853): Block Influence BI_i = 1 − mean cos(x_i,
//     x_{i+1}); the lowest-BI blocks are removed. See [ShortGPT].
//   - An explicit list of layers. See [ListPlan].
//
// Layers are indexed 0..L−1 by depth; S is always a row-major []float64 of
// length L·L (or (L+1)² where documented) with S_ij the mean over tokens of
// cos(h_i, h_j), h_i the input hidden state of block i.
//
// What this package is not for: it reads no files, runs no model and touches
// no weights. Capturing hidden states belongs to the runtime/calibrate side,
// applying a Plan to a checkpoint (renumbering layers, writing config.json)
// belongs to the prune command and the formats packages.
package depth
