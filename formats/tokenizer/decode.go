package tokenizer

import (
	"strings"
	"unicode/utf8"
)

type decKind int

const (
	decReplace decKind = iota
	decByteFallback
	decFuse
	decStrip
	decByteLevel
	decMetaspace
)

// decStep is one decoder of tokenizer.json's "decoder" (a Sequence is
// flattened into its members). Hugging Face decoders map a list of token
// strings to a new list; Decode joins the final list with "".
type decStep struct {
	kind decKind
	rep  replaceNormalizer // decReplace
	// decStrip: remove up to start leading and stop trailing copies of
	// content from each token.
	content     rune
	start, stop int
	// decMetaspace: repl becomes ' ', except in the first token where it is
	// dropped when dropFirst (prepend_scheme != "never").
	repl      rune
	dropFirst bool
}

// parseByteToken returns the byte of a byte-fallback token "<0xNN>" (hex of
// either case).
func parseByteToken(tok string) (byte, bool) {
	if len(tok) != 6 || tok[0] != '<' || tok[1] != '0' || tok[2] != 'x' || tok[5] != '>' {
		return 0, false
	}
	hi, ok1 := hexVal(tok[3])
	lo, ok2 := hexVal(tok[4])
	return hi<<4 | lo, ok1 && ok2
}

func hexVal(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// stripToken removes up to start leading and up to stop trailing copies of c
// (the trailing cut never reaches into the leading one).
func stripToken(s string, c rune, start, stop int) string {
	rs := []rune(s)
	a := 0
	for a < start && a < len(rs) && rs[a] == c {
		a++
	}
	b := len(rs)
	for k := 0; k < stop && b > a && rs[b-1] == c; k++ {
		b--
	}
	return string(rs[a:b])
}

func metaspaceToken(s string, repl rune, drop bool) string {
	if !strings.ContainsRune(s, repl) {
		return s
	}
	var sb strings.Builder
	for _, r := range s {
		if r == repl {
			if drop {
				continue
			}
			r = ' '
		}
		sb.WriteRune(r)
	}
	return sb.String()
}

// batch applies the step to a whole token list (Hugging Face semantics).
func (d *decStep) batch(toks []string) []string {
	switch d.kind {
	case decReplace:
		for i, t := range toks {
			toks[i] = d.rep.replace(t)
		}
		return toks
	case decByteFallback:
		out := make([]string, 0, len(toks))
		var run []byte
		flush := func() {
			if len(run) == 0 {
				return
			}
			if utf8.Valid(run) {
				out = append(out, string(run))
			} else {
				for range run {
					out = append(out, "\uFFFD")
				}
			}
			run = run[:0]
		}
		for _, t := range toks {
			if b, ok := parseByteToken(t); ok {
				run = append(run, b)
				continue
			}
			flush()
			out = append(out, t)
		}
		flush()
		return out
	case decFuse:
		return []string{strings.Join(toks, "")}
	case decStrip:
		for i, t := range toks {
			toks[i] = stripToken(t, d.content, d.start, d.stop)
		}
		return toks
	case decByteLevel:
		var buf []byte
		for _, t := range toks {
			buf = byteLevelDecodeToken(buf, t)
		}
		out, _ := appendLossy(make([]byte, 0, len(buf)), buf, true)
		return []string{string(out)}
	case decMetaspace:
		for i, t := range toks {
			toks[i] = metaspaceToken(t, d.repl, i == 0 && d.dropFirst)
		}
		return toks
	}
	return toks
}

// streamable reports whether a decoder chain can be run incrementally with
// exactly the batch result. After a Fuse or ByteLevel step all tokens have
// become one growing string ("fused"); steps that need a whole token to
// decide (ByteFallback, ByteLevel, regex Replace, empty-literal Replace)
// cannot follow one.
func streamable(steps []decStep) bool {
	fused := false
	for _, d := range steps {
		switch d.kind {
		case decReplace:
			if fused && (d.rep.re != nil || d.rep.literal == "") {
				return false
			}
		case decByteFallback:
			if fused {
				return false
			}
		case decFuse:
			fused = true
		case decByteLevel:
			if fused {
				return false
			}
			fused = true
		}
	}
	return true
}

// stage is the incremental form of a decoder step. An unfused stage
// receives and emits whole tokens; once fused, strings are consecutive
// chunks of a single token.
type stage interface {
	push(in string, emit func(string))
	flush(emit func(string))
}

type replaceStage struct {
	rep   replaceNormalizer
	fused bool
	held  string // fused: a tail that may start a match
}

func (s *replaceStage) push(in string, emit func(string)) {
	if !s.fused {
		emit(s.rep.replace(in))
		return
	}
	buf := s.held + in
	lit := s.rep.literal
	var sb strings.Builder
	pos := 0
	for {
		k := strings.Index(buf[pos:], lit)
		if k < 0 {
			break
		}
		sb.WriteString(buf[pos : pos+k])
		sb.WriteString(s.rep.content)
		pos += k + len(lit)
	}
	tail := buf[pos:]
	keep := 0
	for k := min(len(lit)-1, len(tail)); k > 0; k-- {
		if strings.HasSuffix(tail, lit[:k]) {
			keep = k
			break
		}
	}
	sb.WriteString(tail[:len(tail)-keep])
	s.held = tail[len(tail)-keep:]
	emit(sb.String())
}

func (s *replaceStage) flush(emit func(string)) {
	if s.held != "" {
		emit(s.held)
		s.held = ""
	}
}

type byteFallbackStage struct{ run []byte }

func (s *byteFallbackStage) push(in string, emit func(string)) {
	if b, ok := parseByteToken(in); ok {
		s.run = append(s.run, b)
		return
	}
	s.flush(emit)
	emit(in)
}

func (s *byteFallbackStage) flush(emit func(string)) {
	if len(s.run) == 0 {
		return
	}
	if utf8.Valid(s.run) {
		emit(string(s.run))
	} else {
		for range s.run {
			emit("\uFFFD")
		}
	}
	s.run = s.run[:0]
}

// passStage forwards its input: Fuse (the join is implicit once fused).
type passStage struct{}

func (passStage) push(in string, emit func(string)) { emit(in) }
func (passStage) flush(func(string))                {}

type stripStage struct {
	d         *decStep
	fused     bool
	startLeft int  // fused: leading copies that may still be cut
	started   bool // fused: a character has been kept
	heldRun   int  // fused: trailing copies of content held back
}

func (s *stripStage) push(in string, emit func(string)) {
	d := s.d
	if !s.fused {
		emit(stripToken(in, d.content, d.start, d.stop))
		return
	}
	var sb strings.Builder
	for _, r := range in {
		if !s.started {
			if s.startLeft > 0 && r == d.content {
				s.startLeft--
				continue
			}
			s.started = true
		}
		if d.stop > 0 && r == d.content {
			s.heldRun++
			continue
		}
		for ; s.heldRun > 0; s.heldRun-- {
			sb.WriteRune(d.content)
		}
		sb.WriteRune(r)
	}
	emit(sb.String())
}

func (s *stripStage) flush(emit func(string)) {
	if !s.fused {
		return
	}
	var sb strings.Builder
	for k := s.heldRun - s.d.stop; k > 0; k-- {
		sb.WriteRune(s.d.content)
	}
	s.heldRun = 0
	emit(sb.String())
}

type byteLevelStage struct{ buf []byte }

func (s *byteLevelStage) push(in string, emit func(string)) {
	s.buf = byteLevelDecodeToken(s.buf, in)
	out, n := appendLossy(nil, s.buf, false)
	s.buf = append(s.buf[:0], s.buf[n:]...)
	emit(string(out))
}

func (s *byteLevelStage) flush(emit func(string)) {
	out, _ := appendLossy(nil, s.buf, true)
	s.buf = s.buf[:0]
	emit(string(out))
}

type metaspaceStage struct {
	d     *decStep
	fused bool
	n     int // tokens seen (unfused)
}

func (s *metaspaceStage) push(in string, emit func(string)) {
	first := s.fused || s.n == 0
	s.n++
	emit(metaspaceToken(in, s.d.repl, first && s.d.dropFirst))
}

func (*metaspaceStage) flush(func(string)) {}

// joinStage is the behaviour without any decoder: tokens joined by " ".
type joinStage struct{ n int }

func (s *joinStage) push(in string, emit func(string)) {
	if s.n > 0 {
		emit(" ")
	}
	s.n++
	emit(in)
}

func (*joinStage) flush(func(string)) {}

// newStages builds fresh incremental stages for a streamable chain.
func newStages(steps []decStep, hasDecoder bool) []stage {
	if !hasDecoder {
		return []stage{&joinStage{}}
	}
	var st []stage
	fused := false
	for i := range steps {
		d := &steps[i]
		switch d.kind {
		case decReplace:
			st = append(st, &replaceStage{rep: d.rep, fused: fused})
		case decByteFallback:
			st = append(st, &byteFallbackStage{})
		case decFuse:
			st = append(st, passStage{})
			fused = true
		case decStrip:
			st = append(st, &stripStage{d: d, fused: fused, startLeft: d.start})
		case decByteLevel:
			st = append(st, &byteLevelStage{})
			fused = true
		case decMetaspace:
			st = append(st, &metaspaceStage{d: d, fused: fused})
		}
	}
	return st
}

// StreamDecoder turns ids into text one id at a time, e.g. while a model
// generates. The concatenation of everything Next and Flush return equals
// Decode of the whole id sequence (same skipSpecial), byte for byte, for any
// ids: text whose final form still depends on later ids is held back, i.e.
// an incomplete UTF-8 sequence (byte-level tokenizers), a run of <0xNN>
// byte-fallback tokens (emitted when a non-byte token or Flush ends the run,
// because the Hugging Face ByteFallback decoder turns a whole run into
// U+FFFD when any part of it is invalid), trailing characters a Strip
// decoder may still remove. A leading space that a Strip decoder removes
// from the start of the text is removed once, from the first text produced.
//
// Decoder chains that cannot be run incrementally (e.g. a regex Replace
// after a Fuse) are handled exactly but without streaming: Next returns ""
// and Flush returns the whole text.
//
// A StreamDecoder is not safe for concurrent use. After Flush it starts a
// new sequence.
type StreamDecoder struct {
	t      *Tokenizer
	skip   bool
	stages []stage // nil: buffer ids until Flush
	ids    []int
	out    []byte
	// drop is how many bytes of output still belong to a prefix
	// (NewStreamDecoderAfter) and are not returned.
	drop int
}

// NewStreamDecoder returns a StreamDecoder; skipSpecial drops special added
// tokens as in Decode.
func (t *Tokenizer) NewStreamDecoder(skipSpecial bool) *StreamDecoder {
	d := &StreamDecoder{t: t, skip: skipSpecial}
	d.reset()
	return d
}

// NewStreamDecoderAfter returns a StreamDecoder that continues the
// sequence prefix (e.g. a prompt): Next and Flush return only the text
// that follows Decode(prefix, skipSpecial), so that prefix text plus
// everything they return equals Decode of prefix followed by the fed ids.
// Decoders that treat the start of the sequence specially (a Strip
// decoder removing the leading space SentencePiece adds, a Metaspace
// decoder dropping the first "▁") therefore apply that only where the
// whole sequence starts: after a prefix with text, a generated " park"
// keeps its space; after a prefix with no text (BOS alone, a special
// token skipped) the first generated token is the start of the text and
// is stripped as Decode strips it. After Flush the decoder starts a new
// sequence without prefix.
func (t *Tokenizer) NewStreamDecoderAfter(prefix []int, skipSpecial bool) *StreamDecoder {
	d := t.NewStreamDecoder(skipSpecial)
	emitted := 0
	for _, id := range prefix {
		emitted += len(d.Next(id))
	}
	// What the prefix emitted is gone; the rest of its text may still be
	// held back (a byte-fallback run, trailing strip characters, a
	// non-streamable chain) and comes out with the next ids: drop it there.
	d.drop = len(t.Decode(prefix, skipSpecial)) - emitted
	return d
}

// cut removes the bytes of out that still belong to the prefix.
func (d *StreamDecoder) cut(out string) string {
	if d.drop <= 0 {
		return out
	}
	k := min(d.drop, len(out))
	d.drop -= k
	return out[k:]
}

func (d *StreamDecoder) reset() {
	d.drop = 0
	d.ids = d.ids[:0]
	d.stages = nil
	if d.t.streamOK {
		d.stages = newStages(d.t.decoder, d.t.hasDecoder)
	}
}

// run pushes s into stage i (i == len(stages) collects output).
func (d *StreamDecoder) run(i int, s string) {
	if i == len(d.stages) {
		d.out = append(d.out, s...)
		return
	}
	d.stages[i].push(s, func(o string) { d.run(i+1, o) })
}

// Next feeds one id and returns the text that became final with it (often
// "", never a partial UTF-8 character). Unknown ids are ignored, as in
// Decode.
func (d *StreamDecoder) Next(id int) string {
	if d.stages == nil {
		d.ids = append(d.ids, id)
		return ""
	}
	tok, ok := d.t.decodeToken(id, d.skip)
	if !ok {
		return ""
	}
	d.out = d.out[:0]
	d.run(0, tok)
	return d.cut(string(d.out))
}

// Flush ends the sequence and returns the text still held back; the decoder
// is then ready for a new sequence.
func (d *StreamDecoder) Flush() string {
	if d.stages == nil {
		s := d.cut(d.t.Decode(d.ids, d.skip))
		d.reset()
		return s
	}
	d.out = d.out[:0]
	for i := range d.stages {
		d.stages[i].flush(func(o string) { d.run(i+1, o) })
	}
	s := d.cut(string(d.out))
	d.reset()
	return s
}
