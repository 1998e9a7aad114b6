package prune

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"

	"github.com/lmpack/lmpack/eval"
	"github.com/lmpack/lmpack/runtime"
)

// Head-group scoring methods (Options.HeadMethod).
const (
	// HeadPutri scores a group by the perplexity of the model with it
	// masked (Putri, arXiv 2605.18331; docs/METHODS.md §6).
	HeadPutri = "putri"
	// HeadProxy scores a group by the calibration file's head proxy, the
	// mean squared norm of its attention output at the o_proj input
	// (calibrate.StatHeads).
	HeadProxy = "proxy"
)

// RemovedGroup is one removed GQA group (one KV head and its query heads)
// in a Report.
type RemovedGroup struct {
	// Layer and Group are original indices (the group is KV head Group of
	// the layer before pruning).
	Layer int `json:"layer"`
	Group int `json:"group"`
	// Score is the group's score when it was removed: the masked
	// perplexity (putri; lower means less important) or the head proxy.
	Score float64 `json:"score"`
	// Round is the Putri round (0-based) that removed it; 0 for proxy.
	Round int `json:"round"`
}

// group is a (layer, KV group) unit.
type group struct{ layer, g int }

// HeadBudget turns Options.HeadGroups / HeadRatio into a group count for a
// model with total GQA groups over L layers: exactly one must be set; the
// ratio lies in (0, 1) and gives round(r·total), at least 1. Every layer
// keeps at least one group, so at most total−L groups can go. Errors:
// ErrOptions, with "breaks GQA grouping" when the count exceeds total−L.
func HeadBudget(groups int, ratio float64, total, L int) (int, error) {
	var n int
	switch {
	case groups != 0 && ratio != 0:
		return 0, fmt.Errorf("%w: give the number of head groups or the head ratio, not both", ErrOptions)
	case groups < 0:
		return 0, fmt.Errorf("%w: head groups %d: want > 0", ErrOptions, groups)
	case groups > 0:
		n = groups
	case !(ratio > 0 && ratio < 1):
		return 0, fmt.Errorf("%w: head ratio %v: want in (0, 1)", ErrOptions, ratio)
	default:
		n = max(1, int(math.Round(ratio*float64(total))))
	}
	if n > total-L {
		return 0, fmt.Errorf("%w: removing %d of %d KV head groups breaks GQA grouping: each of the %d layers must keep at least one group (one KV head and its query heads), so at most %d can go",
			ErrOptions, n, total, L, total-L)
	}
	return n, nil
}

// selectProxy removes the n groups of lowest proxy score (ties: lower
// layer, then lower group), never the last group of a layer.
func selectProxy(proxy [][]float64, n int) ([]RemovedGroup, error) {
	var all []RemovedGroup
	left := make([]int, len(proxy))
	for l, v := range proxy {
		left[l] = len(v)
		for g, s := range v {
			all = append(all, RemovedGroup{Layer: l, Group: g, Score: s})
		}
	}
	slices.SortStableFunc(all, func(a, b RemovedGroup) int { return cmp.Compare(a.Score, b.Score) })
	var out []RemovedGroup
	for _, r := range all {
		if len(out) == n {
			break
		}
		if left[r.Layer] > 1 {
			left[r.Layer]--
			out = append(out, r)
		}
	}
	if len(out) < n {
		return nil, fmt.Errorf("%w: only %d head groups can be removed (each layer keeps one)", ErrOptions, len(out))
	}
	return out, nil
}

// selectPutri is Putri's iterative head-group selection on model m (the
// unpruned model, which must implement runtime.KVGroupMasker): each round,
// every remaining group of a layer that still has more than one is masked
// in turn (on top of the groups already removed) and the perplexity of seq
// is measured over every calibration window (windowsPerplexity); the step
// groups of lowest perplexity (ties: lower layer, then group) are removed.
// Rounds repeat until n groups are removed. It returns the removed groups
// and the unmasked perplexity. Cost: about n/step × (remaining groups)
// forward passes over all windows. All masks are cleared on return.
//
// prog, when not nil, counts each masked-perplexity run as a step of its
// putri phase.
func selectPutri(ctx context.Context, m runtime.Model, windows [][]int, n, step int, prog *widthProgress) ([]RemovedGroup, float64, error) {
	mk, ok := m.(runtime.KVGroupMasker)
	if !ok {
		return nil, 0, fmt.Errorf("prune: the runtime model cannot mask head groups")
	}
	d := m.Description()
	masks := make([][]bool, len(d.Layers))
	left := make([]int, len(d.Layers))
	for l := range masks {
		masks[l] = make([]bool, d.Layers[l].NumKVHeads)
		left[l] = d.Layers[l].NumKVHeads
	}
	defer func() {
		for l := range masks {
			mk.MaskKVGroups(l, nil)
		}
	}()
	ppl := func() (float64, error) {
		p, err := windowsPerplexity(ctx, m, windows)
		if err != nil {
			return 0, fmt.Errorf("prune: masked perplexity: %w", err)
		}
		return p, nil
	}
	step = max(step, 1)
	candidates := func() int {
		c := 0
		for l := range masks {
			if left[l] > 1 {
				c += left[l]
			}
		}
		return c
	}
	if prog != nil {
		prog.putri = 1 + putriSteps(candidates(), n, step)
		prog.report()
	} else {
		prog = &widthProgress{}
	}
	base, err := ppl()
	if err != nil {
		return nil, 0, err
	}
	prog.step(&prog.putri)
	var out []RemovedGroup
	for round := 0; len(out) < n; round++ {
		prog.putri = putriSteps(candidates(), n-len(out), step)
		prog.report()
		var cands []RemovedGroup
		for l := range masks {
			if left[l] <= 1 {
				continue
			}
			for g, off := range masks[l] {
				if off {
					continue
				}
				masks[l][g] = true
				if err := mk.MaskKVGroups(l, masks[l]); err != nil {
					return nil, 0, err
				}
				p, err := ppl()
				masks[l][g] = false
				if err2 := mk.MaskKVGroups(l, masks[l]); err == nil {
					err = err2
				}
				if err != nil {
					return nil, 0, err
				}
				prog.step(&prog.putri)
				cands = append(cands, RemovedGroup{Layer: l, Group: g, Score: p, Round: round})
			}
		}
		slices.SortStableFunc(cands, func(a, b RemovedGroup) int { return cmp.Compare(a.Score, b.Score) })
		took := 0
		for _, c := range cands {
			if took == step || len(out) == n {
				break
			}
			if left[c.Layer] <= 1 {
				continue
			}
			masks[c.Layer][c.Group] = true
			left[c.Layer]--
			if err := mk.MaskKVGroups(c.Layer, masks[c.Layer]); err != nil {
				return nil, 0, err
			}
			out = append(out, c)
			took++
		}
		if took == 0 {
			return nil, 0, fmt.Errorf("%w: only %d head groups can be removed (each layer keeps one)", ErrOptions, len(out))
		}
	}
	return out, base, nil
}

// windowsPerplexity is the perplexity of m over every window (each run
// from position 0 with a fresh cache): exp of the mean, over all scored
// positions of all windows, of the NLL of token t+1 under the logits at t
// (eval.NLL), summed in float64. Windows shorter than 2 tokens score
// nothing. Errors: no window scores a token; a forward error; a
// non-finite NLL (eval.ErrNonFinite), naming the window and position.
func windowsPerplexity(ctx context.Context, m runtime.Model, windows [][]int) (float64, error) {
	longest := 0
	for _, w := range windows {
		longest = max(longest, len(w))
	}
	if longest < 2 {
		return 0, fmt.Errorf("%w: no calibration window has 2 tokens to score", eval.ErrTooShort)
	}
	V := m.Description().VocabSize
	logits := make([]float32, longest*V)
	cache := m.NewCache(longest)
	var total float64
	scored := 0
	for i, w := range windows {
		if len(w) < 2 {
			continue
		}
		cache.Truncate(0)
		if err := m.Forward(ctx, w, cache, logits[:len(w)*V], true); err != nil {
			return 0, fmt.Errorf("window %d: %w", i, err)
		}
		var wsum float64
		for t := 0; t+1 < len(w); t++ {
			nll := eval.NLL(logits[t*V:(t+1)*V], w[t+1])
			if math.IsNaN(nll) || math.IsInf(nll, 0) {
				return 0, fmt.Errorf("window %d position %d: %w (NLL %v)", i, t, eval.ErrNonFinite, nll)
			}
			wsum += nll
		}
		total += wsum
		scored += len(w) - 1
	}
	return math.Exp(total / float64(scored)), nil
}

// applyHeads slices the removed groups out of w: q_proj rows (and bias)
// of their query heads, k_proj/v_proj rows (and biases) of their KV heads,
// o_proj columns of their query heads; q_norm/k_norm (per head_dim) and the
// o_proj bias are unchanged. It updates w.desc's head counts.
func applyHeads(w *workState, removed []RemovedGroup) error {
	byLayer := map[int]map[int]bool{}
	for _, r := range removed {
		if byLayer[r.Layer] == nil {
			byLayer[r.Layer] = map[int]bool{}
		}
		byLayer[r.Layer][r.Group] = true
	}
	H := w.desc.HiddenSize
	for l, gone := range byLayer {
		spec := &w.desc.Layers[l]
		nh, nkv, hd := spec.NumHeads, spec.NumKVHeads, spec.HeadDim
		if nkv <= 0 || nh%nkv != 0 {
			return fmt.Errorf("%w: layer %d: %d query heads not a multiple of %d KV heads", ErrConfig, l, nh, nkv)
		}
		g := nh / nkv
		var qRows, kvRows []int
		for kv := 0; kv < nkv; kv++ {
			if gone[kv] {
				continue
			}
			for r := kv * g * hd; r < (kv+1)*g*hd; r++ {
				qRows = append(qRows, r)
			}
			for r := kv * hd; r < (kv+1)*hd; r++ {
				kvRows = append(kvRows, r)
			}
		}
		if len(kvRows) == 0 {
			return fmt.Errorf("%w: layer %d would lose all its KV head groups", ErrOptions, l)
		}
		a := spec.Attn
		for _, p := range []struct {
			name string
			rows []int
			full int
		}{{a.Q, qRows, nh * hd}, {a.K, kvRows, nkv * hd}, {a.V, kvRows, nkv * hd}, {a.QBias, qRows, nh * hd}, {a.KBias, kvRows, nkv * hd}, {a.VBias, kvRows, nkv * hd}} {
			if p.name == "" {
				continue
			}
			v, shape, err := w.f32(p.name)
			if err != nil {
				return err
			}
			cols := 1
			if len(shape) == 2 {
				cols = shape[1]
			}
			if shape[0] != p.full || len(v) != p.full*cols {
				return fmt.Errorf("%w: tensor %q: shape %v, want %d rows", ErrConfig, p.name, shape, p.full)
			}
			out := make([]float32, 0, len(p.rows)*cols)
			for _, r := range p.rows {
				out = append(out, v[r*cols:(r+1)*cols]...)
			}
			ns := []int{len(p.rows)}
			if len(shape) == 2 {
				ns = append(ns, cols)
			}
			w.set(p.name, ns, out)
		}
		o, shape, err := w.f32(a.O)
		if err != nil {
			return err
		}
		if len(shape) != 2 || shape[0] != H || shape[1] != nh*hd {
			return fmt.Errorf("%w: tensor %q: shape %v, want [%d %d]", ErrConfig, a.O, shape, H, nh*hd)
		}
		out := make([]float32, 0, H*len(qRows))
		for r := 0; r < H; r++ {
			for _, c := range qRows {
				out = append(out, o[r*nh*hd+c])
			}
		}
		w.set(a.O, []int{H, len(qRows)}, out)
		spec.NumHeads, spec.NumKVHeads = len(qRows)/hd, len(kvRows)/hd
	}
	return nil
}
