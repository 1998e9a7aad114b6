package cuda

import (
	"go/ast"
	"go/build"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// ptxParams returns each entry's parameter classes from PTX text: "p8"
// for a 64-bit slot (pointers, long long), "i4" for a 32-bit integer,
// "f4" for a float.
func ptxParams(ptx string) map[string][]string {
	out := map[string][]string{}
	entryRE := regexp.MustCompile(`\.entry\s+(\w+)\s*\(([^)]*)\)`)
	paramRE := regexp.MustCompile(`\.param\s+\.([a-z]+)(\d+)\s`)
	for _, m := range entryRE.FindAllStringSubmatch(ptx, -1) {
		var cls []string
		for _, p := range paramRE.FindAllStringSubmatch(m[2], -1) {
			switch {
			case p[2] == "64":
				cls = append(cls, "p8")
			case p[1] == "f" && p[2] == "32":
				cls = append(cls, "f4")
			case p[2] == "32":
				cls = append(cls, "i4")
			default:
				cls = append(cls, "?"+p[1]+p[2])
			}
		}
		out[m[1]] = cls
	}
	return out
}

// argClass is the PTX class Module.launch gives a Go argument type, or
// "" for a type it refuses.
func argClass(t types.Type) string {
	if n, ok := t.(*types.Named); ok && n.Obj().Name() == "DevPtr" {
		return "p8"
	}
	b, ok := t.Underlying().(*types.Basic)
	if !ok {
		return ""
	}
	switch b.Kind() {
	case types.Int, types.Int32, types.Uint32, types.UntypedInt:
		return "i4"
	case types.Float32:
		return "f4"
	case types.Int64, types.Uint64:
		return "p8"
	}
	return ""
}

// TestLaunchSignatures: every Launch and LaunchShared call in the
// package (tests included) passes as many arguments as its kernel has
// parameters, each of the width and kind (64-bit, 32-bit integer, float)
// the kernel's PTX declares, so a kernel whose signature changes cannot
// be launched with the old argument list (which only a GPU would
// notice). The kernel name must be a string literal, a literal prefix
// plus a suffix (every entry with that prefix is checked) or a
// fmt.Sprintf of a literal format (every entry it can match).
func TestLaunchSignatures(t *testing.T) {
	nv := nvrtcForTest(t)
	params := map[string][]string{}
	for _, s := range Sources() {
		ptx, err := nv.Compile(s.Name, s.Code, 80)
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range ptxParams(ptx) {
			params[k] = v
		}
	}
	if len(params["gemv_q"]) != 14 {
		t.Fatalf("PTX gemv_q has %d parameters %v, want 14 (parser check)", len(params["gemv_q"]), params["gemv_q"])
	}
	fset := token.NewFileSet()
	names, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	for _, n := range names {
		// Only the files this build compiles (dl_linux.go or dl_other.go,
		// not both).
		if ok, err := build.Default.MatchFile(".", n); err != nil {
			t.Fatal(err)
		} else if !ok {
			continue
		}
		f, err := parser.ParseFile(fset, n, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		if f.Name.Name == "cuda" { // not the external cuda_test package
			files = append(files, f)
		}
	}
	info := &types.Info{Types: map[ast.Expr]types.TypeAndValue{}, Defs: map[*ast.Ident]types.Object{}, Uses: map[*ast.Ident]types.Object{}}
	conf := types.Config{Importer: importer.ForCompiler(fset, "source", nil)}
	if _, err := conf.Check("github.com/lmpack/lmpack/runtime/cuda", fset, files, info); err != nil {
		t.Fatalf("type-checking the package: %v", err)
	}
	strs := stringValues(files, info)
	sites := 0
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || (sel.Sel.Name != "Launch" && sel.Sel.Name != "LaunchShared") {
				return true
			}
			if rt := info.TypeOf(sel.X); rt == nil || !strings.HasSuffix(rt.String(), "cuda.Kernels") {
				return true
			}
			pos := fset.Position(call.Pos())
			skip := 3 // name, grid, block
			if sel.Sel.Name == "LaunchShared" {
				skip = 4 // and shmem
			}
			if call.Ellipsis.IsValid() || len(call.Args) < skip {
				return true // a forwarding call (args...)
			}
			kernels := launchNames(call.Args[0], params, strs, info)
			if len(kernels) == 0 {
				t.Errorf("%s: cannot tell which kernel %s launches", pos, types.ExprString(call.Args[0]))
				return true
			}
			var got []string
			for _, a := range call.Args[skip:] {
				c := argClass(info.TypeOf(a))
				if c == "" {
					c = "?" + info.TypeOf(a).String()
				}
				got = append(got, c)
			}
			for _, k := range kernels {
				if want := params[k]; !slices.Equal(got, want) {
					t.Errorf("%s: %s launched with %d arguments %v, its PTX has %d parameters %v", pos, k, len(got), got, len(want), want)
				}
			}
			sites++
			return true
		})
	}
	t.Logf("%d launch sites checked against %d PTX entries", sites, len(params))
	if sites < 20 {
		t.Errorf("%d launch sites found, want at least 20 (parser check)", sites)
	}
}

// stringValues returns, for each string variable of files, the string
// literals assigned to it (a variable also assigned anything else maps
// to nil).
func stringValues(files []*ast.File, info *types.Info) map[types.Object][]string {
	vals := map[types.Object][]string{}
	other := map[types.Object]bool{}
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			as, ok := n.(*ast.AssignStmt)
			if !ok || len(as.Lhs) != len(as.Rhs) {
				return true
			}
			for i, l := range as.Lhs {
				id, ok := l.(*ast.Ident)
				if !ok {
					continue
				}
				obj := info.Defs[id]
				if obj == nil {
					obj = info.Uses[id]
				}
				if obj == nil {
					continue
				}
				if b, ok := as.Rhs[i].(*ast.BasicLit); ok && b.Kind == token.STRING {
					if v, err := strconv.Unquote(b.Value); err == nil {
						vals[obj] = append(vals[obj], v)
						continue
					}
				}
				other[obj] = true
			}
			return true
		})
	}
	for o := range other {
		delete(vals, o)
	}
	return vals
}

// launchNames resolves a Launch call's kernel-name expression to the PTX
// entries it can name (nil when it cannot tell): a literal; a literal
// plus a variable assigned only literals (each value); a fmt.Sprintf of a
// literal format (every entry it matches).
func launchNames(e ast.Expr, params map[string][]string, strs map[types.Object][]string, info *types.Info) []string {
	var all []string
	for k := range params {
		all = append(all, k)
	}
	slices.Sort(all)
	lit := func(e ast.Expr) (string, bool) {
		b, ok := e.(*ast.BasicLit)
		if !ok || b.Kind != token.STRING {
			return "", false
		}
		s, err := strconv.Unquote(b.Value)
		return s, err == nil
	}
	if s, ok := lit(e); ok {
		if _, ok := params[s]; ok {
			return []string{s}
		}
		return nil
	}
	var re *regexp.Regexp
	switch e := e.(type) {
	case *ast.BinaryExpr:
		p, ok := lit(e.X)
		id, isID := e.Y.(*ast.Ident)
		if !ok || e.Op != token.ADD || !isID || len(strs[info.Uses[id]]) == 0 {
			return nil
		}
		var out []string
		for _, v := range strs[info.Uses[id]] {
			if _, ok := params[p+v]; !ok {
				return nil
			}
			out = append(out, p+v)
		}
		return out
	case *ast.CallExpr:
		if types.ExprString(e.Fun) == "fmt.Sprintf" && len(e.Args) > 0 {
			if f, ok := lit(e.Args[0]); ok {
				parts := regexp.MustCompile(`%[dsv]`).Split(f, -1)
				for i := range parts {
					parts[i] = regexp.QuoteMeta(parts[i])
				}
				re = regexp.MustCompile("^" + strings.Join(parts, `\w+`) + "$")
			}
		}
	}
	if re == nil {
		return nil
	}
	var out []string
	for _, k := range all {
		if re.MatchString(k) {
			out = append(out, k)
		}
	}
	return out
}
