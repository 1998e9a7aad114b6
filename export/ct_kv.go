package export

import (
	"context"
	"fmt"
	"math"

	"github.com/lmpack/lmpack/calibrate"
	"github.com/lmpack/lmpack/model"
	"github.com/lmpack/lmpack/runtime"
)

// FP8E4M3Max is the largest finite float8 E4M3 value; an FP8 KV scale s
// maps [−448·s, 448·s] onto the FP8 range.
const FP8E4M3Max = 448

// kvResult holds the per-layer FP8 KV scales and how they were obtained.
type kvResult struct {
	k, v   []float32 // [layers]
	stat   string    // the statistic used
	reason string    // report row reason
	note   string    // report warning
}

// kvMax observes the post-RoPE keys (after q/k norm) and values of every
// layer and keeps max |k| and max |v| (float64).
type kvMax struct {
	k, v []float64
}

func (o *kvMax) QKV(layer, pos, n int, q, k, v []float32) {
	for _, x := range k {
		o.k[layer] = math.Max(o.k[layer], math.Abs(float64(x)))
	}
	for _, x := range v {
		o.v[layer] = math.Max(o.v[layer], math.Abs(float64(x)))
	}
}

// kvScales computes the FP8 (E4M3) per-tensor KV scales of every layer
// from the calibration file opt.KVCalib: scale = max|K| / FP8E4M3Max (and
// likewise for V) per layer, max over the file's calibration token ids
// (calibrate.StatTokens) replayed through the model being exported, in
// the windows of the file's ctx, each window from position 0. The
// calibration file holds no maximum: its other statistics (OSCAR's C_Q,
// a query covariance, and C_S, a weighted value covariance) are second
// moments, which bound no maximum, so the maxima are measured again on
// the same tokens; they are exact maxima over those tokens (the keys the
// runtime computes, the quantized weights' own), not bounds for other
// text: vLLM saturates larger values to ±448·scale. The file must match
// the model's layers, head_dim and vocab (model.Expect.Desc); its
// fingerprint is not required to match, so that a calibration file of the
// float model serves its quantized export (the keys are recomputed
// anyway). A layer whose keys or values are all zero gets scale 1.
//
// Errors: calibrate.Read's (naming the file); a file without token ids;
// the model's load and forward errors.
func kvScales(ctx context.Context, s *ctSource, opt CTOptions) (*kvResult, error) {
	c, err := calibrate.Read(opt.KVCalib, model.Expect{Desc: s.desc})
	if err != nil {
		return nil, fmt.Errorf("export: KV scales: %w", err)
	}
	windows := c.CalibrationWindows()
	if len(windows) == 0 {
		return nil, fmt.Errorf("export: KV scales: %s holds no calibration token ids (statistic %q; statistics %v): rerun lmpack calibrate", opt.KVCalib, calibrate.StatTokens, c.Header.Statistics)
	}
	m, err := runtime.NewCPU().Load(ctx, s.desc, s.src, runtime.LoadOptions{Threads: opt.Threads})
	if err != nil {
		return nil, fmt.Errorf("export: KV scales: %w", err)
	}
	defer m.Close()
	nl := len(s.desc.Layers)
	obs := &kvMax{k: make([]float64, nl), v: make([]float64, nl)}
	m.SetObserver(obs)
	defer m.SetObserver(nil)
	longest := 0
	for _, w := range windows {
		longest = max(longest, len(w))
	}
	cache := m.NewCache(longest)
	logits := make([]float32, s.desc.VocabSize)
	T := 0
	for _, w := range windows {
		cache.Truncate(0)
		if err := m.Forward(ctx, w, cache, logits, false); err != nil {
			return nil, fmt.Errorf("export: KV scales: %w", err)
		}
		T += len(w)
	}
	r := &kvResult{k: make([]float32, nl), v: make([]float32, nl), stat: "max|K|, max|V|"}
	sc := func(mx float64) float32 {
		if mx == 0 {
			return 1
		}
		return float32(mx / FP8E4M3Max)
	}
	for l := range nl {
		r.k[l], r.v[l] = sc(obs.k[l]), sc(obs.v[l])
	}
	r.reason = fmt.Sprintf("max over the %d calibration tokens of %s (in %d windows of up to %d), divided by %d", T, opt.KVCalib, len(windows), c.Header.Ctx, FP8E4M3Max)
	r.note = fmt.Sprintf("FP8 KV scales: %s holds no key/value maximum (its OSCAR statistics are second moments, which bound no maximum), so max|K| and max|V| per layer were measured by running this model on its %d calibration token ids; values beyond them saturate in vLLM's FP8 cache", opt.KVCalib, T)
	return r, nil
}
