package arch

import (
	"encoding/json"
	"fmt"
	"sort"
)

// ropeConfig holds the config.json keys that set RoPE, in both spellings:
// transformers v4 (rope_theta and rope_scaling at the top level) and v5
// (rope_parameters, one object holding rope_theta, rope_type and the
// scaling keys; transformers' standardize_rope_params).
type ropeConfig struct {
	RopeTheta                     *float64        `json:"rope_theta"`
	RopeScaling                   json.RawMessage `json:"rope_scaling"`
	RopeParameters                json.RawMessage `json:"rope_parameters"`
	PartialRotaryFactor           *float64        `json:"partial_rotary_factor"`
	OriginalMaxPositionEmbeddings *int            `json:"original_max_position_embeddings"`
}

// ropeDict is one RoPE object (rope_scaling or rope_parameters) as read.
type ropeDict struct {
	key                      string // "rope_scaling" or "rope_parameters"
	typ                      string // rope_type, else type, else "default"
	theta, factor, low, high *float64
	partial                  *float64
	origMax                  *int
}

// parseRopeDict reads the RoPE object raw found under key; nil when absent
// or null. Accepted keys: rope_type, type, rope_theta, factor,
// low_freq_factor, high_freq_factor, original_max_position_embeddings,
// partial_rotary_factor. Errors: not an object; a per-layer-type object
// (keys full_attention / sliding_attention); an unsupported rope_type
// (named with its value); any other key (named with its value).
func parseRopeDict(key string, raw json.RawMessage) (*ropeDict, error) {
	if isNull(raw) {
		return nil, nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("%s: want an object, got %s", key, raw)
	}
	names := make([]string, 0, len(m))
	for k := range m {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		if k == fullAttention || k == slidingAttention {
			return nil, fmt.Errorf("%s: RoPE parameters per layer type (%q) unsupported: lmpack runs one RoPE for every layer", key, k)
		}
	}
	d := &ropeDict{key: key, typ: "default"}
	str := func(k string) (string, error) {
		var s *string
		if err := json.Unmarshal(m[k], &s); err != nil {
			return "", fmt.Errorf("%s.%s: want a string, got %s", key, k, m[k])
		}
		if s == nil {
			return "", nil
		}
		return *s, nil
	}
	if _, ok := m["type"]; ok {
		s, err := str("type")
		if err != nil {
			return nil, err
		}
		if s != "" {
			d.typ = s
		}
	}
	typeKey := "type"
	if _, ok := m["rope_type"]; ok {
		s, err := str("rope_type")
		if err != nil {
			return nil, err
		}
		if s != "" {
			d.typ, typeKey = s, "rope_type"
		}
	}
	switch d.typ {
	case "default", "linear", "llama3":
	default:
		return nil, fmt.Errorf("%s.%s %q unsupported (lmpack runs default, linear and llama3 RoPE)", key, typeKey, d.typ)
	}
	num := func(k string, dst **float64) error {
		if err := json.Unmarshal(m[k], dst); err != nil {
			return fmt.Errorf("%s.%s: want a number, got %s", key, k, m[k])
		}
		return nil
	}
	for _, k := range names {
		var err error
		switch k {
		case "rope_type", "type":
		case "rope_theta":
			err = num(k, &d.theta)
		case "factor":
			err = num(k, &d.factor)
		case "low_freq_factor":
			err = num(k, &d.low)
		case "high_freq_factor":
			err = num(k, &d.high)
		case "partial_rotary_factor":
			err = num(k, &d.partial)
		case "original_max_position_embeddings":
			if e := json.Unmarshal(m[k], &d.origMax); e != nil {
				err = fmt.Errorf("%s.%s: want an integer, got %s", key, k, m[k])
			}
		default:
			// Keys of the types lmpack does not run (attention_factor,
			// beta_fast, mrope_section, short_factor, ...).
			return nil, fmt.Errorf("%s.%s (value %s) unsupported with rope_type %q: lmpack does not implement it", key, k, m[k], d.typ)
		}
		if err != nil {
			return nil, err
		}
	}
	return d, nil
}

// agreeF checks that the values given (name → value, nil: not given) are
// equal, and returns the first given one (nil when none).
func agreeF(what string, vals []namedF) (*float64, error) {
	var first *namedF
	for i := range vals {
		v := &vals[i]
		if v.v == nil {
			continue
		}
		if first == nil {
			first = v
		} else if *first.v != *v.v {
			return nil, fmt.Errorf("%s %g and %s %g disagree: give %s once", first.name, *first.v, v.name, *v.v, what)
		}
	}
	if first == nil {
		return nil, nil
	}
	return first.v, nil
}

type namedF struct {
	name string
	v    *float64
}

// rope resolves RoPE from either spelling, as transformers does: the
// scaling object is rope_parameters (v5) or rope_scaling (v4); rope_theta
// comes from it or from the top level, else defaultTheta (the family's
// default). llama3's original_max_position_embeddings, when neither the
// object nor the top level gives it, is max_position_embeddings
// (standardize_rope_params). A value given twice (rope_scaling and
// rope_parameters both, rope_theta at both levels) must agree.
//
// Errors name the key and value: an unsupported rope_type (yarn, dynamic,
// longrope, ...) under either key, an unknown key inside the object,
// partial_rotary_factor other than 1 (lmpack rotates the whole head_dim),
// RoPE per layer type, bad scaling parameters.
func (r *ropeConfig) rope(defaultTheta float64, maxPos int) (RoPE, error) {
	scal, err := parseRopeDict("rope_scaling", r.RopeScaling)
	if err != nil {
		return RoPE{}, err
	}
	params, err := parseRopeDict("rope_parameters", r.RopeParameters)
	if err != nil {
		return RoPE{}, err
	}
	var dicts []*ropeDict
	for _, d := range []*ropeDict{params, scal} {
		if d != nil {
			dicts = append(dicts, d)
		}
	}
	if len(dicts) == 2 && params.typ != scal.typ {
		return RoPE{}, fmt.Errorf("rope_parameters rope_type %q and rope_scaling type %q disagree: give one", params.typ, scal.typ)
	}
	collect := func(top *float64, topName string, get func(*ropeDict) *float64, key string) []namedF {
		var out []namedF
		for _, d := range dicts {
			out = append(out, namedF{d.key + "." + key, get(d)})
		}
		if topName != "" {
			out = append(out, namedF{topName, top})
		}
		return out
	}
	theta, err := agreeF("rope_theta", collect(r.RopeTheta, "rope_theta", func(d *ropeDict) *float64 { return d.theta }, "rope_theta"))
	if err != nil {
		return RoPE{}, err
	}
	partial, err := agreeF("partial_rotary_factor", collect(r.PartialRotaryFactor, "partial_rotary_factor", func(d *ropeDict) *float64 { return d.partial }, "partial_rotary_factor"))
	if err != nil {
		return RoPE{}, err
	}
	if partial != nil && *partial != 1 {
		name := "partial_rotary_factor"
		for _, d := range dicts {
			if d.partial != nil {
				name = d.key + ".partial_rotary_factor"
			}
		}
		return RoPE{}, fmt.Errorf("%s %g unsupported: lmpack applies RoPE to the whole head_dim (want 1)", name, *partial)
	}
	out := RoPE{Theta: defaultTheta}
	if theta != nil {
		out.Theta = *theta
	}
	if len(dicts) == 0 {
		return out, nil
	}
	d := dicts[0]
	factor, err := agreeF("factor", collect(nil, "", func(d *ropeDict) *float64 { return d.factor }, "factor"))
	if err != nil {
		return RoPE{}, err
	}
	low, err := agreeF("low_freq_factor", collect(nil, "", func(d *ropeDict) *float64 { return d.low }, "low_freq_factor"))
	if err != nil {
		return RoPE{}, err
	}
	high, err := agreeF("high_freq_factor", collect(nil, "", func(d *ropeDict) *float64 { return d.high }, "high_freq_factor"))
	if err != nil {
		return RoPE{}, err
	}
	f := func(p *float64) float64 {
		if p == nil {
			return 0
		}
		return *p
	}
	switch d.typ {
	case "default":
		return out, nil
	case "linear":
		if f(factor) <= 0 {
			return RoPE{}, fmt.Errorf("%s linear: factor %g: want > 0", d.key, f(factor))
		}
		out.Scaling = &RoPEScaling{Type: "linear", Factor: *factor}
	case "llama3":
		toF := func(p *int) *float64 {
			if p == nil {
				return nil
			}
			return ptr(float64(*p))
		}
		var om []namedF
		for _, d := range dicts {
			om = append(om, namedF{d.key + ".original_max_position_embeddings", toF(d.origMax)})
		}
		om = append(om, namedF{"original_max_position_embeddings", toF(r.OriginalMaxPositionEmbeddings)})
		orig, err := agreeF("original_max_position_embeddings", om)
		if err != nil {
			return RoPE{}, err
		}
		old := maxPos
		if orig != nil {
			old = int(*orig)
		}
		if f(factor) <= 0 || f(low) <= 0 || f(high) <= f(low) || old <= 0 {
			return RoPE{}, fmt.Errorf("%s llama3: factor %g, low_freq_factor %g, high_freq_factor %g, original_max_position_embeddings %d: want positive, high > low",
				d.key, f(factor), f(low), f(high), old)
		}
		out.Scaling = &RoPEScaling{Type: "llama3", Factor: *factor, LowFreqFactor: *low, HighFreqFactor: *high, OriginalMaxPositionEmbeddings: old}
	}
	return out, nil
}
