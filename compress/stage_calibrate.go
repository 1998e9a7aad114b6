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

// calibrateKeys names calibrate.Options' fields as recipe keys
// (field.Rename of its Validate errors).
var calibrateKeys = map[string]string{
	"Data": "calibrate.data", "Tokens": "calibrate.tokens", "Ctx": "calibrate.ctx", "MaxExpertBytes": "calibrate.max_expert_memory",
	"AllExperts": "calibrate.all_experts", "MinExpertTokens": "calibrate.min_expert_tokens",
}

// options is the calibrate.Options of the section, reading data and
// writing out (Threads, Version and Progress are the pipeline's).
func (c *CalibrateStage) options(data, out string) calibrate.Options {
	return calibrate.Options{Data: data, Tokens: c.Tokens, Ctx: c.Ctx, Out: out, MaxExpertBytes: c.maxExpertBytes(),
		AllExperts: c.AllExperts, MinExpertTokens: c.MinExpertTokens}
}

// calibrate runs calibrate.Run on the current model.
func (p *pipeline) calibrate(ctx context.Context, dir string) (outputs, any, error) {
	c := p.r.Calibrate
	o := c.options(p.data, filepath.Join(dir, "calib.safetensors"))
	o.Model, o.Threads, o.Version, o.Progress = p.st.model, p.opt.Threads, p.opt.Version, p.progress("calibrate")
	s, err := calibrate.Run(ctx, o)
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
	o := c.options(p.data, calib)
	o.Model, o.Threads, o.Version, o.Progress = p.st.model, p.opt.Threads, p.opt.Version, p.progress(name)
	cs, err := calibrate.Run(ctx, o)
	if err != nil {
		return "", nil, err
	}
	cs.Path = "calib.safetensors"
	return calib, cs, nil
}
