package prune

// widthProgress counts the steps of width pruning for Options.Progress:
// one per Putri masked-perplexity run (the unmasked one included), one per
// layer whose o_proj is refit, one per FFN layer. The total is what is
// done plus what each phase still expects: exact for the FFN and refit
// phases and for the current Putri round, an upper bound for later Putri
// rounds (a round has at most step fewer candidates than the one before),
// so it can shrink as Putri proceeds but never falls below done.
type widthProgress struct {
	fn                      func(done, total int)
	done                    int
	putri, refit, ffnLayers int // steps each phase still expects
}

// report calls fn with the current counts (nothing when fn is nil).
func (p *widthProgress) report() {
	if p != nil && p.fn != nil {
		p.fn(p.done, p.done+p.putri+p.refit+p.ffnLayers)
	}
}

// step counts one finished step of the phase whose expected count is left.
func (p *widthProgress) step(left *int) {
	if p == nil {
		return
	}
	p.done++
	*left = max(*left-1, 0)
	p.report()
}

// putriSteps bounds the masked-perplexity runs of Putri's rounds when the
// current round has cands candidates and n groups remain to be removed,
// step per round: cands + (cands−step) + ... over ceil(n/step) rounds.
func putriSteps(cands, n, step int) int {
	step = max(step, 1)
	total := 0
	for r := 0; r*step < n && cands > 0; r++ {
		total += cands
		cands -= step
	}
	return total
}
