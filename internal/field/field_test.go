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
		{&Error{Field: "Tokens", Value: -5, Want: "> 0"}, nil, "Tokens -5: want > 0"},
		{&Error{Field: "Tokens", Value: -5, Want: "> 0"}, map[string]string{"Tokens": "--tokens"}, "--tokens -5: want > 0"},
		{&Error{Field: "Method", Value: "x", Want: "rtn or gptq"}, map[string]string{"Method": "quantize.weights.method"}, `quantize.weights.method "x": want rtn or gptq`},
		{&Error{Field: "ActOrder", Value: true, Want: "{Method} gptq"}, map[string]string{"ActOrder": "--act-order", "Method": "--method"}, "--act-order: want --method gptq"},
		{&Error{Field: "Bits", Value: nil, Want: "exactly one of {Bits} and {TargetBPW}"}, map[string]string{"Bits": "bits"}, "bits: want exactly one of bits and TargetBPW"},
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
	cause := errors.New("depth: layer is protected")
	if err := Rename(fmt.Errorf("prune: %w", &Error{Field: "Method", Value: "list:0", Want: "layers it can lose", Err: cause}), map[string]string{"Method": "--layer-method"}); !errors.Is(err, cause) || err.Error() != `prune: --layer-method "list:0": want layers it can lose` {
		t.Errorf("Rename with a cause: %v (errors.Is %v)", err, errors.Is(err, cause))
	}
}
