package compress

import (
	"context"
	"path/filepath"

	"github.com/lmpack/lmpack/calibrate"
)

// calibrateStage is the calibrate stage: its cache key is the calibrate
// section (data path and expert-memory budget excluded: the data file's
// fingerprint is part of every key, and the budget does not change the
// file).
func (p *pipeline) calibrateStage() stage {
	return stage{name: "calibrate", params: section(p.r.Calibrate), run: p.calibrate}
}

// maxExpertBytes is c's expert-statistics budget in bytes.
func (c *CalibrateStage) maxExpertBytes() int64 {
	if c.MaxExpertMemory == nil {
		return calibrate.DefaultMaxExpertBytes
	}
	return *c.MaxExpertMemory
}

// calibrate runs calibrate.Run on the current model.
func (p *pipeline) calibrate(ctx context.Context, dir string) (outputs, any, error) {
	c := p.r.Calibrate
	s, err := calibrate.Run(ctx, calibrate.Options{Model: p.st.model, Data: p.data, Tokens: c.Tokens, Ctx: c.Ctx,
		Out: filepath.Join(dir, "calib.safetensors"), Threads: p.opt.Threads, MaxExpertBytes: c.maxExpertBytes(), Version: p.opt.Version, Progress: p.progress("calibrate")})
	if err != nil {
		return outputs{}, nil, err
	}
	s.Path = "calib.safetensors"
	return outputs{Calib: "calib.safetensors"}, s, nil
}

// recalibrate calibrates the current model with the recipe's calibrate
// settings into dir/calib.safetensors (a stage that needs statistics of
// a model an earlier stage changed) and returns the file's path and
// summary; progress is reported under the stage label name.
func (p *pipeline) recalibrate(ctx context.Context, dir, name string) (string, *calibrate.Summary, error) {
	c := p.r.Calibrate
	calib := filepath.Join(dir, "calib.safetensors")
	cs, err := calibrate.Run(ctx, calibrate.Options{Model: p.st.model, Data: p.data, Tokens: c.Tokens, Ctx: c.Ctx,
		Out: calib, Threads: p.opt.Threads, MaxExpertBytes: c.maxExpertBytes(), Version: p.opt.Version, Progress: p.progress(name)})
	if err != nil {
		return "", nil, err
	}
	cs.Path = "calib.safetensors"
	return calib, cs, nil
}
