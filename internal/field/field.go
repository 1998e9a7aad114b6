// Package field is the error type of the stages' option validators: every
// Validate method (calibrate.Options, prune.Options, wquant.Options,
// oscar.KVOptions, pack.FromOptions, kveval.Options) names the Go field
// it refuses, and the front ends (cmd/lmpack, compress) rename the field
// to their flag or recipe key with one table per options type (Rename).
package field

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// Error is an invalid option value. Field is the Go field name of the
// options type ("Tokens"); Value the value given (nil: not shown); Want
// what is expected ("> 0"; for a bool, what it needs). Want may name other fields of the same
// options type in braces ("{Method} gptq"), so that Rename renames them
// too. Error() words it with the Go names: "Tokens -5: want > 0".
//
// Err, when set, is the lower-level error that made the value invalid
// (depth.ErrProtectedLayer, say): Unwrap returns it, so errors.Is sees it;
// its text is not part of Error() (Want words the problem).
type Error struct {
	Field string
	Value any
	Want  string
	Err   error
}

// Unwrap returns e.Err.
func (e *Error) Unwrap() error { return e.Err }

// New returns an *Error for field with value and want (see Error).
func New(field string, value any, want string) error {
	return &Error{Field: field, Value: value, Want: want}
}

// Error words e with the Go field names.
func (e *Error) Error() string { return e.Render(nil) }

var braced = regexp.MustCompile(`\{(\w+)\}`)

// Render words e with every field name (e.Field and the braced names in
// e.Want) replaced by names[field]; a name missing from names (or names
// nil) stays the Go name. A string Value is quoted (`method "x": want
// rtn or gptq`); a bool Value is not shown (the field's name says it is
// set: "act_order: want method gptq").
func (e *Error) Render(names map[string]string) string {
	name := func(f string) string {
		if n, ok := names[f]; ok && n != "" {
			return n
		}
		return f
	}
	var b strings.Builder
	b.WriteString(name(e.Field))
	switch v := e.Value.(type) {
	case nil, bool:
	case string:
		fmt.Fprintf(&b, " %q", v)
	default:
		fmt.Fprintf(&b, " %v", v)
	}
	b.WriteString(": want ")
	b.WriteString(braced.ReplaceAllStringFunc(e.Want, func(m string) string { return name(m[1 : len(m)-1]) }))
	return b.String()
}

// renamed is an error chain holding an *Error, worded with other names;
// it unwraps to the chain.
type renamed struct {
	msg string
	err error
}

func (r *renamed) Error() string { return r.msg }
func (r *renamed) Unwrap() error { return r.err }

// Rename returns err worded with names when err is (or wraps) an *Error:
// the returned error's text is err's with the *Error's own words
// replaced by Render(names) (a wrapping prefix such as "calibrate: dir: "
// stays), and errors.As and errors.Is still see through it to the
// original chain. Other errors (and nil) are returned unchanged. A Field
// the table leaves out keeps its Go name.
func Rename(err error, names map[string]string) error {
	var fe *Error
	if !errors.As(err, &fe) {
		return err
	}
	return &renamed{msg: strings.Replace(err.Error(), fe.Error(), fe.Render(names), 1), err: err}
}
