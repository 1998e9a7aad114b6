package compress

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/internal/field"
	"github.com/lmpack/lmpack/internal/fsx"
	"github.com/lmpack/lmpack/prune"
	"github.com/lmpack/lmpack/prune/depth"
	"github.com/lmpack/lmpack/quantize/oscar"
	"github.com/lmpack/lmpack/runtime/kvcache"
	"gopkg.in/yaml.v3"
)

// Sentinel errors callers branch on.
var (
	// ErrRecipe: the recipe does not parse, has an unknown key or an
	// invalid value (wrapped, naming the file, the line when known, and
	// the key).
	ErrRecipe = errors.New("compress: bad recipe")
	// ErrGate: the eval stage measured a ΔPPL or KL above the recipe's
	// threshold; the artifact is not written to the output path.
	ErrGate = errors.New("compress: eval gate failed")
)

// Recipe is a compress recipe (YAML, strict: unknown keys are ErrRecipe).
// A nil section disables its stage; pack always runs.
type Recipe struct {
	// Name labels the recipe in logs and the report.
	Name      string          `yaml:"name" json:"name,omitempty"`
	Calibrate *CalibrateStage `yaml:"calibrate" json:"calibrate,omitempty"`
	Prune     *PruneStage     `yaml:"prune" json:"prune,omitempty"`
	Quantize  *QuantizeStage  `yaml:"quantize" json:"quantize,omitempty"`
	Pack      PackStage       `yaml:"pack" json:"pack"`
	Eval      *EvalStage      `yaml:"eval" json:"eval,omitempty"`
}

// CalibrateStage configures calibrate.Run: the first Tokens tokens of the
// UTF-8 text file Data (relative to the recipe's directory; Options.Data
// overrides it) in windows of Ctx tokens.
type CalibrateStage struct {
	Data   string `yaml:"data" json:"-"`
	Tokens int    `yaml:"tokens" json:"tokens"`
	Ctx    int    `yaml:"ctx" json:"ctx"`
	// MaxExpertMemory (MoE models) bounds the expert statistics' memory in
	// bytes (calibrate.Options.MaxExpertBytes); nil means
	// calibrate.DefaultMaxExpertBytes (8 GiB), 0 no limit. The file is the
	// same whatever the budget, so it is not part of the stage's cache key.
	MaxExpertMemory *int64 `yaml:"max_expert_memory" json:"-"`
	// AllExperts (MoE models) accumulates every token into every expert's
	// Hessians (calibrate.Options.AllExperts, --calibrate-all-experts).
	AllExperts bool `yaml:"all_experts" json:"all_experts,omitempty"`
	// MinExpertTokens is the sparse-expert report threshold
	// (calibrate.Options.MinExpertTokens, --min-expert-tokens; unset:
	// calibrate.DefaultMinExpertTokens).
	MinExpertTokens int `yaml:"min_expert_tokens" json:"min_expert_tokens,omitempty"`
}

// PruneStage configures prune.Run. Layer removal (depth): remove Layers
// blocks, or round(LayerRatio·L), chosen by Method ("lorp", "shortgpt",
// "list:3,7"; default lorp). Width pruning (Putri, docs/METHODS.md §6;
// dense models only): remove HeadGroups GQA groups (one KV head and its
// query heads) over all layers, or round(HeadRatio·groups), scored by
// HeadMethod ("putri", default, or "proxy"), and round(FFNRatio·F)
// intermediate units of every FFN, with down_proj refit by least squares
// unless Refit is false (default true); HeadRefit (default false) refits
// o_proj of the layers that lose head groups (prune.Options.HeadRefit). A
// recipe asking for both runs
// them as two stages, prune-layers then prune-width, the second on a
// calibration of the layer-pruned model.
type PruneStage struct {
	Layers     int     `yaml:"layers" json:"layers,omitempty"`
	LayerRatio float64 `yaml:"layer_ratio" json:"layer_ratio,omitempty"`
	Method     string  `yaml:"method" json:"method,omitempty"`
	HeadGroups int     `yaml:"head_groups" json:"head_groups,omitempty"`
	HeadRatio  float64 `yaml:"head_ratio" json:"head_ratio,omitempty"`
	HeadMethod string  `yaml:"head_method" json:"head_method,omitempty"`
	FFNRatio   float64 `yaml:"ffn_ratio" json:"ffn_ratio,omitempty"`
	Refit      *bool   `yaml:"refit" json:"refit,omitempty"`
	// HeadStep is the number of head groups Putri removes per round
	// (default 1); Sparsity (in (0, 1)) instead sets head groups and FFN
	// units from Putri's budget split (prune.Options.Sparsity).
	HeadStep  int     `yaml:"head_step" json:"head_step,omitempty"`
	Sparsity  float64 `yaml:"sparsity" json:"sparsity,omitempty"`
	HeadRefit bool    `yaml:"head_refit" json:"head_refit,omitempty"`
}

// wantsDepth reports whether the section removes layers.
func (p *PruneStage) wantsDepth() bool {
	return p.Layers != 0 || p.LayerRatio != 0 || strings.HasPrefix(p.Method, "list:")
}

// wantsWidth reports whether the section prunes head groups or FFN units.
func (p *PruneStage) wantsWidth() bool {
	return p.HeadGroups != 0 || p.HeadRatio != 0 || p.FFNRatio != 0 || p.Sparsity != 0
}

// wantsHeads reports whether the section prunes head groups.
func (p *PruneStage) wantsHeads() bool {
	return p.HeadGroups != 0 || p.HeadRatio != 0 || p.Sparsity != 0
}

// QuantizeStage holds the quantization stages: Weights runs before KV,
// so the KV rotations are computed on the quantized model.
type QuantizeStage struct {
	Weights *WeightsStage `yaml:"weights" json:"weights,omitempty"`
	KV      *KVStage      `yaml:"kv" json:"kv,omitempty"`
}

// WeightsStage configures quantize/wquant.Run (docs/QUANT.md): Method
// "rtn" or "gptq" (Frantar et al. 2023, GPTQ, Alg. 1; docs/METHODS.md)
// quantizes every Linear weight of the decoder blocks to Bits (2, 3, 4 or
// 8) with one scale and zero-point per Group input columns (32, 64, 128;
// 0 = per-channel; default 128), symmetric (no stored zero-points) when
// Sym. ActOrder (GPTQ only) quantizes columns by decreasing Hessian
// diagonal. TargetBPW > 0 instead lets wquant's allocator choose (bits,
// group) per tensor so the quantized weights take at most TargetBPW
// storage bits per weight (codes, scales, zero-points); give exactly one
// of Bits and TargetBPW, and no Group with TargetBPW.
//
// MoEBudget > 0 (MoE models, with Bits for every other weight) lets GEMQ
// (docs/METHODS.md §4) give each routed expert a width of 1 to 4 bits so
// that the experts take at most MoEBudget storage bits per expert weight
// (wquant.Options.MoEBudget); MoEWeighting is GEMQ's forward-only
// weighting (routed, soft or kl; default routed) and MoERule asks for at
// least one expert at 4 and one at 3 bits in every MoE layer. MSEClip
// searches each group's clipping range for the least squared error.
type WeightsStage struct {
	Method       string  `yaml:"method" json:"method"`
	Bits         int     `yaml:"bits" json:"bits,omitempty"`
	Group        *int    `yaml:"group" json:"group,omitempty"`
	Sym          bool    `yaml:"sym" json:"sym,omitempty"`
	ActOrder     bool    `yaml:"act_order" json:"act_order,omitempty"`
	TargetBPW    float64 `yaml:"target_bpw" json:"target_bpw,omitempty"`
	MoEBudget    float64 `yaml:"moe_budget" json:"moe_budget,omitempty"`
	MoEWeighting string  `yaml:"moe_weighting" json:"moe_weighting,omitempty"`
	MoERule      bool    `yaml:"moe_rule" json:"moe_rule,omitempty"`
	MSEClip      bool    `yaml:"mse_clip" json:"mse_clip,omitempty"`
	// TrueSequential (GPTQ) collects each input's Hessian with the
	// weights before it quantized (wquant.Options.TrueSequential).
	TrueSequential bool `yaml:"true_sequential" json:"true_sequential,omitempty"`
	// MoESolver (dp or lagrangian), MoEGroup (experts' group size, 0:
	// per channel) and MoEMinTokens (sparse-expert threshold, unset:
	// calibrate.DefaultMinExpertTokens) configure GEMQ under moe_budget
	// (wquant.Options).
	MoESolver    string `yaml:"moe_solver" json:"moe_solver,omitempty"`
	MoEGroup     int    `yaml:"moe_group" json:"moe_group,omitempty"`
	MoEMinTokens int    `yaml:"moe_min_tokens" json:"moe_min_tokens,omitempty"`
}

// KVStage configures the KV cache the artifact carries: Cache is a
// runtime/kvcache method (kvcache.Methods); oscar2, oscar4 and
// oscar-mixed get OSCAR rotations computed from calibration
// (oscar.QuantizeKV, docs/METHODS.md §1, whose options the other fields
// are): ClipK, ClipV the 2-bit ratios (default 0.96 and 0.92), ClipK4 …
// ClipV8 the 4- and 8-bit ones (0: none); ClipSearch picks every layer's
// ratios on the calibration tokens instead; KVBits (required by, and only
// taken with, oscar-mixed) chooses every layer's K and V width in {2, 4,
// 8} within that many bits per element at ServingCtx tokens (0: 32768);
// SearchTokens caps the calibration tokens those measurements run (0:
// 2048). Sink and Recent are fp16 windows in tokens (0: none, or the
// method's default residual); the clip search and KVBits measure with
// them.
type KVStage struct {
	Cache        string  `yaml:"cache" json:"cache"`
	ClipK        float64 `yaml:"clip_k" json:"clip_k,omitempty"`
	ClipV        float64 `yaml:"clip_v" json:"clip_v,omitempty"`
	ClipK4       float64 `yaml:"clip_k4" json:"clip_k4,omitempty"`
	ClipV4       float64 `yaml:"clip_v4" json:"clip_v4,omitempty"`
	ClipK8       float64 `yaml:"clip_k8" json:"clip_k8,omitempty"`
	ClipV8       float64 `yaml:"clip_v8" json:"clip_v8,omitempty"`
	ClipSearch   bool    `yaml:"clip_search" json:"clip_search,omitempty"`
	KVBits       float64 `yaml:"kv_bits" json:"kv_bits,omitempty"`
	ServingCtx   int     `yaml:"serving_ctx" json:"serving_ctx,omitempty"`
	SearchTokens int     `yaml:"search_tokens" json:"search_tokens,omitempty"`
	Sink         int     `yaml:"sink" json:"sink,omitempty"`
	Recent       int     `yaml:"recent" json:"recent,omitempty"`
}

// PackStage configures pack.Write: LZ4 (default true) compresses sections
// where that saves at least 10%.
type PackStage struct {
	LZ4 *bool `yaml:"lz4" json:"lz4"`
}

// EvalStage configures the final comparison of the artifact against the
// source model on the UTF-8 text file Data (relative to the recipe's
// directory; Options.EvalData overrides it): MaxWindows windows (0: all)
// of Ctx tokens (Ctx 0: min(512, max_position_embeddings) of the model).
// The artifact is fed decode-faithful: KVPrompt tokens of each window in
// one call (not scored), then KVChunk tokens per call (0: 1).
// MaxDeltaPPLPct (ΔPPL in percent of the source model's perplexity) and
// MaxKL (nats per
// token, KL(source ‖ artifact)) are the gate; 0 disables a bound.
type EvalStage struct {
	Data           string  `yaml:"data" json:"-"`
	Ctx            int     `yaml:"ctx" json:"ctx"`
	MaxWindows     int     `yaml:"max_windows" json:"max_windows,omitempty"`
	KVPrompt       int     `yaml:"kv_prompt" json:"kv_prompt,omitempty"`
	KVChunk        int     `yaml:"kv_chunk" json:"kv_chunk,omitempty"`
	MaxDeltaPPLPct float64 `yaml:"max_delta_ppl_pct" json:"-"`
	// MaxDeltaPPL is the removed absolute bound (perplexity points): a
	// recipe that gives it is refused with the way to max_delta_ppl_pct.
	MaxDeltaPPL float64 `yaml:"max_delta_ppl" json:"-"`
	MaxKL       float64 `yaml:"max_kl" json:"-"`
}

// maxRecipeBytes bounds a recipe file.
const maxRecipeBytes = 1 << 20

// LoadRecipe reads and validates the recipe file path (ParseRecipe);
// relative data paths are resolved against the file's directory.
//
// Errors: the file unreadable (naming it); ParseRecipe's.
func LoadRecipe(path string) (*Recipe, error) {
	b, err := fsx.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrRecipe, err)
	}
	r, err := ParseRecipe(path, b)
	if err != nil {
		return nil, err
	}
	dir := filepath.Dir(path)
	for _, p := range []*string{r.dataPtr(), r.evalDataPtr()} {
		if p != nil && *p != "" && !filepath.IsAbs(*p) {
			*p = filepath.Join(dir, *p)
		}
	}
	return r, nil
}

func (r *Recipe) dataPtr() *string {
	if r.Calibrate == nil {
		return nil
	}
	return &r.Calibrate.Data
}

func (r *Recipe) evalDataPtr() *string {
	if r.Eval == nil {
		return nil
	}
	return &r.Eval.Data
}

var (
	fieldNotFound = regexp.MustCompile(`^line (\d+): field (\S+) not found in type compress\.(\w+)$`)
	cannotDecode  = regexp.MustCompile("^line (\\d+): cannot unmarshal !!\\w+ `(.*)` into (\\S+)$")
)

// wantOfGo words what a recipe value of Go type t must be.
func wantOfGo(t string) string {
	switch strings.TrimPrefix(t, "*") {
	case "int", "int64":
		return "an integer"
	case "float64":
		return "a number"
	case "bool":
		return "true or false"
	case "string":
		return "a string"
	}
	return "a value of type " + t
}

// keyLines maps every dotted key of the YAML mapping tree n to the line
// of its key ("calibrate.tokens" → 4).
func keyLines(n *yaml.Node) map[string]int {
	out := map[string]int{}
	var walk func(n *yaml.Node, prefix string)
	walk = func(n *yaml.Node, prefix string) {
		if n == nil {
			return
		}
		if n.Kind == yaml.DocumentNode && len(n.Content) == 1 {
			walk(n.Content[0], prefix)
			return
		}
		if n.Kind != yaml.MappingNode {
			return
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			key := n.Content[i].Value
			if prefix != "" {
				key = prefix + "." + key
			}
			out[key] = n.Content[i].Line
			walk(n.Content[i+1], key)
		}
	}
	walk(n, "")
	return out
}

// keyAtLine returns the dotted key ("calibrate.tokens") whose value starts
// on line in the mapping tree n, or "".
func keyAtLine(n *yaml.Node, line int, prefix string) string {
	if n == nil {
		return ""
	}
	if n.Kind == yaml.DocumentNode && len(n.Content) == 1 {
		return keyAtLine(n.Content[0], line, prefix)
	}
	if n.Kind != yaml.MappingNode {
		return ""
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		key := k.Value
		if prefix != "" {
			key = prefix + "." + key
		}
		if v.Line == line && v.Kind == yaml.ScalarNode {
			return key
		}
		if got := keyAtLine(v, line, key); got != "" {
			return got
		}
	}
	return ""
}

// sectionOf names the recipe section a Go type decodes.
var sectionOf = map[string]string{
	"Recipe": "the top level", "CalibrateStage": "calibrate", "PruneStage": "prune",
	"QuantizeStage": "quantize", "KVStage": "quantize.kv", "WeightsStage": "quantize.weights", "PackStage": "pack", "EvalStage": "eval",
}

// ParseRecipe decodes one YAML document strictly (every key must be a
// Recipe field; names are snake_case) and validates it; name labels
// errors. Defaults: prune.method lorp, quantize.kv clip_k 0.96 and clip_v
// 0.92 for oscar caches, pack.lz4 true.
//
// Errors: ErrRecipe naming the file, line and key ("line 4: unknown key
// \"tokenz\" in calibrate"), or the field and what was expected.
func ParseRecipe(name string, b []byte) (*Recipe, error) {
	if len(b) > maxRecipeBytes {
		return nil, fmt.Errorf("%w: %s: %d bytes, want at most %d", ErrRecipe, name, len(b), maxRecipeBytes)
	}
	// yaml.v3 reads some invalid UTF-8 (a UTF-16 byte-order mark) as an
	// empty document; a recipe is UTF-8 YAML.
	if off := fsx.FirstInvalidUTF8(b); off >= 0 {
		return nil, fmt.Errorf("%w: %s: not valid UTF-8 (first bad byte at offset %d); a recipe is a UTF-8 YAML file", ErrRecipe, name, off)
	}
	// Before decoding, the value kinds: yaml.v3 truncates a float given
	// for an int field (bits: 4.5 → 4), reads yes/no as booleans, and
	// words a list given for a scalar without its key (checkInts).
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err == nil && len(doc.Content) == 1 {
		if err := checkInts(doc.Content[0], reflect.TypeFor[Recipe](), ""); err != nil {
			return nil, fmt.Errorf("%w: %s: %v", ErrRecipe, name, err)
		}
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	var r Recipe
	if err := dec.Decode(&r); err != nil {
		if err == io.EOF {
			return nil, fmt.Errorf("%w: %s: empty recipe", ErrRecipe, name)
		}
		var te *yaml.TypeError
		if errors.As(err, &te) {
			var doc yaml.Node
			_ = yaml.Unmarshal(b, &doc)
			var msgs []string
			for _, e := range te.Errors {
				if m := fieldNotFound.FindStringSubmatch(e); m != nil {
					e = fmt.Sprintf("line %s: unknown key %q in %s", m[1], m[2], sectionOf[m[3]])
				} else if m := cannotDecode.FindStringSubmatch(e); m != nil {
					line, _ := strconv.Atoi(m[1])
					if key := keyAtLine(&doc, line, ""); key != "" {
						e = fmt.Sprintf("line %d: %s %q: want %s", line, key, m[2], wantOfGo(m[3]))
					}
				}
				msgs = append(msgs, e)
			}
			return nil, fmt.Errorf("%w: %s: %s", ErrRecipe, name, strings.Join(msgs, "; "))
		}
		return nil, fmt.Errorf("%w: %s: %v", ErrRecipe, name, err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err != io.EOF {
		return nil, fmt.Errorf("%w: %s: more than one YAML document", ErrRecipe, name)
	}
	if err := r.validateLines(name, keyLines(&doc)); err != nil {
		return nil, err
	}
	return &r, nil
}

// checkInts walks the mapping node n decoded into struct type t and
// refuses a scalar that is not tagged !!int for an int (or *int) field,
// naming its line and dotted key (prefix is the enclosing key).
func checkInts(n *yaml.Node, t reflect.Type, prefix string) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct || n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		for j := 0; j < t.NumField(); j++ {
			f := t.Field(j)
			if strings.Split(f.Tag.Get("yaml"), ",")[0] != k.Value {
				continue
			}
			key := k.Value
			if prefix != "" {
				key = prefix + "." + key
			}
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			switch {
			case (ft.Kind() == reflect.Int || ft.Kind() == reflect.Int64) && v.Kind == yaml.ScalarNode && v.Tag != "!!int" && v.Tag != "!!null":
				return fmt.Errorf("line %d: %s %q: want an integer", v.Line, key, v.Value)
			case ft.Kind() == reflect.Bool && v.Kind == yaml.ScalarNode && v.Value != "true" && v.Value != "false":
				// yaml.v3 also reads yes/no/on/off (YAML 1.1) as booleans.
				return fmt.Errorf("line %d: %s %q: want true or false", v.Line, key, v.Value)
			case ft.Kind() == reflect.Struct && v.Kind == yaml.ScalarNode && (v.Tag == "!!null" || v.Value == ""):
				return fmt.Errorf("line %d: %s is empty: give its keys or remove it", k.Line, key)
			case ft.Kind() == reflect.Struct && v.Kind != yaml.MappingNode:
				return fmt.Errorf("line %d: %s: want a section of keys, not %s", v.Line, key, nodeText(v))
			case ft.Kind() != reflect.Struct && ft.Kind() != reflect.Slice && ft.Kind() != reflect.Map && v.Kind != yaml.ScalarNode:
				return fmt.Errorf("line %d: %s: want a single value, not a %s", v.Line, key, map[yaml.Kind]string{yaml.SequenceNode: "list", yaml.MappingNode: "section"}[v.Kind])
			case zeroMeansUnset[key] && v.Kind == yaml.ScalarNode && (v.Value == "0" || v.Value == "0.0"):
				return fmt.Errorf("line %d: %s 0: want > 0, or leave the key out", v.Line, key)
			}
			if err := checkInts(v, f.Type, key); err != nil {
				return err
			}
		}
	}
	return nil
}

// nodeText words a YAML value for a message: a scalar quoted, a list or a
// section as it appears in the file in flow style (`the list [1, 2]`).
func nodeText(v *yaml.Node) string {
	if v.Kind == yaml.ScalarNode {
		return strconv.Quote(v.Value)
	}
	what := map[yaml.Kind]string{yaml.SequenceNode: "the list", yaml.MappingNode: "the section", yaml.AliasNode: "the alias"}[v.Kind]
	c := *v
	c.Style = yaml.FlowStyle
	b, err := yaml.Marshal(&c)
	if err != nil {
		return what
	}
	return what + " " + strings.TrimSpace(string(b))
}

// zeroMeansUnset lists the keys whose zero value means "not given": an
// explicit 0 there is a mistake (prune.layers: 0 would otherwise read as
// no layer removal at all).
var zeroMeansUnset = map[string]bool{
	"prune.layers": true, "prune.layer_ratio": true, "prune.head_groups": true, "prune.head_ratio": true,
	"prune.ffn_ratio": true, "prune.sparsity": true, "prune.head_step": true,
	"quantize.weights.bits": true, "quantize.weights.target_bpw": true, "quantize.weights.moe_budget": true,
}

// validate checks values and fills defaults.
func (r *Recipe) validate(name string) error { return r.validateLines(name, nil) }

// validateLines is validate with the recipe's key lines (keyLines): a
// message that starts with a dotted key given in the file is prefixed
// with its line ("line 4: calibrate.tokens -5: want > 0").
func (r *Recipe) validateLines(name string, lines map[string]int) error {
	bad := func(format string, a ...any) error {
		msg := fmt.Sprintf(format, a...)
		key, _, _ := strings.Cut(msg, " ")
		key = strings.TrimSuffix(key, ":")
		if l, ok := lines[key]; ok {
			msg = fmt.Sprintf("line %d: %s", l, msg)
		}
		return fmt.Errorf("%w: %s: %s", ErrRecipe, name, msg)
	}
	if q := r.Quantize; q != nil && q.Weights != nil {
		w := q.Weights
		if w.TargetBPW != 0 && w.Group != nil {
			return bad("quantize.weights: group is chosen per tensor by the allocator with target_bpw; remove group")
		}
		if w.Group == nil && w.TargetBPW == 0 {
			g := 128
			w.Group = &g
		}
		// Model, Calib and Out are the pipeline's.
		o := w.options()
		o.Model, o.Calib, o.Out = "(model)", "(calib)", "(out)"
		if err := o.Validate(); err != nil {
			return bad("%s", field.Rename(err, weightsKeys))
		}
		if r.Calibrate == nil {
			return bad("quantize.weights needs a calibrate section (GPTQ Hessians and the error report use calibration tokens)")
		}
	}
	if c := r.Calibrate; c != nil {
		// Data and Out are checked and set by Run (inputs).
		o := c.options("(data)", "(out)")
		if err := o.Validate(); err != nil {
			return bad("%s", field.Rename(err, calibrateKeys))
		}
	}
	if r.Prune != nil {
		if err := r.validatePrune(bad); err != nil {
			return err
		}
	}
	if q := r.Quantize; q != nil && q.KV != nil {
		kv := q.KV
		if kv.Cache == "" {
			return bad("quantize.kv.cache \"\": want one of %s", strings.Join(kvcache.Methods(), ", "))
		}
		if err := kv.packOptions("(rotations)").Validate(); err != nil {
			return bad("%s", field.Rename(err, packKeys))
		}
		if rotates(kv.Cache) {
			if r.Calibrate == nil {
				return bad("quantize.kv.cache %s needs a calibrate section (OSCAR rotations are computed from calibration statistics)", kv.Cache)
			}
			if kv.ClipK == 0 {
				kv.ClipK = oscar.DefaultClipK
			}
			if kv.ClipV == 0 {
				kv.ClipV = oscar.DefaultClipV
			}
			// Model, Calib and Out are the pipeline's.
			o := kv.options()
			o.Model, o.Calib, o.Out = "(model)", "(calib)", "(out)"
			if err := o.Validate(); err != nil {
				return bad("%s", field.Rename(err, kvKeys))
			}
			switch {
			case kv.Cache == "oscar-mixed" && kv.KVBits == 0:
				return bad("quantize.kv.cache oscar-mixed needs quantize.kv.kv_bits: the average bits per element its per-layer widths are chosen within (e.g. 3)")
			case kv.Cache != "oscar-mixed" && kv.KVBits != 0:
				return bad("quantize.kv.kv_bits %v: per-layer widths are the oscar-mixed cache's; cache %s has one width (give cache: oscar-mixed)", kv.KVBits, kv.Cache)
			case kv.ServingCtx != 0 && kv.KVBits == 0:
				return bad("quantize.kv.serving_ctx %d: the context at which kv_bits counts bits per element; without kv_bits (cache oscar-mixed) it does nothing", kv.ServingCtx)
			case kv.SearchTokens != 0 && kv.KVBits == 0 && !kv.ClipSearch:
				return bad("quantize.kv.search_tokens %d: the calibration tokens of the clip_search / kv_bits measurement; without either it does nothing", kv.SearchTokens)
			}
		} else if kv.ClipK != 0 || kv.ClipV != 0 || kv.ClipK4 != 0 || kv.ClipV4 != 0 || kv.ClipK8 != 0 || kv.ClipV8 != 0 ||
			kv.ClipSearch || kv.KVBits != 0 || kv.ServingCtx != 0 || kv.SearchTokens != 0 {
			return bad("quantize.kv clip_k, clip_v, clip_k4, clip_v4, clip_k8, clip_v8, clip_search, kv_bits, serving_ctx, search_tokens: cache %s takes no rotations, so none of these (they configure oscar2, oscar2-g32, oscar4 and oscar-mixed)", kv.Cache)
		}
	}
	if r.Pack.LZ4 == nil {
		t := true
		r.Pack.LZ4 = &t
	}
	if e := r.Eval; e != nil {
		// eval.ctx 0: the model's default, filled in by Run.
		o := e.options()
		o.Ctx = cmp.Or(o.Ctx, arch.DefaultContextTokens)
		if err := o.Validate(); err != nil {
			return bad("%s", field.Rename(err, evalKeys))
		}
		switch {
		case e.MaxDeltaPPL != 0:
			return bad("eval.max_delta_ppl %v: removed, gates are relative to the source model now: give max_delta_ppl_pct, the allowed ΔPPL in percent of the source model's perplexity (an absolute bound D on a source perplexity P is max_delta_ppl_pct 100·D/P; the report's eval.source_perplexity gives P)", e.MaxDeltaPPL)
		case !(e.MaxDeltaPPLPct >= 0) || math.IsInf(e.MaxDeltaPPLPct, 0):
			return bad("eval.max_delta_ppl_pct %v: want a finite percentage >= 0 (0: no bound)", e.MaxDeltaPPLPct)
		case !(e.MaxKL >= 0) || math.IsInf(e.MaxKL, 0):
			return bad("eval.max_kl %v: want a finite KL >= 0 in nats per token (0: no bound)", e.MaxKL)
		}
	}
	return nil
}

// validatePrune checks the prune section with prune.Options.Validate (on
// the layer-removal and the width options, each run as its own stage;
// field names renamed to the recipe's keys) and fills its defaults
// (method lorp for layer removal, head_method putri, refit true). What
// only a recipe has is checked here: refit given without FFN pruning, and
// the calibrate section the stages need.
func (r *Recipe) validatePrune(bad func(string, ...any) error) error {
	p := r.Prune
	if p.Refit != nil && p.FFNRatio == 0 && p.Sparsity == 0 {
		return bad("prune.refit needs ffn_ratio or sparsity (it refits the pruned FFNs' down_proj)")
	}
	if p.wantsDepth() {
		if p.Method == "" {
			p.Method = depth.MethodLoRP
		}
		o := p.depthOptions()
		o.Model, o.Calib, o.Out = "(model)", "(calib)", "(out)"
		if err := o.Validate(); err != nil {
			return bad("%s", field.Rename(err, pruneKeys))
		}
		if !strings.HasPrefix(p.Method, "list:") && r.Calibrate == nil {
			return bad("prune.method %s needs a calibrate section (block similarities)", p.Method)
		}
	}
	if p.wantsWidth() || !p.wantsDepth() || p.HeadMethod != "" || p.HeadStep != 0 || p.HeadRefit {
		o := p.widthOptions()
		o.Model, o.Calib, o.Out = "(model)", "(calib)", "(out)"
		if err := o.Validate(); err != nil {
			return bad("%s", field.Rename(err, pruneKeys))
		}
	}
	if !p.wantsWidth() {
		return nil
	}
	if r.Calibrate == nil {
		return bad("prune: width pruning (head_groups, head_ratio, ffn_ratio) needs a calibrate section (token ids and head statistics of the model)")
	}
	if p.wantsHeads() && p.HeadMethod == "" {
		p.HeadMethod = prune.HeadPutri
	}
	if (p.FFNRatio != 0 || p.Sparsity != 0) && p.Refit == nil {
		t := true
		p.Refit = &t
	}
	return nil
}
