package kveval

import (
	"slices"
	"strconv"
	"strings"

	"github.com/lmpack/lmpack/eval"
	"github.com/lmpack/lmpack/internal/field"
	"github.com/lmpack/lmpack/runtime/kvcache"
)

// Validate checks opt's values: Ctx >= 2 and MaxWindows >= 0 (as
// eval.PerplexityOptions); Methods a non-empty list of kvcache.Methods,
// none twice; Rotations given exactly when a kind that takes them
// (kvcache.NeedsRotations: oscar2, oscar2-g32, oscar4, oscar-mixed) is listed;
// Protocol "" or one of eval.ProtocolDecode, eval.ProtocolFakeQuant;
// Prompt in [0, Ctx−2] (at least one position is scored) and Chunk >= 1,
// and with fake-quant Prompt 0, Chunk 1 and no Windows; ServingCtx >= 0;
// Sink and Recent >= 0 and only with Windows. Windows that cover the
// whole context are allowed: their rows are marked "nothing quantised".
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
	rot := false
	for m := range seen {
		rot = rot || kvcache.NeedsRotations(m)
	}
	fake := opt.Protocol == eval.ProtocolFakeQuant
	switch {
	case rot && opt.Rotations == "":
		return field.New("Rotations", nil, "an OSCAR rotation file for the oscar kinds in {Methods} (lmpack calibrate, then lmpack quantize kv)")
	case !rot && opt.Rotations != "":
		return field.New("Rotations", opt.Rotations, "an oscar kind (oscar2, oscar2-g32, oscar4, oscar-mixed) in {Methods} (only they take rotations)")
	case opt.Protocol != "" && opt.Protocol != eval.ProtocolDecode && !fake:
		return field.New("Protocol", opt.Protocol, eval.ProtocolDecode+" or "+eval.ProtocolFakeQuant)
	case !fake && opt.Ctx < 3:
		return field.New("Ctx", opt.Ctx, ">= 3 under the decode protocol (the scored positions are 0 … {Ctx} − 2, and position 0 reads no cached token: at least one must)")
	case opt.Prompt < 0 || opt.Prompt > opt.Ctx-2:
		return field.New("Prompt", opt.Prompt, "in [0, {Ctx} − 2 = "+strconv.Itoa(opt.Ctx-2)+"] (the prompt's positions are not scored; at least one must be)")
	case opt.Chunk < 1:
		return field.New("Chunk", opt.Chunk, ">= 1 tokens per decode call")
	case !fake && opt.Prompt == 0 && opt.Chunk >= opt.Ctx-1:
		return field.New("Chunk", opt.Chunk, "< {Ctx} − 1 = "+strconv.Itoa(opt.Ctx-1)+" without a prompt (one call would hold every scored position of a window, and a call reads its own tokens exact: nothing would be read quantised)")
	case fake && opt.Prompt != 0:
		return field.New("Prompt", opt.Prompt, "0 with {Protocol} fake-quant (each window goes through the cache in one call)")
	case fake && opt.Chunk != 1:
		return field.New("Chunk", opt.Chunk, "1 (the default) with {Protocol} fake-quant (each window goes through the cache in one call)")
	case opt.ServingCtx < 0:
		return field.New("ServingCtx", opt.ServingCtx, ">= 0 tokens (0: not reported)")
	case opt.Sink < 0 || opt.Recent < 0:
		return field.New("Sink", strconv.Itoa(opt.Sink)+","+strconv.Itoa(opt.Recent), "two non-negative token counts")
	case !opt.Windows && (opt.Sink != 0 || opt.Recent != 0):
		return field.New("Sink", nil, "{Windows} set (the windows add rows to the comparison)")
	case fake && opt.Windows:
		return field.New("Windows", strconv.Itoa(opt.Sink)+","+strconv.Itoa(opt.Recent), "no fp16 windows with {Protocol} fake-quant (KVQuant's protocol quantises every token)")
	}
	return nil
}
