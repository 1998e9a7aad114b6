package oscar

import (
	"math"

	"github.com/lmpack/lmpack/internal/field"
)

// Validate checks opt's values without opening anything: Method empty or
// Method ("oscar"), ClipK and ClipV ratios in (0, 1], Calib and Out
// given.
//
// Errors: a *field.Error naming the Go field (cmd/lmpack and compress
// rename it to their flag or recipe key).
func (opt *KVOptions) Validate() error {
	ratio := func(v float64) bool { return v > 0 && v <= 1 && !math.IsNaN(v) }
	switch {
	case opt.Method != "" && opt.Method != Method:
		return field.New("Method", opt.Method, `"`+Method+`"`)
	case !ratio(opt.ClipK):
		return field.New("ClipK", opt.ClipK, "a ratio in (0, 1]")
	case !ratio(opt.ClipV):
		return field.New("ClipV", opt.ClipV, "a ratio in (0, 1]")
	case opt.Calib == "":
		return field.New("Calib", nil, "a calibration file (lmpack calibrate) of the model")
	case opt.Out == "":
		return field.New("Out", nil, "the rotation file to write")
	}
	return nil
}
