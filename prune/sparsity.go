package prune

import (
	"fmt"
	"math"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/model"
	"github.com/lmpack/lmpack/prune/width"
)

// SparsityPlan is the head-group and FFN budget that Options.Sparsity
// resolves to (Putri's budget split, docs/METHODS.md §6), with the
// sparsity achieved; it is part of a Report.
//
// Decoder parameters are the elements of every layer's attention
// projections (q, k, v, o weights and their biases) and FFN projections
// (gate, up, down): the tensors width pruning can shrink. Embeddings,
// lm_head and norms are not counted.
type SparsityPlan struct {
	// Sparsity is the requested fraction s of decoder parameters to remove.
	Sparsity float64 `json:"sparsity"`
	// AttentionUnits is n_attn = round(L · s^((P_mlp/P_attn)/1.5))
	// (width.AttentionUnits); one unit is one layer's attention parameters.
	AttentionUnits int `json:"attention_units"`
	// HeadGroups is the number of GQA groups removed:
	// round(AttentionUnits · P_attn / P_group).
	HeadGroups int `json:"head_groups"`
	// FFNRemoved and FFNKeep are the intermediate nodes every FFN removes
	// and keeps (FFNKeep = F − FFNRemoved).
	FFNRemoved int `json:"ffn_removed"`
	FFNKeep    int `json:"ffn_keep"`
	// DecoderParams is the decoder parameter count before pruning;
	// RemovedParams the decoder parameters removed (elements).
	DecoderParams int64 `json:"decoder_params"`
	RemovedParams int64 `json:"removed_params"`
	// Achieved is RemovedParams / DecoderParams.
	Achieved float64 `json:"achieved"`
}

// budgetModel holds the sizes the sparsity budget needs (elements).
type budgetModel struct {
	L, F   int
	attn   int64 // attention projections and biases, all layers
	oBias  int64 // o_proj biases (never removed with a group)
	mlp    int64 // gate, up, down, all layers
	groups int   // KV groups over all layers
}

// newBudgetModel reads the sizes from desc and the checkpoint's shapes.
// Errors: ErrOptions when the FFNs differ in size (the even FFN split
// needs one F); checkpoint errors.
func newBudgetModel(desc *arch.Description, ck *safetensors.Checkpoint) (*budgetModel, error) {
	b := &budgetModel{L: len(desc.Layers)}
	count := func(name string) (int64, error) {
		if name == "" {
			return 0, nil
		}
		t, err := ck.Tensor(name)
		if err != nil {
			return 0, fmt.Errorf("prune: %w", err)
		}
		return int64(t.NumElements()), nil
	}
	for l, ly := range desc.Layers {
		if ly.MLP == nil {
			return nil, fmt.Errorf("%w: layer %d has no dense FFN", ErrOptions, l)
		}
		if l == 0 {
			b.F = ly.MLP.IntermediateSize
		} else if ly.MLP.IntermediateSize != b.F {
			return nil, fmt.Errorf("%w: --sparsity needs every FFN to have the same intermediate size (layer 0: %d, layer %d: %d); use --head-groups/--ffn-ratio", ErrOptions, b.F, l, ly.MLP.IntermediateSize)
		}
		a := ly.Attn
		for _, n := range []string{a.Q, a.K, a.V, a.O, a.QBias, a.KBias, a.VBias, a.OBias} {
			c, err := count(n)
			if err != nil {
				return nil, err
			}
			b.attn += c
		}
		c, err := count(a.OBias)
		if err != nil {
			return nil, err
		}
		b.oBias += c
		for _, n := range []string{ly.MLP.Gate, ly.MLP.Up, ly.MLP.Down} {
			c, err := count(n)
			if err != nil {
				return nil, err
			}
			b.mlp += c
		}
		b.groups += ly.NumKVHeads
	}
	if b.L < 1 || b.F < 1 || b.attn <= 0 || b.mlp <= 0 || b.groups < 1 {
		return nil, fmt.Errorf("%w: model has no attention or FFN parameters to prune", ErrOptions)
	}
	return b, nil
}

// plan resolves sparsity s in (0, 1) (docs/METHODS.md §6):
//
//	P_attn = attention params / L, P_mlp = FFN params / L (per-layer means)
//	n_attn = round(L · s^((P_mlp/P_attn)/1.5))           width.AttentionUnits
//	P_group = (attention params − o biases) / KV groups  (one group's share)
//	groups = round(n_attn · P_attn / P_group)            (= n_attn · groups per layer
//	                                                      for uniform layers)
//	per FFN = (s · decoder params − groups · P_group) / L
//	FFN removed = max(0, round(per FFN / P_node)),  P_node = P_mlp / F (= 3·D)
//
// Rounding is half away from zero. Errors: ErrOptions when s is not in
// (0, 1), when the groups would leave a layer without one (more than
// groups − L), when the FFNs would keep no node, or when nothing would be
// removed.
func (b *budgetModel) plan(s float64) (*SparsityPlan, error) {
	if !(s > 0 && s < 1) {
		return nil, fmt.Errorf("%w: sparsity %v: want in (0, 1)", ErrOptions, s)
	}
	L := float64(b.L)
	pAttn, pMLP := float64(b.attn)/L, float64(b.mlp)/L
	nAttn, err := width.AttentionUnits(b.L, s, pMLP, pAttn)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrOptions, err)
	}
	pGroup := float64(b.attn-b.oBias) / float64(b.groups)
	groups := int(math.Round(float64(nAttn) * pAttn / pGroup))
	if groups > b.groups-b.L {
		return nil, fmt.Errorf("%w: sparsity %v spends %d attention unit(s) = %d of %d KV head groups, but each of the %d layers must keep one group (at most %d can go)",
			ErrOptions, s, nAttn, groups, b.groups, b.L, b.groups-b.L)
	}
	total := float64(b.attn + b.mlp)
	node := pMLP / float64(b.F)
	perFFN := (s*total - float64(groups)*pGroup) / L
	remove := max(0, int(math.Round(perFFN/node)))
	if remove > b.F-1 {
		return nil, fmt.Errorf("%w: sparsity %v would remove %d of the %d intermediate nodes of every FFN (at most %d can go)", ErrOptions, s, remove, b.F, b.F-1)
	}
	if groups == 0 && remove == 0 {
		return nil, fmt.Errorf("%w: sparsity %v rounds to no head group and no FFN node", ErrOptions, s)
	}
	return &SparsityPlan{Sparsity: s, AttentionUnits: nAttn, HeadGroups: groups, FFNRemoved: remove, FFNKeep: b.F - remove,
		DecoderParams: b.attn + b.mlp}, nil
}

// reachable returns the smallest and largest sparsity on a 0.001 grid in
// (0, 1) that plan accepts (ok false when none does).
func (b *budgetModel) reachable() (lo, hi float64, ok bool) {
	for i := 1; i < 1000; i++ {
		s := float64(i) / 1000
		if _, err := b.plan(s); err == nil {
			if !ok {
				lo = s
			}
			hi, ok = s, true
		}
	}
	return lo, hi, ok
}

// sparsityPlan is plan with the reachable range added to its errors.
func sparsityPlan(desc *arch.Description, ck *safetensors.Checkpoint, s float64) (*SparsityPlan, error) {
	b, err := newBudgetModel(desc, ck)
	if err != nil {
		return nil, err
	}
	p, err := b.plan(s)
	if err != nil && s > 0 && s < 1 {
		if lo, hi, ok := b.reachable(); ok {
			return nil, fmt.Errorf("%w; this model reaches sparsity %.3f to %.3f (0.001 grid)", err, lo, hi)
		}
		return nil, fmt.Errorf("%w; no sparsity can be met on this model", err)
	}
	return p, err
}

// PlanSparsity returns the head-group and FFN budget Options.Sparsity s
// gives the checkpoint in dir (config.json and its safetensors), as Run
// would compute it, without pruning anything. Errors: model.OpenDir's
// (no or unreadable config, unreadable weights), and ErrOptions for a sparsity the model
// cannot reach, naming the reachable range.
func PlanSparsity(dir string, s float64) (*SparsityPlan, error) {
	desc, ck, err := model.OpenDir(dir)
	if err != nil {
		return nil, fmt.Errorf("prune: %w", err)
	}
	defer ck.Close()
	return sparsityPlan(desc, ck, s)
}
