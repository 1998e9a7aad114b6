package compress

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/tokenizer"
	"github.com/lmpack/lmpack/internal/field"
	"github.com/lmpack/lmpack/internal/fsx"
	"github.com/lmpack/lmpack/model"
	"github.com/lmpack/lmpack/prune"
)

// inputs resolves the model and data files and fingerprints them.
func (p *pipeline) inputs(ctx context.Context) error {
	dir, err := model.Resolve(ctx, p.opt.Model, nil)
	if err != nil {
		return fmt.Errorf("compress: %w", err)
	}
	// model.OpenDir: a directory without config.json is "not a model
	// directory", as for the other commands.
	_, ck, err := model.OpenDir(dir)
	if err != nil {
		return fmt.Errorf("compress: %w", err)
	}
	defer ck.Close()
	if p.srcFP, err = model.Fingerprint(dir, ck); err != nil {
		return fmt.Errorf("compress: %w", err)
	}
	p.srcDir = dir
	p.st.model = dir
	recipe := cmpOr(p.opt.RecipePath, "the recipe")
	// Settings that only fit some models are checked before any stage
	// runs, so a mistake costs no calibration.
	wantsWidth := p.r.Prune != nil && p.r.Prune.wantsWidth()
	{
		d, err := arch.Load(dir)
		if err != nil {
			return fmt.Errorf("compress: %w", err)
		}
		p.desc = d
		p.r = p.r.withModelDefaults(d)
		if err := p.r.checkModel(recipe, d); err != nil {
			return err
		}
		q := p.r.Quantize
		if wantsWidth {
			// On the model as the prune-layers stage leaves it, as far as
			// that is known before it runs (afterDepth).
			o := p.r.Prune.widthOptions()
			if err := o.ValidateModel(afterDepth(p.r.Prune, d)); err != nil {
				return fmt.Errorf("%w: %s: %s: %w", ErrRecipe, recipe, dir, field.Rename(err, pruneKeys))
			}
			// A sparsity on the model as it is (no layer removal first):
			// its budget, and whether it removes any head for head_refit.
			if c := p.r.Prune; c.Sparsity != 0 && !c.wantsDepth() {
				plan, err := prune.PlanSparsity(dir, c.Sparsity)
				if err != nil {
					return fmt.Errorf("%w: %s: prune.sparsity: %w", ErrRecipe, recipe, err)
				}
				if c.HeadRefit && plan.HeadGroups == 0 {
					return fmt.Errorf("%w: %s: prune.head_refit: prune.sparsity %v removes no KV head group of %s (only FFN nodes), so there is no o_proj to refit: remove head_refit or raise the sparsity", ErrRecipe, recipe, c.Sparsity, dir)
				}
			}
		}
		if q != nil && q.Weights != nil {
			o := q.Weights.options()
			if err := o.ValidateModel(d); err != nil {
				return fmt.Errorf("%w: %s: %s: %w", ErrRecipe, recipe, dir, field.Rename(err, weightsKeys))
			}
		}
	}
	// dataErr names where a data path came from: the override option or
	// the recipe's key.
	dataErr := func(override, key, path string, err error) error {
		if override != "" {
			return fmt.Errorf("compress: data file %s: %w", path, err)
		}
		return fmt.Errorf("%w: %s: %s %s: %v", ErrRecipe, recipe, key, path, err)
	}
	if c := p.r.Calibrate; c != nil {
		p.data = cmpOr(p.opt.Data, c.Data)
		if p.data == "" {
			return fmt.Errorf("%w: %s: the calibrate stage needs a data file (set calibrate.data in %s, or pass --data)", ErrRecipe, recipe, recipe)
		}
		if p.dataFP, err = fileFingerprint(p.data); err != nil {
			return dataErr(p.opt.Data, "calibrate.data", p.data, err)
		}
	}
	if e := p.r.Eval; e != nil {
		p.evalData = cmpOr(p.opt.EvalData, e.Data)
		if p.evalData == "" {
			return fmt.Errorf("%w: %s: the eval stage needs a data file (set eval.data in %s, or pass --eval-data)", ErrRecipe, recipe, recipe)
		}
		if p.evalFP, err = fileFingerprint(p.evalData); err != nil {
			return dataErr(p.opt.EvalData, "eval.data", p.evalData, err)
		}
	}
	return p.checkDataLengths(recipe, dataErr)
}

// withModelDefaults returns r with what it leaves to the model filled in
// for the model d: calibrate.ctx and eval.ctx 0 become
// arch.DefaultContext(d), min(512, max_position_embeddings). r itself is
// not changed (the sections that change are copied).
func (r *Recipe) withModelDefaults(d *arch.Description) *Recipe {
	out := *r
	if c := r.Calibrate; c != nil && c.Ctx == 0 {
		cc := *c
		cc.Ctx = arch.DefaultContext(d)
		out.Calibrate = &cc
	}
	if e := r.Eval; e != nil && e.Ctx == 0 {
		ec := *e
		ec.Ctx = arch.DefaultContext(d)
		out.Eval = &ec
	}
	return &out
}

// checkDataLengths tokenizes the data files as calibrate and eval do (the
// source model's tokenizer, BOS prepended) and refuses, before any stage
// runs, a calibration file shorter than calibrate.tokens and an eval file
// shorter than eval.ctx × eval.max_windows tokens (one window without
// max_windows). dataErr words the error for the option or key the path
// came from.
func (p *pipeline) checkDataLengths(recipe string, dataErr func(override, key, path string, err error) error) error {
	if p.data == "" && p.evalData == "" {
		return nil
	}
	tok, err := tokenizer.Load(p.srcDir)
	if err != nil {
		return fmt.Errorf("compress: %s: %w", p.srcDir, err)
	}
	count := func(path string) (int, error) {
		text, err := fsx.ReadText(path)
		if err != nil {
			return 0, err
		}
		ids := tok.Encode(text, true)
		bos, ok := tok.BOS()
		if !ok && p.desc.BOSTokenID >= 0 {
			bos, ok = p.desc.BOSTokenID, true
		}
		if ok && (len(ids) == 0 || ids[0] != bos) {
			return len(ids) + 1, nil
		}
		return len(ids), nil
	}
	if c := p.r.Calibrate; c != nil {
		n, err := count(p.data)
		if err != nil {
			return dataErr(p.opt.Data, "calibrate.data", p.data, err)
		}
		if n < c.Tokens {
			return dataErr(p.opt.Data, "calibrate.data", p.data, fmt.Errorf("%d tokens, fewer than calibrate.tokens %d (use a longer file or fewer tokens)", n, c.Tokens))
		}
	}
	if e := p.r.Eval; e != nil {
		n, err := count(p.evalData)
		if err != nil {
			return dataErr(p.opt.EvalData, "eval.data", p.evalData, err)
		}
		w := max(e.MaxWindows, 1)
		if n < e.Ctx*w {
			what := fmt.Sprintf("eval.ctx %d", e.Ctx)
			if e.MaxWindows > 0 {
				what = fmt.Sprintf("eval.ctx %d × eval.max_windows %d = %d", e.Ctx, e.MaxWindows, e.Ctx*w)
			}
			return dataErr(p.opt.EvalData, "eval.data", p.evalData, fmt.Errorf("%d tokens, fewer than %s (use a longer file, a shorter ctx or fewer windows)", n, what))
		}
	}
	return nil
}

// checkPaths refuses an output that is an input file and a work
// directory or output inside the source model directory (inputs are never
// modified).
func (p *pipeline) checkPaths() error {
	outSt, err := os.Stat(p.opt.Out)
	for _, in := range []string{p.data, p.evalData} {
		if in == "" || err != nil {
			continue
		}
		if inSt, ierr := os.Stat(in); ierr == nil && os.SameFile(inSt, outSt) {
			return fmt.Errorf("compress: output %s is the input %s; refusing to overwrite an input", p.opt.Out, in)
		}
	}
	model, err := fsx.RealAbs(p.srcDir)
	if err != nil {
		return fmt.Errorf("compress: %w", err)
	}
	for _, x := range []struct{ what, path string }{{"work dir", p.opt.WorkDir}, {"output", filepath.Dir(p.opt.Out)}} {
		a, err := fsx.RealAbs(x.path)
		if err != nil {
			return fmt.Errorf("compress: %s: %w", x.what, err)
		}
		if a == model || strings.HasPrefix(a, model+string(filepath.Separator)) {
			return fmt.Errorf("compress: %s %s is inside the model directory %s; write elsewhere (inputs are never modified)", x.what, x.path, p.srcDir)
		}
	}
	return nil
}

// fileFingerprint is the hex sha256 of a regular file's bytes.
func fileFingerprint(path string) (string, error) {
	b, err := fsx.ReadFile(path)
	if err != nil {
		return "", err
	}
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:]), nil
}
