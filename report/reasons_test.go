package report_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/constant"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/syself/autopilot-health/internal/testenv"

	"github.com/syself/autopilot-health/kmsg"
	"github.com/syself/autopilot-health/report"
)

const (
	modPath    = "github.com/syself/autopilot-health"
	reportPath = modPath + "/report"
)

// linted are the packages whose reasons must be catalog constants: the
// catalog itself, the checks and the kernel monitor.
var linted = []string{reportPath, modPath + "/checks", modPath + "/kmsg"}

// notImplemented are the reasons of checks that are not built yet (listed
// by `check` as Unknown/NotImplemented); nothing returns them. Remove a
// reason from here when its check is written: the test fails until then.
var notImplemented = []report.Reason{}

// checked is the type-checked source of the linted packages (non-test files).
type checked struct {
	fset  *token.FileSet
	pkgs  map[string]*types.Package
	files map[string][]*ast.File
	info  *types.Info
}

var (
	srcOnce sync.Once
	src     *checked
	srcErr  error
)

// typeCheck type-checks the linted packages from source, importing their
// dependencies from the export data `go list -export` builds.
func typeCheck(t *testing.T) *checked {
	t.Helper()
	testenv.StartsProcesses(t) // go list
	srcOnce.Do(func() { src, srcErr = loadSource() })
	if srcErr != nil {
		t.Fatal(srcErr)
	}
	return src
}

func loadSource() (*checked, error) {
	goList := func(args ...string) ([]byte, error) {
		cmd := exec.Command("go", append([]string{"list"}, args...)...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return nil, fmt.Errorf("go list %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
		}
		return out, nil
	}
	out, err := goList(append([]string{"-export", "-deps", "-f", "{{.ImportPath}}\t{{.Export}}"}, linted...)...)
	if err != nil {
		return nil, err
	}
	exports := map[string]string{}
	for line := range strings.Lines(string(out)) {
		path, file, _ := strings.Cut(strings.TrimSpace(line), "\t")
		exports[path] = file
	}
	out, err = goList(append([]string{"-deps", "-json=ImportPath,Dir,GoFiles"}, linted...)...)
	if err != nil {
		return nil, err
	}
	c := &checked{fset: token.NewFileSet(), pkgs: map[string]*types.Package{}, files: map[string][]*ast.File{},
		info: &types.Info{Types: map[ast.Expr]types.TypeAndValue{}, Uses: map[*ast.Ident]types.Object{}}}
	imp := importer.ForCompiler(c.fset, "gc", func(path string) (io.ReadCloser, error) {
		if exports[path] == "" {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(exports[path])
	})
	// The linted packages are checked in dependency order (report first),
	// each importing the others from this check, so their objects are shared.
	conf := types.Config{Importer: importerFunc(func(path string) (*types.Package, error) {
		if p, ok := c.pkgs[path]; ok {
			return p, nil
		}
		return imp.Import(path)
	})}
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var lp struct {
			ImportPath, Dir string
			GoFiles         []string
		}
		if err := dec.Decode(&lp); err != nil {
			return nil, err
		}
		if !slices.Contains(linted, lp.ImportPath) {
			continue
		}
		var files []*ast.File
		for _, name := range lp.GoFiles {
			f, err := parser.ParseFile(c.fset, filepath.Join(lp.Dir, name), nil, parser.SkipObjectResolution)
			if err != nil {
				return nil, err
			}
			files = append(files, f)
		}
		p, err := conf.Check(lp.ImportPath, c.fset, files, c.info)
		if err != nil {
			return nil, fmt.Errorf("type-checking %s: %v", lp.ImportPath, err)
		}
		c.pkgs[lp.ImportPath], c.files[lp.ImportPath] = p, files
	}
	for _, p := range linted {
		if c.pkgs[p] == nil {
			return nil, fmt.Errorf("go list did not list %s", p)
		}
	}
	return c, nil
}

type importerFunc func(path string) (*types.Package, error)

func (f importerFunc) Import(path string) (*types.Package, error) { return f(path) }

func (c *checked) isReason(t types.Type) bool {
	n, ok := t.(*types.Named)
	return ok && n.Obj().Pkg() == c.pkgs[reportPath] && n.Obj().Name() == "Reason"
}

// reasonConsts returns the reason constants the catalog declares, by value.
func (c *checked) reasonConsts() map[report.Reason]*types.Const {
	out := map[report.Reason]*types.Const{}
	scope := c.pkgs[reportPath].Scope()
	for _, name := range scope.Names() {
		if k, ok := scope.Lookup(name).(*types.Const); ok && c.isReason(k.Type()) {
			out[report.Reason(constant.StringVal(k.Val()))] = k
		}
	}
	return out
}

// A reason typo must not compile: no reason is written as a literal (which Go
// converts to report.Reason silently) or as a constant of its own; each one
// is a constant of the catalog, used by name.
func TestReasonsAreCatalogConstants(t *testing.T) {
	c := typeCheck(t)
	for _, path := range linted {
		for _, f := range c.files[path] {
			var inConst []ast.Node // the const declarations of package report, where the values are written
			ast.Inspect(f, func(n ast.Node) bool {
				if n == nil {
					return true
				}
				if d, ok := n.(*ast.GenDecl); ok && d.Tok == token.CONST && path == reportPath {
					inConst = append(inConst, d)
				}
				e, ok := n.(ast.Expr)
				if !ok {
					return true
				}
				tv, ok := c.info.Types[e]
				if !ok || tv.Value == nil || !c.isReason(tv.Type) {
					return true
				}
				pos := c.fset.Position(e.Pos())
				switch e := e.(type) {
				case *ast.Ident:
					if k, ok := c.info.Uses[e].(*types.Const); ok && k.Pkg() == c.pkgs[reportPath] {
						return false
					}
				case *ast.SelectorExpr:
					if k, ok := c.info.Uses[e.Sel].(*types.Const); ok && k.Pkg() == c.pkgs[reportPath] {
						return false
					}
				case *ast.BasicLit:
					if slices.ContainsFunc(inConst, func(d ast.Node) bool { return d.Pos() <= e.Pos() && e.End() <= d.End() }) {
						return false
					}
				}
				t.Errorf("%s: reason %s written as %s; use the report.Reason... constant of its catalog row", pos, tv.Value, types.ExprString(e))
				return false
			})
		}
	}
}

// Every reason constant is in a catalog row, every row's reason is a
// declared constant, and every reason is returned by some check or kernel
// rule (or its check is not implemented yet).
func TestEveryReasonIsInTheCatalogAndUsed(t *testing.T) {
	c := typeCheck(t)
	consts := c.reasonConsts()
	inRows := map[report.Reason]string{}
	add := func(r report.Reason, where string) {
		if consts[r] == nil {
			t.Errorf("%s: reason %q is not a declared report.Reason constant", where, r)
		}
		if prev, dup := inRows[r]; dup {
			t.Errorf("%s: reason %q is also a reason of %s", where, r, prev)
		}
		inRows[r] = where
	}
	for _, r := range report.UnknownReasons {
		add(r, "UnknownReasons")
	}
	for _, d := range report.Conditions {
		add(d.HealthyReason, d.Type)
		for _, r := range d.ProblemReasons {
			add(r, d.Type)
		}
		for _, r := range d.UnknownReasons {
			add(r, d.Type)
		}
	}
	for r, k := range consts {
		if _, ok := inRows[r]; !ok {
			t.Errorf("%s: %s is in no catalog row", c.fset.Position(k.Pos()), k.Name())
		}
	}

	// Returned: the constant is used by name outside package report, or a
	// kernel rule sets its condition with it (the rules are data: their
	// reasons are strings, validated when the rules are built).
	used := map[report.Reason]bool{}
	for _, path := range linted {
		if path == reportPath {
			continue // the rows themselves
		}
		for _, f := range c.files[path] {
			ast.Inspect(f, func(n ast.Node) bool {
				if id, ok := n.(*ast.Ident); ok {
					if k, ok := c.info.Uses[id].(*types.Const); ok && c.isReason(k.Type()) {
						used[report.Reason(constant.StringVal(k.Val()))] = true
					}
				}
				return true
			})
		}
	}
	for _, r := range kmsg.DefaultRules {
		if r.Kind == kmsg.Perm {
			if d, _ := report.Lookup(r.Condition); !d.ValidReason(report.StatusTrue, report.Reason(r.Reason)) {
				t.Errorf("kernel rule %s: reason %q is not one of %s", r.Name, r.Reason, r.Condition)
			}
			used[report.Reason(r.Reason)] = true
		}
	}
	for _, d := range report.Conditions {
		want := append(slices.Clone(d.ProblemReasons), d.UnknownReasons...)
		if d.Source == report.SourceCheck || d.Source == report.SourceTamper {
			// A kernel condition's healthy reason is set by the monitor
			// from the row (report.ConditionDesc.HealthyReason).
			want = append([]report.Reason{d.HealthyReason}, want...)
		}
		for _, r := range want {
			switch exempt := slices.Contains(notImplemented, r); {
			case !used[r] && !exempt:
				t.Errorf("%s: reason %s is returned by no check or kernel rule", d.Type, r)
			case used[r] && exempt:
				t.Errorf("%s: reason %s is returned now; remove it from notImplemented", d.Type, r)
			}
		}
	}
	for _, r := range report.UnknownReasons {
		if !used[r] {
			t.Errorf("shared reason %s is used nowhere", r)
		}
	}
}
