package field

import (
	"errors"
	"fmt"
	"testing"
)

func TestRender(t *testing.T) {
	cases := []struct {
		err   *Error
		names map[string]string
		want  string
	}{
		{&Error{"Tokens", -5, "> 0"}, nil, "Tokens -5: want > 0"},
		{&Error{"Tokens", -5, "> 0"}, map[string]string{"Tokens": "--tokens"}, "--tokens -5: want > 0"},
		{&Error{"Method", "x", "rtn or gptq"}, map[string]string{"Method": "quantize.weights.method"}, `quantize.weights.method "x": want rtn or gptq`},
		{&Error{"ActOrder", true, "{Method} gptq"}, map[string]string{"ActOrder": "--act-order", "Method": "--method"}, "--act-order: want --method gptq"},
		{&Error{"Bits", nil, "exactly one of {Bits} and {TargetBPW}"}, map[string]string{"Bits": "bits"}, "bits: want exactly one of bits and TargetBPW"},
	}
	for _, c := range cases {
		if got := c.err.Render(c.names); got != c.want {
			t.Errorf("Render = %q, want %q", got, c.want)
		}
	}
}

func TestRenameWrapped(t *testing.T) {
	sentinel := errors.New("stage: bad options")
	err := fmt.Errorf("%w: %w", sentinel, New("Ctx", 1, ">= 2"))
	r := Rename(err, map[string]string{"Ctx": "--ctx"})
	if r.Error() != "stage: bad options: --ctx 1: want >= 2" {
		t.Errorf("Rename = %q", r)
	}
	var fe *Error
	if !errors.As(r, &fe) || fe.Field != "Ctx" {
		t.Errorf("errors.As after Rename: %v", fe)
	}
	if !errors.Is(r, sentinel) {
		t.Error("Rename hid the sentinel")
	}
	if other := errors.New("io"); Rename(other, nil) != other {
		t.Error("Rename changed a non-field error")
	}
	if got := Fields(New("ActOrder", true, "{Method} gptq and {X}")); fmt.Sprint(got) != "[ActOrder Method X]" {
		t.Errorf("Fields = %v", got)
	}
}
