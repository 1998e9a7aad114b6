// Package prune applies pruning plans to Hugging Face checkpoints and is the
// entry point of `lmpack prune`.
//
// It lives in its own package, beside the selection math of prune/depth
// and prune/width, because applying a plan needs files, the model
// configuration, the runtime and the calibration file (formats/safetensors,
// formats/arch, runtime, calibrate), which the pure math packages must not
// depend on.
//
// Depth pruning (docs/METHODS.md §5): [Run] reads the model and the
// calibration file, turns the "lorp" similarity statistic into a
// depth.Plan (LoRP, ShortGPT or an explicit list) and [ApplyDepth] writes
// the pruned checkpoint: the kept decoder blocks renumbered 0..L'−1 with
// their tensors copied byte for byte, config.json rewritten by
// arch.RewriteConfig (num_hidden_layers, per-layer lists, layer indices and
// max_window_layers / decoder_sparse_step, so every kept layer keeps its
// attention type and FFN kind), and the tokenizer and other
// side files copied. The result loads with stock Hugging Face loaders.
// Works on dense and MoE models.
//
// Width pruning (Putri, docs/METHODS.md §6; arXiv 2605.18331), dense
// models only (MoE models are refused with ErrOptions):
//
//   - Head groups. The unit is a GQA group: one KV head and its
//     num_heads/num_key_value_heads query heads. --head-method putri
//     (default) scores groups by Putri's masked perplexity on the first
//     calibration window (token ids from the calibration file): each round
//     masks every remaining group in turn (runtime.KVGroupMasker zeroes its
//     attention output before o_proj) and removes the HeadStep groups of
//     lowest perplexity. --head-method proxy removes the groups with the
//     lowest calibrate head proxy (mean squared attention output at the
//     o_proj input, calibrate.StatHeads) in one step. Every layer keeps at
//     least one group (HeadBudget). Applying slices q/k/v rows and biases and
//     o_proj columns; q_norm/k_norm (per head_dim) are unchanged. With
//     --head-refit (Options.HeadRefit, Putri's optional o_proj update) the
//     o_proj of each layer that loses groups is instead refit by least
//     squares on its kept input channels, layer by layer on the partly
//     pruned model like the FFN stage (headsRefit). The refit is not
//     always better than slicing (TestHeadRefit compares the two on
//     stories260K).
//   - FFN units, after the heads and layer by layer: layer l's down_proj
//     statistics are collected by running the calibration windows through
//     the model whose earlier layers are already pruned (prune/width for
//     the scores, selection and least-squares refit). Each layer reloads
//     the partly pruned model and the pass stops after layer l, so the
//     cost is about L/2 full passes over the calibration tokens.
//   - A sparsity budget (Options.Sparsity, --sparsity s) instead of explicit
//     counts: Putri's split removes n_attn = round(L·s^((P_mlp/P_attn)/1.5))
//     layers' worth of attention parameters as head groups (each unit is
//     P_attn/P_group groups, i.e. the groups of one layer) and takes the
//     rest of s·(decoder parameters) evenly from every FFN, rounded to whole
//     nodes (SparsityPlan). Decoder parameters are the attention and FFN
//     projections. Sparsities that would strip a layer of its last group or
//     an FFN of its last node, or that round to nothing, are refused with
//     the reachable range.
//
// Output of width pruning: config.json keeps its stock fields and gains
// "layer_configs", one {num_attention_heads, num_key_value_heads,
// intermediate_size} object per layer, which lmpack's formats/arch and
// runtime read. Stock loaders (transformers, llama.cpp) ignore that list
// and build every layer from the global sizes, so they cannot load a
// width-pruned checkpoint (the weight shapes disagree); only layer-only
// pruning stays stock-loadable. Changed tensors keep their dtype when it is
// F32, F16 or BF16 (others are written as F32). Layer removal and width
// pruning are separate runs: remove layers, calibrate the result, then prune
// widths.
//
// What it is not for: computing statistics (calibrate), the selection math
// (prune/depth, prune/width), running models (runtime).
package prune
