package tokenizer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// maxTokenID bounds token ids (2,097,152; the largest published vocabularies
// have about 262k entries) so that a corrupt id cannot make the id-to-token
// table huge.
const maxTokenID = 1 << 21

type parser struct{ file string }

func (p *parser) bad(field, format string, a ...any) error {
	return &fieldError{file: p.file, field: field, msg: fmt.Sprintf(format, a...), kind: ErrMalformed}
}

func (p *parser) badCause(field, msg string, cause error) error {
	return &fieldError{file: p.file, field: field, msg: msg, kind: ErrMalformed, cause: cause}
}

func (p *parser) unsupported(field, format string, a ...any) error {
	return &fieldError{file: p.file, field: field, msg: fmt.Sprintf(format, a...), kind: ErrUnsupported}
}

// isNull reports an absent or JSON-null value.
func isNull(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) == 0 || string(t) == "null"
}

// jobj is a JSON object being read, with its path for error messages.
type jobj struct {
	p    *parser
	path string
	m    map[string]json.RawMessage
}

func (p *parser) object(path string, raw json.RawMessage) (*jobj, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil || m == nil {
		return nil, p.badCause(path, "is not a JSON object", err)
	}
	return &jobj{p: p, path: path, m: m}, nil
}

func (o *jobj) field(key string) string {
	if o.path == "" {
		return key
	}
	return o.path + "." + key
}

func (o *jobj) has(key string) bool { return !isNull(o.m[key]) }

func (o *jobj) decode(key string, v any, want string) error {
	if err := json.Unmarshal(o.m[key], v); err != nil {
		return o.p.badCause(o.field(key), "is not "+want, err)
	}
	return nil
}

func (o *jobj) str(key string) (string, error) {
	if !o.has(key) {
		return "", o.p.bad(o.field(key), "missing (want a string)")
	}
	var s string
	return s, o.decode(key, &s, "a string")
}

func (o *jobj) optStr(key, def string) (string, error) {
	if !o.has(key) {
		return def, nil
	}
	var s string
	return s, o.decode(key, &s, "a string")
}

func (o *jobj) boolean(key string, def bool) (bool, error) {
	if !o.has(key) {
		return def, nil
	}
	var b bool
	return b, o.decode(key, &b, "a boolean")
}

func (o *jobj) integer(key string, def int) (int, error) {
	if !o.has(key) {
		return def, nil
	}
	var n int
	return n, o.decode(key, &n, "an integer")
}

// each calls fn for every non-null element of the array at key, with the
// element's path (path.key[i]) for error messages; it stops at the first
// error.
func (o *jobj) each(path, key string, fn func(at string, raw json.RawMessage) error) error {
	arr, err := o.array(key)
	if err != nil {
		return err
	}
	for i, r := range arr {
		if isNull(r) {
			continue
		}
		if err := fn(fmt.Sprintf("%s.%s[%d]", path, key, i), r); err != nil {
			return err
		}
	}
	return nil
}

func (o *jobj) array(key string) ([]json.RawMessage, error) {
	if !o.has(key) {
		return nil, o.p.bad(o.field(key), "missing (want an array)")
	}
	var a []json.RawMessage
	return a, o.decode(key, &a, "an array")
}

func (o *jobj) typ() (string, error) {
	if !o.has("type") {
		return "", o.p.bad(o.field("type"), "missing")
	}
	var s string
	return s, o.decode("type", &s, "a string")
}

// oneRune reads a string field that must hold exactly one character.
func (o *jobj) oneRune(key string, def rune) (rune, error) {
	if !o.has(key) {
		return def, nil
	}
	s, err := o.str(key)
	if err != nil {
		return 0, err
	}
	r, n := utf8.DecodeRuneInString(s)
	if n == 0 || n != len(s) {
		return 0, o.p.bad(o.field(key), "%q is not a single character", s)
	}
	return r, nil
}

func (p *parser) tokenizer(data []byte) (*Tokenizer, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(data, &m); err != nil || m == nil {
		return nil, p.badCause("", "is not a JSON object", err)
	}
	top := &jobj{p: p, m: m}
	if !top.has("model") {
		return nil, p.bad("model", "missing")
	}
	model, err := p.model(top.m["model"])
	if err != nil {
		return nil, err
	}
	t := &Tokenizer{model: model, special: map[int]bool{}, addedIDs: map[string]int{}, bos: -1, eos: -1}
	if top.has("normalizer") {
		if t.normalizer, err = p.normalizer("normalizer", top.m["normalizer"]); err != nil {
			return nil, err
		}
	}
	if top.has("pre_tokenizer") {
		if t.pre, err = p.preTokenizer("pre_tokenizer", top.m["pre_tokenizer"]); err != nil {
			return nil, err
		}
	}
	if top.has("post_processor") {
		if t.prefix, t.suffix, err = p.postProcessor("post_processor", top.m["post_processor"], model); err != nil {
			return nil, err
		}
	}
	if top.has("decoder") {
		t.hasDecoder = true
		if t.decoder, err = p.decoder("decoder", top.m["decoder"], nil); err != nil {
			return nil, err
		}
	}
	t.streamOK = streamable(t.decoder)

	var added []addedToken
	if top.has("added_tokens") {
		if added, err = p.addedTokens(top); err != nil {
			return nil, err
		}
	}
	maxID := -1
	for _, id := range model.vocab {
		maxID = max(maxID, int(id))
	}
	for _, a := range added {
		maxID = max(maxID, a.id)
	}
	t.idToTok = make([]string, maxID+1)
	for tok, id := range model.vocab {
		t.idToTok[id] = tok
	}
	var rawToks, normToks []addedToken
	var rawPats, normPats []string
	for _, a := range added {
		t.idToTok[a.id] = a.content
		if _, dup := t.addedIDs[a.content]; !dup {
			t.addedIDs[a.content] = a.id
		}
		if a.special {
			t.special[a.id] = true
		}
		if a.normalized {
			pat := a.content
			if t.normalizer != nil {
				pat = t.normalizer.normalize(pat)
			}
			normToks, normPats = append(normToks, a), append(normPats, pat)
		} else {
			rawToks, rawPats = append(rawToks, a), append(rawPats, a.content)
		}
	}
	t.addedRaw = newAddedMatcher(rawToks, rawPats)
	t.addedNorm = newAddedMatcher(normToks, normPats)
	if model.unkName != "" && model.unk < 0 {
		if id, ok := t.addedIDs[model.unkName]; ok {
			model.unk = int32(id)
		} else {
			return nil, p.bad("model.unk_token", "%q is neither in model.vocab nor in added_tokens", model.unkName)
		}
	}
	for _, id := range append(append([]int{}, t.prefix...), t.suffix...) {
		if id >= len(t.idToTok) || t.idToTok[id] == "" {
			return nil, p.bad("post_processor", "adds id %d, which has no token in model.vocab or added_tokens", id)
		}
	}
	if len(t.prefix) > 0 {
		t.bos = t.prefix[0]
	}
	if len(t.suffix) > 0 {
		t.eos = t.suffix[len(t.suffix)-1]
	}
	return t, nil
}

func (p *parser) addedTokens(top *jobj) ([]addedToken, error) {
	arr, err := top.array("added_tokens")
	if err != nil {
		return nil, err
	}
	out := make([]addedToken, 0, len(arr))
	for i, raw := range arr {
		path := fmt.Sprintf("added_tokens[%d]", i)
		o, err := p.object(path, raw)
		if err != nil {
			return nil, err
		}
		if !o.has("id") {
			return nil, p.bad(o.field("id"), "missing")
		}
		var a addedToken
		if a.id, err = o.integer("id", 0); err != nil {
			return nil, err
		}
		if a.id < 0 || a.id >= maxTokenID {
			return nil, p.bad(o.field("id"), "%d out of range [0, %d)", a.id, maxTokenID)
		}
		if a.content, err = o.str("content"); err != nil {
			return nil, err
		}
		if a.content == "" {
			return nil, p.bad(o.field("content"), "is empty")
		}
		if a.special, err = o.boolean("special", false); err != nil {
			return nil, err
		}
		if a.singleWord, err = o.boolean("single_word", false); err != nil {
			return nil, err
		}
		if a.lstrip, err = o.boolean("lstrip", false); err != nil {
			return nil, err
		}
		if a.rstrip, err = o.boolean("rstrip", false); err != nil {
			return nil, err
		}
		if a.normalized, err = o.boolean("normalized", !a.special); err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	return out, nil
}

func (p *parser) model(raw json.RawMessage) (*bpeModel, error) {
	o, err := p.object("model", raw)
	if err != nil {
		return nil, err
	}
	if o.has("type") {
		typ, err := o.typ()
		if err != nil {
			return nil, err
		}
		if typ != "BPE" {
			return nil, p.unsupported("model.type", "%q unsupported (want BPE)", typ)
		}
	} else if !o.has("merges") {
		return nil, p.unsupported("model.type", "missing and no model.merges (want a BPE model)")
	}
	if o.has("dropout") {
		var d float64
		if err := o.decode("dropout", &d, "a number"); err != nil {
			return nil, err
		}
		if d != 0 {
			return nil, p.unsupported("model.dropout", "%g unsupported (BPE dropout is random; want null or 0)", d)
		}
	}
	m := &bpeModel{unk: -1}
	if !o.has("vocab") {
		return nil, p.bad("model.vocab", "missing")
	}
	var vocab map[string]int
	if err := o.decode("vocab", &vocab, "an object of token ids"); err != nil {
		return nil, err
	}
	badTok := ""
	found := false
	for tok, id := range vocab {
		if id < 0 || id >= maxTokenID {
			if !found || tok < badTok {
				badTok, found = tok, true
			}
		}
	}
	if found {
		return nil, p.bad(fmt.Sprintf("model.vocab[%q]", badTok), "id %d out of range [0, %d)", vocab[badTok], maxTokenID)
	}
	m.vocab = make(map[string]int32, len(vocab))
	for tok, id := range vocab {
		m.vocab[tok] = int32(id)
	}
	if m.prefix, err = o.optStr("continuing_subword_prefix", ""); err != nil {
		return nil, err
	}
	if m.suffix, err = o.optStr("end_of_word_suffix", ""); err != nil {
		return nil, err
	}
	if m.fuseUnk, err = o.boolean("fuse_unk", false); err != nil {
		return nil, err
	}
	if m.byteFallback, err = o.boolean("byte_fallback", false); err != nil {
		return nil, err
	}
	if m.ignoreMerges, err = o.boolean("ignore_merges", false); err != nil {
		return nil, err
	}
	if o.has("unk_token") {
		name, err := o.str("unk_token")
		if err != nil {
			return nil, err
		}
		m.unkName = name
		if id, ok := m.vocab[name]; ok {
			m.unk = id
		}
	}
	if err := p.merges(o, m); err != nil {
		return nil, err
	}
	m.initLookups()
	return m, nil
}

// merges reads model.merges in either form: ["a b", ...] (classic) or
// [["a", "b"], ...] (tokenizers >= 0.20, allows spaces inside tokens).
func (p *parser) merges(o *jobj, m *bpeModel) error {
	m.merges = map[uint64]mergeRule{}
	if !o.has("merges") {
		return nil
	}
	raw := bytes.TrimSpace(o.m["merges"])
	if len(raw) == 0 || raw[0] != '[' {
		return p.bad("model.merges", "is not an array")
	}
	rest := bytes.TrimSpace(raw[1:])
	var pairs [][2]string
	switch {
	case len(rest) > 0 && rest[0] == '"':
		var lines []string
		if err := o.decode("merges", &lines, `an array of "a b" strings`); err != nil {
			return err
		}
		pairs = make([][2]string, len(lines))
		for i, l := range lines {
			parts := strings.Split(l, " ")
			if len(parts) != 2 {
				return p.bad(fmt.Sprintf("model.merges[%d]", i), "%q is not two space-separated tokens", l)
			}
			pairs[i] = [2]string{parts[0], parts[1]}
		}
	case len(rest) > 0 && rest[0] == '[':
		var arr [][]string
		if err := o.decode("merges", &arr, `an array of ["a", "b"] pairs`); err != nil {
			return err
		}
		pairs = make([][2]string, len(arr))
		for i, pr := range arr {
			if len(pr) != 2 {
				return p.bad(fmt.Sprintf("model.merges[%d]", i), "has %d elements (want 2)", len(pr))
			}
			pairs[i] = [2]string{pr[0], pr[1]}
		}
	default:
		var empty []json.RawMessage
		if err := o.decode("merges", &empty, "an array"); err != nil {
			return err
		}
		if len(empty) != 0 {
			return p.bad("model.merges", "elements are neither strings nor pairs")
		}
		return nil
	}
	if len(pairs) >= maxTokenID {
		return p.bad("model.merges", "has %d entries (limit %d)", len(pairs), maxTokenID)
	}
	m.merges = make(map[uint64]mergeRule, len(pairs))
	for i, pr := range pairs {
		a, okA := m.vocab[pr[0]]
		b, okB := m.vocab[pr[1]]
		if !okA || !okB {
			missing := pr[0]
			if okA {
				missing = pr[1]
			}
			return p.bad(fmt.Sprintf("model.merges[%d]", i), "token %q not in model.vocab", missing)
		}
		if len(pr[1]) < len(m.prefix) {
			return p.bad(fmt.Sprintf("model.merges[%d]", i), "token %q shorter than continuing_subword_prefix %q", pr[1], m.prefix)
		}
		merged := pr[0] + pr[1][len(m.prefix):]
		id, ok := m.vocab[merged]
		if !ok {
			return p.bad(fmt.Sprintf("model.merges[%d]", i), "merged token %q not in model.vocab", merged)
		}
		m.merges[pairKey(a, b)] = mergeRule{rank: int32(i), id: id}
	}
	return nil
}

// pattern reads {"String": s} or {"Regex": r}.
func (p *parser) pattern(path string, raw json.RawMessage) (literal string, rx string, isRegex bool, err error) {
	o, err := p.object(path, raw)
	if err != nil {
		return "", "", false, err
	}
	switch {
	case o.has("String"):
		literal, err = o.str("String")
		return literal, "", false, err
	case o.has("Regex"):
		rx, err = o.str("Regex")
		return "", rx, true, err
	}
	return "", "", false, p.bad(path, `has neither "String" nor "Regex"`)
}

func (p *parser) replace(o *jobj) (replaceNormalizer, error) {
	if !o.has("pattern") {
		return replaceNormalizer{}, p.bad(o.field("pattern"), "missing")
	}
	lit, rx, isRegex, err := p.pattern(o.field("pattern"), o.m["pattern"])
	if err != nil {
		return replaceNormalizer{}, err
	}
	content, err := o.str("content")
	if err != nil {
		return replaceNormalizer{}, err
	}
	r := replaceNormalizer{literal: lit, content: content}
	if isRegex {
		if r.re, err = compileRegex(rx); err != nil {
			return r, p.badCause(o.field("pattern.Regex"), fmt.Sprintf("%q does not compile", rx), err)
		}
	}
	return r, nil
}

func (p *parser) normalizer(path string, raw json.RawMessage) (normalizer, error) {
	o, err := p.object(path, raw)
	if err != nil {
		return nil, err
	}
	typ, err := o.typ()
	if err != nil {
		return nil, err
	}
	switch typ {
	case "Sequence":
		var seq seqNormalizer
		err := o.each(path, "normalizers", func(at string, r json.RawMessage) error {
			n, err := p.normalizer(at, r)
			seq = append(seq, n)
			return err
		})
		return seq, err
	case "Prepend":
		s, err := o.str("prepend")
		return prependNormalizer{s}, err
	case "Append":
		s, err := o.str("append")
		return appendNormalizer{s}, err
	case "Replace":
		return p.replace(o)
	case "NFC":
		return unicodeNormalizer{norm.NFC}, nil
	case "NFD":
		return unicodeNormalizer{norm.NFD}, nil
	case "NFKC":
		return unicodeNormalizer{norm.NFKC}, nil
	case "NFKD":
		return unicodeNormalizer{norm.NFKD}, nil
	case "Lowercase":
		return lowercaseNormalizer{}, nil
	case "Strip":
		l, err := o.boolean("strip_left", true)
		if err != nil {
			return nil, err
		}
		r, err := o.boolean("strip_right", true)
		return stripNormalizer{l, r}, err
	}
	return nil, p.unsupported(o.field("type"), "%q unsupported (want Sequence, Prepend, Append, Replace, NFC, NFD, NFKC, NFKD, Lowercase or Strip)", typ)
}

func (p *parser) prependScheme(o *jobj) (prependScheme, error) {
	if o.has("prepend_scheme") {
		s, err := o.str("prepend_scheme")
		if err != nil {
			return 0, err
		}
		switch s {
		case "always":
			return prependAlways, nil
		case "first":
			return prependFirst, nil
		case "never":
			return prependNever, nil
		}
		return 0, p.bad(o.field("prepend_scheme"), "%q is not always, first or never", s)
	}
	add, err := o.boolean("add_prefix_space", true)
	if err != nil || add {
		return prependAlways, err
	}
	return prependNever, nil
}

func (p *parser) preTokenizer(path string, raw json.RawMessage) (preTokenizer, error) {
	o, err := p.object(path, raw)
	if err != nil {
		return nil, err
	}
	typ, err := o.typ()
	if err != nil {
		return nil, err
	}
	switch typ {
	case "Sequence":
		var seq seqPreTokenizer
		err := o.each(path, "pretokenizers", func(at string, r json.RawMessage) error {
			pt, err := p.preTokenizer(at, r)
			seq = append(seq, pt)
			return err
		})
		return seq, err
	case "Split":
		if !o.has("pattern") {
			return nil, p.bad(o.field("pattern"), "missing")
		}
		lit, rx, isRegex, err := p.pattern(o.field("pattern"), o.m["pattern"])
		if err != nil {
			return nil, err
		}
		bs, err := o.str("behavior")
		if err != nil {
			return nil, err
		}
		b, ok := splitBehaviors[bs]
		if !ok {
			return nil, p.bad(o.field("behavior"), "%q is not Removed, Isolated, MergedWithPrevious, MergedWithNext or Contiguous", bs)
		}
		inv, err := o.boolean("invert", false)
		if err != nil {
			return nil, err
		}
		var f finder = literalFinder{lit}
		if isRegex {
			if f, err = regexSplitter(rx); err != nil {
				return nil, p.badCause(o.field("pattern.Regex"), fmt.Sprintf("%q does not compile", rx), err)
			}
		}
		return splitPreTokenizer{f: f, behavior: b, invert: inv}, nil
	case "ByteLevel":
		add, err := o.boolean("add_prefix_space", true)
		if err != nil {
			return nil, err
		}
		useRe, err := o.boolean("use_regex", true)
		if err != nil {
			return nil, err
		}
		bl := byteLevelPreTokenizer{addPrefixSpace: add}
		if useRe {
			if bl.split, err = regexSplitter(gpt2Pattern); err != nil {
				return nil, p.badCause(path, "GPT-2 pattern does not compile", err)
			}
		}
		return bl, nil
	case "Metaspace":
		r, err := o.oneRune("replacement", '▁')
		if err != nil {
			return nil, err
		}
		sc, err := p.prependScheme(o)
		if err != nil {
			return nil, err
		}
		split, err := o.boolean("split", true)
		return metaspacePreTokenizer{repl: r, scheme: sc, split: split}, err
	case "Digits":
		ind, err := o.boolean("individual_digits", false)
		return digitsPreTokenizer{individual: ind}, err
	case "WhitespaceSplit":
		return splitPreTokenizer{f: charFinder{unicode.IsSpace}, behavior: splitRemoved}, nil
	case "Whitespace":
		f, err := regexSplitter(`\w+|[^\w\s]+`)
		if err != nil {
			return nil, p.badCause(path, "Whitespace pattern does not compile", err)
		}
		return splitPreTokenizer{f: f, behavior: splitRemoved, invert: true}, nil
	}
	return nil, p.unsupported(o.field("type"), "%q unsupported (want Sequence, Split, ByteLevel, Metaspace, Digits, Whitespace or WhitespaceSplit)", typ)
}

func (p *parser) postProcessor(path string, raw json.RawMessage, m *bpeModel) (prefix, suffix []int, err error) {
	o, err := p.object(path, raw)
	if err != nil {
		return nil, nil, err
	}
	typ, err := o.typ()
	if err != nil {
		return nil, nil, err
	}
	switch typ {
	case "ByteLevel":
		return nil, nil, nil
	case "Sequence":
		err := o.each(path, "processors", func(at string, r json.RawMessage) error {
			pre, suf, err := p.postProcessor(at, r, m)
			prefix = append(append([]int{}, pre...), prefix...)
			suffix = append(suffix, suf...)
			return err
		})
		if err != nil {
			return nil, nil, err
		}
		return prefix, suffix, nil
	case "TemplateProcessing":
		return p.template(o)
	case "RobertaProcessing", "BertProcessing":
		var cls, sep []json.RawMessage
		if err := o.decode("cls", &cls, `a ["token", id] pair`); err != nil {
			return nil, nil, err
		}
		if err := o.decode("sep", &sep, `a ["token", id] pair`); err != nil {
			return nil, nil, err
		}
		var clsID, sepID int
		if len(cls) != 2 || json.Unmarshal(cls[1], &clsID) != nil || clsID < 0 {
			return nil, nil, p.bad(o.field("cls"), `is not a ["token", id] pair`)
		}
		if len(sep) != 2 || json.Unmarshal(sep[1], &sepID) != nil || sepID < 0 {
			return nil, nil, p.bad(o.field("sep"), `is not a ["token", id] pair`)
		}
		return []int{clsID}, []int{sepID}, nil
	}
	return nil, nil, p.unsupported(o.field("type"), "%q unsupported (want TemplateProcessing, ByteLevel, Sequence, RobertaProcessing or BertProcessing)", typ)
}

// template reads a TemplateProcessing's "single" template: special tokens
// around one "A" sequence.
func (p *parser) template(o *jobj) (prefix, suffix []int, err error) {
	items, err := o.array("single")
	if err != nil {
		return nil, nil, err
	}
	specials := map[string][]int{}
	if o.has("special_tokens") {
		var st map[string]json.RawMessage
		if err := o.decode("special_tokens", &st, "an object"); err != nil {
			return nil, nil, err
		}
		names := make([]string, 0, len(st))
		for name := range st {
			names = append(names, name)
		}
		sort.Strings(names)
		for _, name := range names {
			so, err := p.object(fmt.Sprintf("%s[%q]", o.field("special_tokens"), name), st[name])
			if err != nil {
				return nil, nil, err
			}
			var ids []int
			if err := so.decode("ids", &ids, "an array of ids"); err != nil {
				return nil, nil, err
			}
			for _, id := range ids {
				if id < 0 || id >= maxTokenID {
					return nil, nil, p.bad(so.field("ids"), "id %d out of range [0, %d)", id, maxTokenID)
				}
			}
			specials[name] = ids
		}
	}
	seenA := false
	for i, raw := range items {
		path := fmt.Sprintf("%s[%d]", o.field("single"), i)
		io, err := p.object(path, raw)
		if err != nil {
			return nil, nil, err
		}
		switch {
		case io.has("SpecialToken"):
			so, err := p.object(io.field("SpecialToken"), io.m["SpecialToken"])
			if err != nil {
				return nil, nil, err
			}
			name, err := so.str("id")
			if err != nil {
				return nil, nil, err
			}
			ids, ok := specials[name]
			if !ok {
				return nil, nil, p.bad(so.field("id"), "%q not in %s", name, o.field("special_tokens"))
			}
			if seenA {
				suffix = append(suffix, ids...)
			} else {
				prefix = append(prefix, ids...)
			}
		case io.has("Sequence"):
			so, err := p.object(io.field("Sequence"), io.m["Sequence"])
			if err != nil {
				return nil, nil, err
			}
			name, err := so.str("id")
			if err != nil {
				return nil, nil, err
			}
			if name != "A" || seenA {
				return nil, nil, p.unsupported(so.field("id"), "%q unsupported in a single-sequence template (want one A)", name)
			}
			seenA = true
		default:
			return nil, nil, p.bad(path, "is neither SpecialToken nor Sequence")
		}
	}
	if !seenA {
		return nil, nil, p.bad(o.field("single"), "has no Sequence A")
	}
	return prefix, suffix, nil
}

func (p *parser) decoder(path string, raw json.RawMessage, out []decStep) ([]decStep, error) {
	o, err := p.object(path, raw)
	if err != nil {
		return nil, err
	}
	typ, err := o.typ()
	if err != nil {
		return nil, err
	}
	switch typ {
	case "Sequence":
		err := o.each(path, "decoders", func(at string, r json.RawMessage) (err error) {
			out, err = p.decoder(at, r, out)
			return err
		})
		if err != nil {
			return nil, err
		}
		return out, nil
	case "Replace":
		r, err := p.replace(o)
		return append(out, decStep{kind: decReplace, rep: r}), err
	case "ByteFallback":
		return append(out, decStep{kind: decByteFallback}), nil
	case "Fuse":
		return append(out, decStep{kind: decFuse}), nil
	case "Strip":
		c, err := o.oneRune("content", ' ')
		if err != nil {
			return nil, err
		}
		start, err := o.integer("start", 0)
		if err != nil {
			return nil, err
		}
		stop, err := o.integer("stop", 0)
		if err != nil {
			return nil, err
		}
		if start < 0 || stop < 0 {
			return nil, p.bad(path, "start %d / stop %d negative", start, stop)
		}
		return append(out, decStep{kind: decStrip, content: c, start: start, stop: stop}), nil
	case "ByteLevel":
		return append(out, decStep{kind: decByteLevel}), nil
	case "Metaspace":
		r, err := o.oneRune("replacement", '▁')
		if err != nil {
			return nil, err
		}
		sc, err := p.prependScheme(o)
		return append(out, decStep{kind: decMetaspace, repl: r, dropFirst: sc != prependNever}), err
	}
	return nil, p.unsupported(o.field("type"), "%q unsupported (want Sequence, Replace, ByteFallback, Fuse, Strip, ByteLevel or Metaspace)", typ)
}
