package oscar

import (
	"fmt"
	"math"

	"github.com/lmpack/lmpack/internal/field"
)

// Validate checks opt's values without opening anything: Method empty or
// Method ("oscar"), ClipK and ClipV ratios in (0, 1], ClipK4 … ClipV8 0
// or in (0, 1], KVBits 0 or in [2, 16], ServingCtx, Sink, Recent,
// SearchTokens ≥ 0, ServingCtx above Sink+Recent when given (and with
// KVBits, DefaultServingCtx above them when not), Calib and Out given.
//
// Errors: a *field.Error naming the Go field (cmd/lmpack and compress
// rename it to their flag or recipe key). Windows that do not fit the
// serving context name ServingCtx when it is given, else the window
// (Sink when it alone reaches DefaultServingCtx, else Recent).
func (opt *KVOptions) Validate() error {
	ratio := func(v float64) bool { return v > 0 && v <= 1 && !math.IsNaN(v) }
	switch {
	case opt.Method != "" && opt.Method != Method:
		return field.New("Method", opt.Method, `"`+Method+`"`)
	case !ratio(opt.ClipK):
		return field.New("ClipK", opt.ClipK, "a ratio in (0, 1]")
	case !ratio(opt.ClipV):
		return field.New("ClipV", opt.ClipV, "a ratio in (0, 1]")
	case !(opt.ClipK4 == 0 || ratio(opt.ClipK4)):
		return field.New("ClipK4", opt.ClipK4, "0 (no clipping) or a ratio in (0, 1]")
	case !(opt.ClipV4 == 0 || ratio(opt.ClipV4)):
		return field.New("ClipV4", opt.ClipV4, "0 (no clipping) or a ratio in (0, 1]")
	case !(opt.ClipK8 == 0 || ratio(opt.ClipK8)):
		return field.New("ClipK8", opt.ClipK8, "0 (no clipping) or a ratio in (0, 1]")
	case !(opt.ClipV8 == 0 || ratio(opt.ClipV8)):
		return field.New("ClipV8", opt.ClipV8, "0 (no clipping) or a ratio in (0, 1]")
	case !(opt.KVBits == 0 || opt.KVBits >= 2 && opt.KVBits <= 16):
		return field.New("KVBits", opt.KVBits, "0 (uniform widths) or average bits per element in [2, 16]")
	case opt.ServingCtx < 0:
		return field.New("ServingCtx", opt.ServingCtx, "a context in tokens ≥ 0 (0: 32768)")
	case opt.Sink < 0:
		return field.New("Sink", opt.Sink, "a window in tokens ≥ 0")
	case opt.Recent < 0:
		return field.New("Recent", opt.Recent, "a window in tokens ≥ 0")
	case opt.ServingCtx > 0 && opt.ServingCtx <= opt.Sink+opt.Recent:
		return field.New("ServingCtx", opt.ServingCtx, fmt.Sprintf("a context above the fp16 windows' {Sink} %d + {Recent} %d = %d tokens (the context at which {KVBits} counts bits per element)", opt.Sink, opt.Recent, opt.Sink+opt.Recent))
	case opt.KVBits > 0 && opt.ServingCtx == 0 && opt.Sink >= DefaultServingCtx:
		return field.New("Sink", opt.Sink, fmt.Sprintf("a window below the default serving context %d (no {ServingCtx}), at which {KVBits} counts bits per element (or give a longer {ServingCtx})", DefaultServingCtx))
	case opt.KVBits > 0 && opt.ServingCtx == 0 && opt.Sink+opt.Recent >= DefaultServingCtx:
		return field.New("Recent", opt.Recent, fmt.Sprintf("a window below %d tokens: the default serving context %d (no {ServingCtx}), at which {KVBits} counts bits per element, less {Sink} %d (or give a longer {ServingCtx})", DefaultServingCtx-opt.Sink, DefaultServingCtx, opt.Sink))
	case opt.SearchTokens < 0:
		return field.New("SearchTokens", opt.SearchTokens, "a number of calibration tokens ≥ 0 (0: 2048)")
	case opt.Calib == "":
		return field.New("Calib", nil, "a calibration file (lmpack calibrate) of the model")
	case opt.Out == "":
		return field.New("Out", nil, "the rotation file to write")
	}
	return nil
}
