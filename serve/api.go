package serve

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strings"
	"unicode/utf8"
)

// apiError is an error answered in OpenAI's shape:
// {"error": {"message", "type", "param", "code"}} with HTTP status Status.
// Param names the request field at fault ("" when none: JSON null).
type apiError struct {
	Status  int
	Message string
	Type    string
	Param   string
	Code    string
}

func (e *apiError) Error() string { return e.Message }

// badRequest is a 400 invalid_request_error naming param.
func badRequest(param, format string, a ...any) *apiError {
	return &apiError{Status: http.StatusBadRequest, Type: "invalid_request_error", Param: param, Message: fmt.Sprintf(format, a...)}
}

// unsupported is a 400 naming a parameter lmpack serve does not implement.
func unsupported(param, why string) *apiError {
	e := badRequest(param, "parameter %q is not supported by lmpack serve: %s", param, why)
	e.Code = "unsupported_parameter"
	return e
}

type errorBody struct {
	Error errorObject `json:"error"`
}

type errorObject struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

func optString(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func (e *apiError) body() errorBody {
	return errorBody{Error: errorObject{Message: e.Message, Type: e.Type, Param: optString(e.Param), Code: optString(e.Code)}}
}

// writeError answers e as JSON with its status (and Retry-After for 503).
func writeError(w http.ResponseWriter, e *apiError) {
	if r, ok := w.(*recorder); ok {
		r.errCode = e.Code
	}
	if e.Status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "1")
	}
	writeJSON(w, e.Status, e.body())
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b = []byte(`{"error":{"message":"internal error: response did not encode","type":"server_error","param":null,"code":null}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}

// fields is a request body's top-level object, each value still raw JSON.
// Decoding it key by key lets every error name its field, and lets the
// endpoint refuse keys it does not know.
type fields map[string]json.RawMessage

// parseBody decodes body as one JSON object. Errors (400): invalid JSON
// naming the byte offset, a value that is not an object, trailing data.
func parseBody(body []byte) (fields, *apiError) {
	dec := json.NewDecoder(bytes.NewReader(body))
	var f fields
	if err := dec.Decode(&f); err != nil {
		var se *json.SyntaxError
		var te *json.UnmarshalTypeError
		switch {
		case errors.As(err, &se):
			return nil, badRequest("", "request body is not valid JSON: %v (at byte offset %d)", se, se.Offset)
		case errors.As(err, &te):
			return nil, badRequest("", "request body must be a JSON object, got a JSON %s", te.Value)
		case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
			return nil, badRequest("", "request body is not valid JSON: unexpected end of input (at byte offset %d)", len(body))
		default:
			return nil, badRequest("", "request body is not valid JSON: %v", err)
		}
	}
	if f == nil {
		return nil, badRequest("", "request body must be a JSON object, got null")
	}
	if dec.More() {
		return nil, badRequest("", "request body is not valid JSON: data after the object (at byte offset %d)", dec.InputOffset())
	}
	return f, nil
}

// checkKnown refuses the first key (in sorted order) that is not in known:
// OpenAI's API answers an unrecognized request argument with 400 (vLLM's
// protocol only logs a warning for extra fields; lmpack follows OpenAI's
// stricter rule so that a misspelled parameter is never silently ignored).
func (f fields) checkKnown(known []string) *apiError {
	keys := make([]string, 0, len(f))
	for k := range f {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if !slices.Contains(known, k) {
			return badRequest(k, "unrecognized request argument %q", k)
		}
	}
	return nil
}

// has reports whether key is present and not JSON null.
func (f fields) has(key string) bool {
	raw, ok := f[key]
	return ok && !isNull(raw)
}

func isNull(raw json.RawMessage) bool { return string(bytes.TrimSpace(raw)) == "null" }

// get decodes key into dst when present and not null; a wrong type is a
// 400 naming key and the type wanted.
func (f fields) get(key string, dst any, want string) (bool, *apiError) {
	if !f.has(key) {
		return false, nil
	}
	if err := json.Unmarshal(f[key], dst); err != nil {
		return true, badRequest(key, "%q must be %s, got %s", key, want, preview(f[key]))
	}
	return true, nil
}

// preview is a short quote of a raw JSON value for error messages.
func preview(raw json.RawMessage) string {
	s := string(bytes.TrimSpace(raw))
	if len(s) > 40 {
		s = s[:40] + "…"
	}
	return strings.ToValidUTF8(s, "?")
}

// getInt decodes an integer field (a JSON number without fraction).
func (f fields) getInt(key string, dst *int) (bool, *apiError) {
	var x float64
	ok, e := f.get(key, &x, "an integer")
	if !ok || e != nil {
		return ok, e
	}
	if x != math.Trunc(x) {
		return true, badRequest(key, "%q must be an integer, got %s", key, preview(f[key]))
	}
	if math.Abs(x) > 1<<53 {
		return true, badRequest(key, "%q %s is out of range: want an integer in [-2^53, 2^53]", key, preview(f[key]))
	}
	*dst = int(x)
	return true, nil
}

// getFloat decodes a finite number field.
func (f fields) getFloat(key string, dst *float64) (bool, *apiError) {
	return f.get(key, dst, "a number")
}

// getBool decodes a boolean field.
func (f fields) getBool(key string, dst *bool) (bool, *apiError) {
	return f.get(key, dst, "a boolean")
}

// getString decodes a string field; invalid UTF-8 (a JSON string holding
// an unpaired surrogate escape decodes to U+FFFD and is accepted; raw
// invalid bytes are refused) is a 400 naming the field.
func (f fields) getString(key string, dst *string) (bool, *apiError) {
	ok, e := f.get(key, dst, "a string")
	if !ok || e != nil {
		return ok, e
	}
	if e := checkUTF8(key, f[key]); e != nil {
		return true, e
	}
	return true, nil
}

// checkUTF8 refuses a raw JSON value holding bytes that are not valid
// UTF-8 (encoding/json would silently replace them with U+FFFD), naming
// param and the byte offset in the value.
func checkUTF8(param string, raw json.RawMessage) *apiError {
	if utf8.Valid(raw) {
		return nil
	}
	off := 0
	for off < len(raw) {
		r, n := utf8.DecodeRune(raw[off:])
		if r == utf8.RuneError && n <= 1 {
			break
		}
		off += n
	}
	return badRequest(param, "%q is not valid UTF-8 (first bad byte at offset %d of its JSON value)", param, off)
}

// unsupportedUnless refuses key unless it is absent, null, or one of the
// JSON values allowed (compared after trimming space), e.g. n: 1.
func (f fields) unsupportedUnless(key, why string, allowed ...string) *apiError {
	if !f.has(key) {
		return nil
	}
	v := string(bytes.TrimSpace(f[key]))
	if slices.Contains(allowed, v) {
		return nil
	}
	return unsupported(key, why)
}

// Limits of stop: OpenAI allows 4 strings, vLLM and llama-server any
// number; lmpack allows maxStops of at most maxStopBytes bytes each, so
// that matching them costs little per token.
const (
	maxStops     = 16
	maxStopBytes = 256
)

// stopList decodes OpenAI's stop: a string or a list of strings (empty
// strings refused: they would match at once; more than maxStops strings
// or one longer than maxStopBytes refused).
func (f fields) stopList() ([]string, *apiError) {
	if !f.has("stop") {
		return nil, nil
	}
	if e := checkUTF8("stop", f["stop"]); e != nil {
		return nil, e
	}
	var one string
	if err := json.Unmarshal(f["stop"], &one); err == nil {
		if one == "" {
			return nil, badRequest("stop", `"stop" must not be an empty string`)
		}
		if len(one) > maxStopBytes {
			return nil, badRequest("stop", `"stop" is %d bytes long: at most %d`, len(one), maxStopBytes)
		}
		return []string{one}, nil
	}
	var list []string
	if err := json.Unmarshal(f["stop"], &list); err != nil {
		return nil, badRequest("stop", `"stop" must be a string or a list of strings, got %s`, preview(f["stop"]))
	}
	if len(list) > maxStops {
		return nil, badRequest("stop", `"stop" holds %d strings: at most %d`, len(list), maxStops)
	}
	for i, s := range list {
		if s == "" {
			return nil, badRequest("stop", `"stop"[%d] must not be an empty string`, i)
		}
		if len(s) > maxStopBytes {
			return nil, badRequest("stop", `"stop"[%d] is %d bytes long: at most %d`, i, len(s), maxStopBytes)
		}
	}
	return list, nil
}
