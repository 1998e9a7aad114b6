package model

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

const modulePath = "github.com/lmpack/lmpack"

// repoRoot returns the directory holding go.mod above this package.
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the model package")
		}
		dir = parent
	}
}

// goFile is one parsed non-test Go file of the repository.
type goFile struct {
	rel  string // slash-separated path from the repository root
	pkg  string // package directory, slash-separated ("." for the root)
	file *ast.File
}

// parseRepo parses every non-test .go file of the repository (imports and
// declarations; testdata, hidden and vendor directories skipped).
func parseRepo(t *testing.T) []goFile {
	t.Helper()
	root := repoRoot(t)
	fset := token.NewFileSet()
	var files []goFile
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if p != root && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" || name == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		files = append(files, goFile{rel: rel, pkg: path.Dir(rel), file: f})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no Go files found")
	}
	return files
}

// stagePackage reports whether the package directory dir is one of the
// packages below the command-line facade: the stages, the formats, the
// runtime and model itself.
func stagePackage(dir string) bool {
	for _, p := range []string{"calibrate", "prune", "quantize", "pack", "formats", "runtime", "model"} {
		if dir == p || strings.HasPrefix(dir, p+"/") {
			return true
		}
	}
	return false
}

// TestNoStageImportsEngine: no non-test file of a stage package
// (calibrate, prune/..., quantize/..., pack, formats/..., runtime/...,
// model) imports internal/engine, the facade of cmd, compress and eval.
func TestNoStageImportsEngine(t *testing.T) {
	files := parseRepo(t)
	stages := 0
	for _, f := range files {
		if !stagePackage(f.pkg) {
			continue
		}
		stages++
		for _, im := range f.file.Imports {
			p, _ := strconv.Unquote(im.Path.Value)
			if p == modulePath+"/internal/engine" {
				t.Errorf("%s (package %s) imports internal/engine; stages open models through package model", f.rel, f.pkg)
			}
		}
	}
	if stages == 0 {
		t.Fatal("no stage package files found")
	}
}

var versionSuffix = regexp.MustCompile(`^v[0-9]+$`)

// importNames returns the names under which f refers to its imports
// (the alias, or the package name guessed from the path: its last
// element, skipping a major-version element, without a ".vN" suffix or a
// "go-" prefix).
func importNames(f *ast.File) map[string]string {
	names := map[string]string{}
	for _, im := range f.Imports {
		p, _ := strconv.Unquote(im.Path.Value)
		if im.Name != nil {
			if im.Name.Name != "_" && im.Name.Name != "." {
				names[im.Name.Name] = p
			}
			continue
		}
		parts := strings.Split(p, "/")
		n := parts[len(parts)-1]
		if versionSuffix.MatchString(n) && len(parts) > 1 {
			n = parts[len(parts)-2]
		}
		if i := strings.Index(n, ".v"); i > 0 {
			n = n[:i]
		}
		n = strings.TrimPrefix(n, "go-")
		names[n] = p
	}
	return names
}

// rootSelector returns the package name and identifier of an assignment
// target pkg.X, pkg.X.Field, pkg.X[i] or *pkg.X, or "" when the target
// does not start with a qualified identifier.
func rootSelector(e ast.Expr) (pkg, name string) {
	for {
		switch x := e.(type) {
		case *ast.ParenExpr:
			e = x.X
		case *ast.StarExpr:
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		case *ast.IndexListExpr:
			e = x.X
		case *ast.SelectorExpr:
			if id, ok := x.X.(*ast.Ident); ok {
				return id.Name, x.Sel.Name
			}
			e = x.X
		default:
			return "", ""
		}
	}
}

// initAssignments lists, as "file: init assigns pkg.Name", every
// assignment (=, op=, ++, --) in a func init of f whose target is an
// identifier of an imported package.
func initAssignments(rel string, f *ast.File) []string {
	imports := importNames(f)
	var out []string
	check := func(e ast.Expr) {
		if pkg, name := rootSelector(e); pkg != "" {
			if p, ok := imports[pkg]; ok {
				out = append(out, rel+": init assigns "+pkg+"."+name+" of package "+p)
			}
		}
	}
	for _, d := range f.Decls {
		fd, ok := d.(*ast.FuncDecl)
		if !ok || fd.Recv != nil || fd.Name.Name != "init" || fd.Body == nil {
			continue
		}
		ast.Inspect(fd.Body, func(n ast.Node) bool {
			switch s := n.(type) {
			case *ast.AssignStmt:
				for _, l := range s.Lhs {
					check(l)
				}
			case *ast.IncDecStmt:
				check(s.X)
			}
			return true
		})
	}
	return out
}

// TestNoInitSetsOtherPackages: no init function of a non-test file
// assigns to an identifier of another package (a package variable set
// from another package's init hides a dependency the import graph should
// show).
func TestNoInitSetsOtherPackages(t *testing.T) {
	for _, f := range parseRepo(t) {
		for _, msg := range initAssignments(f.rel, f.file) {
			t.Error(msg)
		}
	}
}

// TestInitAssignmentsDetector: the detector flags assignments to another
// package's identifiers in init (plain, field, index, pointer, op= and
// ++), and not assignments to the file's own variables, calls, or
// assignments outside init.
func TestInitAssignmentsDetector(t *testing.T) {
	src := `package p

import (
	eng "example.com/x/engine"
	"example.com/y/reg"
	"math/rand/v2"
	yaml "gopkg.in/yaml.v3"
)

var own int
var table = map[string]int{}

func init() {
	eng.Opener = nil
	reg.Table["a"] = 1
	reg.Conf.Field = 2
	*reg.Ptr = 3
	rand.Seed += 1
	yaml.Count++
	own = 4
	table["b"] = 5
	reg.Register("c")
	x := 1
	_ = x
}

func notInit() { reg.Other = 1 }
`
	f, err := parser.ParseFile(token.NewFileSet(), "p.go", src, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	got := initAssignments("p.go", f)
	want := []string{
		"p.go: init assigns eng.Opener of package example.com/x/engine",
		"p.go: init assigns reg.Table of package example.com/y/reg",
		"p.go: init assigns reg.Conf of package example.com/y/reg",
		"p.go: init assigns reg.Ptr of package example.com/y/reg",
		"p.go: init assigns rand.Seed of package math/rand/v2",
		"p.go: init assigns yaml.Count of package gopkg.in/yaml.v3",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
