package kveval

import (
	"slices"
	"strconv"
	"strings"

	"github.com/lmpack/lmpack/internal/field"
	"github.com/lmpack/lmpack/runtime/kvcache"
)

// Validate checks opt's values: Ctx >= 2 and MaxWindows >= 0 (as
// eval.PerplexityOptions); Methods a non-empty list of kvcache.Methods,
// none twice; Rotations given exactly when oscar2 or oscar4 is listed;
// Sink and Recent >= 0 and only with Windows, and then fewer than Ctx
// tokens together (something must be quantized).
//
// Errors: a *field.Error naming the Go field (cmd/lmpack renames it to
// its flag).
func (opt *Options) Validate() error {
	switch {
	case opt.Ctx < 2:
		return field.New("Ctx", opt.Ctx, ">= 2")
	case opt.MaxWindows < 0:
		return field.New("MaxWindows", opt.MaxWindows, ">= 0 (0: all)")
	case len(opt.Methods) == 0:
		return field.New("Methods", nil, "a list of KV cache methods: "+strings.Join(kvcache.Methods(), ", "))
	}
	seen := map[string]bool{}
	for _, m := range opt.Methods {
		switch {
		case !slices.Contains(kvcache.Methods(), m):
			return field.New("Methods", m, "known methods: "+strings.Join(kvcache.Methods(), ", "))
		case seen[m]:
			return field.New("Methods", m, "each method once (listed twice)")
		}
		seen[m] = true
	}
	rot := seen["oscar2"] || seen["oscar4"] || seen["oscar-mixed"]
	switch {
	case rot && opt.Rotations == "":
		return field.New("Rotations", nil, "an OSCAR rotation file for oscar2/oscar4 in {Methods} (lmpack calibrate, then lmpack quantize kv)")
	case !rot && opt.Rotations != "":
		return field.New("Rotations", opt.Rotations, "oscar2 or oscar4 in {Methods} (only they take rotations)")
	case opt.Sink < 0 || opt.Recent < 0:
		return field.New("Sink", strconv.Itoa(opt.Sink)+","+strconv.Itoa(opt.Recent), "two non-negative token counts")
	case !opt.Windows && (opt.Sink != 0 || opt.Recent != 0):
		return field.New("Sink", nil, "{Windows} set (the windows add rows to the comparison)")
	case opt.Windows && opt.Sink+opt.Recent >= opt.Ctx:
		return field.New("Sink", strconv.Itoa(opt.Sink)+","+strconv.Itoa(opt.Recent), "fewer than {Ctx} "+strconv.Itoa(opt.Ctx)+" tokens together (the windows cover every token, so nothing would be quantized)")
	}
	return nil
}
