package tokenizer

import (
	"encoding/json"
)

// llamaClasses are the transformers tokenizer classes whose fast tokenizer
// rebuilds the post-processor from add_bos_token / add_eos_token at load
// time (LlamaTokenizerFast.update_post_processor and its Gemma/CodeLlama
// counterparts).
var llamaClasses = map[string]bool{
	"LlamaTokenizer": true, "LlamaTokenizerFast": true,
	"CodeLlamaTokenizer": true, "CodeLlamaTokenizerFast": true,
	"GemmaTokenizer": true, "GemmaTokenizerFast": true,
}

// configToken reads a special-token field of tokenizer_config.json: a
// string, an AddedToken object {"content": ...}, or null. present is false
// when the key is absent.
func (o *jobj) configToken(key string) (content string, present, isNullValue bool, err error) {
	raw, ok := o.m[key]
	if !ok {
		return "", false, false, nil
	}
	if isNull(raw) {
		return "", true, true, nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, true, false, nil
	}
	obj, err := o.p.object(o.field(key), raw)
	if err != nil {
		return "", true, false, o.p.bad(o.field(key), "is neither a string, an object with content, nor null")
	}
	s, err = obj.str("content")
	return s, true, false, err
}

// applyConfig applies tokenizer_config.json (see Load).
func (t *Tokenizer) applyConfig(file string, data []byte) error {
	p := &parser{file: file}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(data, &m); err != nil || m == nil {
		return p.badCause("", "is not a JSON object", err)
	}
	o := &jobj{p: p, m: m}
	resolve := func(key string) (int, bool, error) {
		s, present, null, err := o.configToken(key)
		if err != nil || !present {
			return -1, present, err
		}
		if null {
			return -1, true, nil
		}
		id, ok := t.TokenID(s)
		if !ok {
			return -1, true, p.bad(key, "%q is not a token of the tokenizer", s)
		}
		return id, true, nil
	}
	bos, bosPresent, err := resolve("bos_token")
	if err != nil {
		return err
	}
	eos, eosPresent, err := resolve("eos_token")
	if err != nil {
		return err
	}
	if bosPresent {
		t.bos = bos
	}
	if eosPresent {
		t.eos = eos
	}
	class, err := o.optStr("tokenizer_class", "")
	if err != nil {
		return err
	}
	if !llamaClasses[class] {
		return nil
	}
	addBOS, err := o.boolean("add_bos_token", true)
	if err != nil {
		return err
	}
	addEOS, err := o.boolean("add_eos_token", false)
	if err != nil {
		return err
	}
	t.prefix, t.suffix = nil, nil
	if addBOS {
		if t.bos < 0 {
			return p.bad("add_bos_token", "is true but bos_token is not set")
		}
		t.prefix = []int{t.bos}
	}
	if addEOS {
		if t.eos < 0 {
			return p.bad("add_eos_token", "is true but eos_token is not set")
		}
		t.suffix = []int{t.eos}
	}
	return nil
}
