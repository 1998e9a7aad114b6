package compress

import (
	"reflect"
	"testing"

	"github.com/lmpack/lmpack/calibrate"
	"github.com/lmpack/lmpack/eval"
	"github.com/lmpack/lmpack/pack"
	"github.com/lmpack/lmpack/prune"
	"github.com/lmpack/lmpack/quantize/oscar"
	"github.com/lmpack/lmpack/quantize/wquant"
)

// TestKeyTablesNameFields: every Go field a recipe-key table renames
// exists in its options type, and every key it names is a recipe key.
func TestKeyTablesNameFields(t *testing.T) {
	keys := map[string]bool{}
	var walk func(t reflect.Type, prefix string)
	walk = func(rt reflect.Type, prefix string) {
		for rt.Kind() == reflect.Pointer {
			rt = rt.Elem()
		}
		for i := range rt.NumField() {
			f := rt.Field(i)
			name := f.Tag.Get("yaml")
			if name == "" {
				continue
			}
			keys[prefix+name] = true
			ft := f.Type
			for ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				walk(ft, prefix+name+".")
			}
		}
	}
	walk(reflect.TypeFor[Recipe](), "")
	for _, c := range []struct {
		table map[string]string
		typ   reflect.Type
	}{
		{calibrateKeys, reflect.TypeFor[calibrate.Options]()},
		{weightsKeys, reflect.TypeFor[wquant.Options]()},
		{kvKeys, reflect.TypeFor[oscar.KVOptions]()},
		{packKeys, reflect.TypeFor[pack.FromOptions]()},
		{pruneKeys, reflect.TypeFor[prune.Options]()},
		{evalKeys, reflect.TypeFor[eval.PerplexityOptions]()},
	} {
		for f, k := range c.table {
			if _, ok := c.typ.FieldByName(f); !ok {
				t.Errorf("%s has no field %s", c.typ, f)
			}
			if !keys[k] {
				t.Errorf("%s.%s: %s is no recipe key", c.typ, f, k)
			}
		}
	}
}
