// Package calibrate runs a model over calibration text and keeps the
// statistics later compression stages need, in a calibration file.
//
// What it is for:
//   - Collecting statistics from the runtime's observer hooks
//     (runtime.QKVObserver and friends) as streams: every statistic is an
//     accumulator whose memory is independent of the number of calibration
//     tokens (a d×d matrix per layer, not the activations).
//   - The calibration file format (Write, Read): a safetensors file whose
//     tensors are the statistics, in float64, and whose "__metadata__" holds
//     one JSON object under the key "lmpack" (Header) tying the file to the
//     model (ModelFingerprint) and to the data (sha256 of the text file).
//   - Run, the entry point of `lmpack calibrate`: open the model, tokenize
//     the data, collect, write.
//
// Statistics: "oscar", the key and value target covariances C_Q and
// C_S of OSCAR (docs/METHODS.md §1; arXiv 2605.17757), see CollectOSCAR;
// and "lorp", the (L+1)×(L+1) mean cosine similarity of the block inputs
// plus the final-norm input (SimilarityTensor, for LoRP and ShortGPT depth
// pruning, docs/METHODS.md §5), collected during the first pass (Collect).
// Files written before "lorp" existed read back with Similarity nil.
// "tokens", the calibration token ids (StatTokens); "heads", a cheap
// per-(layer, KV group) head-importance proxy, the mean squared norm of
// each GQA group's attention output at the o_proj input (StatHeads,
// CollectStats, also during the first pass). Putri's masked-perplexity
// head score is iterative and is computed by lmpack prune from the token
// ids. "experts" (StatExperts, MoE models): per-expert routing counts and
// input Hessians (CollectExperts), collected in one pass per group of MoE
// layers that fits Options.MaxExpertBytes (ExpertPasses), each group
// written to a temporary file and copied into the output at the end so
// that memory holds one group. Later statistics add a statistic name to Header.Statistics and their own tensor
// prefix ("<statistic>.layers.N.<name>"); Read ignores statistics it does
// not know, so old readers keep reading newer files of the same
// FormatVersion.
//
// What it is not for: turning statistics into transforms (rotations,
// bit allocations, pruning plans live in quantize and prune), and running
// models (runtime).
package calibrate
