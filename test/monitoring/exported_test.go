// SPDX-License-Identifier: Apache-2.0

package monitoring

import (
	"errors"
	"fmt"
	"go/ast"
	goparser "go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// This file finds the metrics dkc exports by reading its source, not by running it: every metric dkc
// registers is declared by a composite literal of client_golang's prometheus.*Opts (or a prometheus.NewDesc
// call) whose Namespace, Subsystem and Name are constants — string literals, the package's constants, or
// the parameter of a local helper called with literals (sidecar/internal/agent's gauge). Anything else is
// an error, not a silent omission: a metric declared in a way this file cannot read must make the test
// fail until the reader learns the new form.

// promPath is client_golang's prometheus package.
const promPath = "github.com/prometheus/client_golang/prometheus"

// kind says which series a metric family exposes.
type kind int

const (
	kindPlain     kind = iota // counter, gauge, untyped: the name itself
	kindHistogram             // name_bucket, name_sum, name_count
	kindSummary               // name (quantiles), name_sum, name_count
)

var optsKinds = map[string]kind{
	"Opts": kindPlain, "CounterOpts": kindPlain, "GaugeOpts": kindPlain, "UntypedOpts": kindPlain,
	"HistogramOpts": kindHistogram, "SummaryOpts": kindSummary,
}

// family is one metric family dkc exports, the label names its own code gives it (a *Vec's or a Desc's
// variable labels), and where it is declared.
type family struct {
	name   string
	kind   kind
	labels []string
	pos    string
}

// exported is what dkc's source declares.
type exported struct {
	families map[string]family
	// typed holds the values of string constants by their declared type's name (Phase: the phases that
	// dkc_sidecar_phase's label takes).
	typed map[string][]string
}

// series says whether a series name belongs to an exported family, and which.
func (e exported) series(name string) (family, bool) {
	if f, ok := e.families[name]; ok && f.kind != kindHistogram {
		return f, true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(name, suffix)
		if !ok {
			continue
		}
		if f, ok := e.families[base]; ok && (f.kind == kindHistogram || f.kind == kindSummary && suffix != "_bucket") {
			return f, true
		}
	}
	return family{}, false
}

// readExported parses every non-test Go file under root, but for the directories that ship no program
// (test/, hack/) and those Go ignores (testdata, names starting with . or _).
func readExported(root string) (exported, error) {
	e := exported{families: map[string]family{}, typed: map[string][]string{}}
	dirs := map[string][]string{} // directory -> its .go files
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			rel, _ := filepath.Rel(root, path)
			name := d.Name()
			if path != root && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" || name == "vendor" ||
				rel == "test" || rel == "hack") {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, "_test.go") {
			dirs[filepath.Dir(path)] = append(dirs[filepath.Dir(path)], path)
		}
		return nil
	})
	if err != nil {
		return e, fmt.Errorf("walk %s: %w", root, err)
	}
	var errs []error
	fset := token.NewFileSet()
	for _, files := range dirs {
		var pkg []*ast.File
		for _, f := range files {
			file, err := goparser.ParseFile(fset, f, nil, goparser.SkipObjectResolution)
			if err != nil {
				return e, fmt.Errorf("parse %s: %w", f, err)
			}
			pkg = append(pkg, file)
		}
		r := &reader{fset: fset, root: root, files: pkg, consts: map[string]string{}}
		r.readConsts(e.typed)
		for _, file := range pkg {
			errs = append(errs, r.readFile(file, e.families)...)
		}
	}
	return e, errors.Join(errs...)
}

// reader reads one package.
type reader struct {
	fset   *token.FileSet
	root   string
	files  []*ast.File
	consts map[string]string // the package's top-level string constants
}

func (r *reader) pos(p token.Pos) string {
	position := r.fset.Position(p)
	if rel, err := filepath.Rel(r.root, position.Filename); err == nil {
		position.Filename = rel
	}
	return position.String()
}

// readConsts records the package's top-level string constants, and by type those declared with one.
func (r *reader) readConsts(typed map[string][]string) {
	for _, file := range r.files {
		for _, decl := range file.Decls {
			gen, ok := decl.(*ast.GenDecl)
			if !ok || gen.Tok != token.CONST {
				continue
			}
			for _, spec := range gen.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, name := range vs.Names {
					if i >= len(vs.Values) {
						continue // iota and implicit repetition: never a metric name
					}
					lit, ok := vs.Values[i].(*ast.BasicLit)
					if !ok || lit.Kind != token.STRING {
						continue
					}
					v, err := strconv.Unquote(lit.Value)
					if err != nil {
						continue
					}
					r.consts[name.Name] = v
					if t, ok := vs.Type.(*ast.Ident); ok {
						typed[t.Name] = append(typed[t.Name], v)
					}
				}
			}
		}
	}
}

// promAlias is the name file imports client_golang's prometheus package as, or "".
func promAlias(file *ast.File) string {
	for _, imp := range file.Imports {
		if p, _ := strconv.Unquote(imp.Path.Value); p == promPath {
			if imp.Name != nil {
				return imp.Name.Name
			}
			return "prometheus"
		}
	}
	return ""
}

// readFile adds the families file declares.
func (r *reader) readFile(file *ast.File, into map[string]family) []error {
	alias := promAlias(file)
	if alias == "" {
		return nil
	}
	isProm := func(e ast.Expr, names ...string) (string, bool) {
		sel, ok := e.(*ast.SelectorExpr)
		if !ok {
			return "", false
		}
		x, ok := sel.X.(*ast.Ident)
		if !ok || x.Name != alias {
			return "", false
		}
		for _, n := range names {
			if sel.Sel.Name == n {
				return n, true
			}
		}
		return "", false
	}
	optsNames := make([]string, 0, len(optsKinds))
	for n := range optsKinds {
		optsNames = append(optsNames, n)
	}
	var errs []error
	add := func(names []string, k kind, labels []string, at token.Pos) {
		for _, n := range names {
			into[n] = family{name: n, kind: k, labels: labels, pos: r.pos(at)}
		}
	}
	vecs := []string{"NewCounterVec", "NewGaugeVec", "NewHistogramVec", "NewSummaryVec", "NewUntypedVec"}
	var stack []ast.Node
	ast.Inspect(file, func(n ast.Node) bool {
		if n == nil {
			stack = stack[:len(stack)-1]
			return true
		}
		stack = append(stack, n)
		switch n := n.(type) {
		case *ast.CompositeLit:
			opts, ok := isProm(n.Type, optsNames...)
			if !ok {
				return true
			}
			fields := map[string]ast.Expr{}
			for _, elt := range n.Elts {
				if kv, ok := elt.(*ast.KeyValueExpr); ok {
					if key, ok := kv.Key.(*ast.Ident); ok {
						fields[key.Name] = kv.Value
					}
				}
			}
			if fields["Name"] == nil {
				errs = append(errs, fmt.Errorf("%s: %s.%s without Name", r.pos(n.Pos()), alias, opts))
				return true
			}
			parts := make([][]string, 3)
			for i, f := range []string{"Namespace", "Subsystem", "Name"} {
				if fields[f] == nil {
					parts[i] = []string{""}
					continue
				}
				v, err := r.values(fields[f], stack)
				if err != nil {
					errs = append(errs, fmt.Errorf("%s: %s.%s %s: %w", r.pos(fields[f].Pos()), alias, opts, f, err))
					return true
				}
				parts[i] = v
			}
			if fields["ConstLabels"] != nil {
				errs = append(errs, fmt.Errorf("%s: %s.%s ConstLabels: not read here", r.pos(n.Pos()), alias, opts))
				return true
			}
			var labels []string
			if len(stack) >= 2 { // the opts of a New*Vec(opts, labels) call: its labels
				if call, ok := stack[len(stack)-2].(*ast.CallExpr); ok && len(call.Args) == 2 && call.Args[0] == n {
					if _, ok := isProm(call.Fun, vecs...); ok {
						v, err := r.labelNames(call.Args[1], stack)
						if err != nil {
							errs = append(errs, fmt.Errorf("%s: label names: %w", r.pos(call.Args[1].Pos()), err))
							return true
						}
						labels = v
					}
				}
			}
			add(fqNames(parts), optsKinds[opts], labels, n.Pos())
		case *ast.CallExpr:
			if _, ok := isProm(n.Fun, "NewDesc"); !ok || len(n.Args) == 0 {
				return true
			}
			var names []string
			var err error
			if call, ok := n.Args[0].(*ast.CallExpr); ok {
				if _, ok := isProm(call.Fun, "BuildFQName"); ok && len(call.Args) == 3 {
					parts := make([][]string, 3)
					for i, a := range call.Args {
						if parts[i], err = r.values(a, stack); err != nil {
							break
						}
					}
					names = fqNames(parts)
				} else {
					err = errors.New("not a constant nor prometheus.BuildFQName of constants")
				}
			} else {
				names, err = r.values(n.Args[0], stack)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %s.NewDesc name: %w", r.pos(n.Args[0].Pos()), alias, err))
				return true
			}
			var labels []string
			if len(n.Args) >= 3 && !isNil(n.Args[2]) {
				if labels, err = r.labelNames(n.Args[2], stack); err != nil {
					errs = append(errs, fmt.Errorf("%s: %s.NewDesc variable labels: %w", r.pos(n.Args[2].Pos()), alias, err))
					return true
				}
			}
			if len(n.Args) >= 4 && !isNil(n.Args[3]) {
				errs = append(errs, fmt.Errorf("%s: %s.NewDesc constant labels: not read here", r.pos(n.Args[3].Pos()), alias))
				return true
			}
			add(names, kindPlain, labels, n.Pos())
		}
		return true
	})
	return errs
}

// fqNames is prometheus.BuildFQName over every combination of the parts' values.
func fqNames(parts [][]string) []string {
	var out []string
	for _, ns := range parts[0] {
		for _, sub := range parts[1] {
			for _, name := range parts[2] {
				if name == "" {
					continue
				}
				var s []string
				for _, p := range []string{ns, sub, name} {
					if p != "" {
						s = append(s, p)
					}
				}
				out = append(out, strings.Join(s, "_"))
			}
		}
	}
	return out
}

// values gives the values e can have: a string literal, a constant of the package, a concatenation of
// those, or a parameter of the enclosing function when that is a local helper (`gauge := func(name, help
// string) ...`) or a function of the package, from the arguments of every call to it. stack is the path
// from the file to e.
func (r *reader) values(e ast.Expr, stack []ast.Node) ([]string, error) {
	switch e := e.(type) {
	case *ast.BasicLit:
		if e.Kind != token.STRING {
			return nil, fmt.Errorf("%s is not a string", e.Value)
		}
		v, err := strconv.Unquote(e.Value)
		if err != nil {
			return nil, err
		}
		return []string{v}, nil
	case *ast.ParenExpr:
		return r.values(e.X, stack)
	case *ast.BinaryExpr:
		if e.Op != token.ADD {
			return nil, fmt.Errorf("operator %s", e.Op)
		}
		left, err := r.values(e.X, stack)
		if err != nil {
			return nil, err
		}
		right, err := r.values(e.Y, stack)
		if err != nil {
			return nil, err
		}
		var out []string
		for _, l := range left {
			for _, rt := range right {
				out = append(out, l+rt)
			}
		}
		return out, nil
	case *ast.Ident:
		if v, ok := r.consts[e.Name]; ok {
			return []string{v}, nil
		}
		return r.parameter(e, stack)
	}
	return nil, fmt.Errorf("cannot read a constant from %T", e)
}

// parameter resolves an identifier that names a parameter of the innermost enclosing function.
func (r *reader) parameter(id *ast.Ident, stack []ast.Node) ([]string, error) {
	for i := len(stack) - 1; i >= 0; i-- {
		var ftype *ast.FuncType
		switch f := stack[i].(type) {
		case *ast.FuncLit:
			ftype = f.Type
		case *ast.FuncDecl:
			ftype = f.Type
		default:
			continue
		}
		index, ok := paramIndex(ftype, id.Name)
		if !ok {
			return nil, fmt.Errorf("%s is neither a constant nor a parameter of the enclosing function", id.Name)
		}
		var name string
		var scope []ast.Node // where calls to the function may be
		switch f := stack[i].(type) {
		case *ast.FuncDecl:
			if f.Recv != nil {
				return nil, fmt.Errorf("%s is a parameter of method %s: its callers are not followed", id.Name, f.Name.Name)
			}
			name = f.Name.Name
			for _, file := range r.files {
				scope = append(scope, file)
			}
		case *ast.FuncLit:
			name = boundName(f, stack[:i])
			if name == "" {
				return nil, fmt.Errorf("%s is a parameter of a function literal not assigned to a name", id.Name)
			}
			for j := i - 1; j >= 0; j-- { // calls within the function that defines the helper
				if fd, ok := stack[j].(*ast.FuncDecl); ok {
					scope = append(scope, fd.Body)
					break
				}
				if fl, ok := stack[j].(*ast.FuncLit); ok {
					scope = append(scope, fl.Body)
					break
				}
			}
		}
		var values []string
		var errs []error
		calls := 0
		for _, s := range scope {
			ast.Inspect(s, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				fn, ok := call.Fun.(*ast.Ident)
				if !ok || fn.Name != name || index >= len(call.Args) {
					return true
				}
				calls++
				v, err := r.values(call.Args[index], nil) // the arguments themselves: literals or constants
				if err != nil {
					errs = append(errs, fmt.Errorf("%s: argument %d of %s: %w", r.pos(call.Pos()), index+1, name, err))
				}
				values = append(values, v...)
				return true
			})
		}
		if err := errors.Join(errs...); err != nil {
			return nil, err
		}
		if calls == 0 {
			return nil, fmt.Errorf("%s: parameter of %s, which is never called", id.Name, name)
		}
		return values, nil
	}
	return nil, fmt.Errorf("%s is not a constant of the package", id.Name)
}

// labelNames reads a []string of label names: a literal of constants, or a variable the package declares
// (`var sourceLabels = []string{...}`) or the enclosing function assigns (`label := []string{...}`) one to.
func (r *reader) labelNames(e ast.Expr, stack []ast.Node) ([]string, error) {
	if id, ok := e.(*ast.Ident); ok {
		var found ast.Expr
		for i := len(stack) - 1; i >= 0 && found == nil; i-- {
			var body *ast.BlockStmt
			switch f := stack[i].(type) {
			case *ast.FuncDecl:
				body = f.Body
			case *ast.FuncLit:
				body = f.Body
			default:
				continue
			}
			ast.Inspect(body, func(n ast.Node) bool {
				if as, ok := n.(*ast.AssignStmt); ok && found == nil {
					for j, lhs := range as.Lhs {
						if l, ok := lhs.(*ast.Ident); ok && l.Name == id.Name && j < len(as.Rhs) {
							found = as.Rhs[j]
						}
					}
				}
				return found == nil
			})
		}
		for _, file := range r.files {
			for _, decl := range file.Decls {
				gen, ok := decl.(*ast.GenDecl)
				if !ok || gen.Tok != token.VAR || found != nil {
					continue
				}
				for _, spec := range gen.Specs {
					vs := spec.(*ast.ValueSpec)
					for j, name := range vs.Names {
						if name.Name == id.Name && j < len(vs.Values) {
							found = vs.Values[j]
						}
					}
				}
			}
		}
		if found == nil {
			return nil, fmt.Errorf("%s: no []string literal assigned to it in the function or the package", id.Name)
		}
		e = found
	}
	lit, ok := e.(*ast.CompositeLit)
	if !ok {
		return nil, fmt.Errorf("not a []string literal nor a variable holding one (%T)", e)
	}
	var out []string
	for _, elt := range lit.Elts {
		v, err := r.values(elt, nil)
		if err != nil {
			return nil, err
		}
		out = append(out, v...)
	}
	return out, nil
}

func isNil(e ast.Expr) bool {
	id, ok := e.(*ast.Ident)
	return ok && id.Name == "nil"
}

// paramIndex is the position of the parameter name in ftype's flattened parameter list.
func paramIndex(ftype *ast.FuncType, name string) (int, bool) {
	i := 0
	for _, field := range ftype.Params.List {
		for _, n := range field.Names {
			if n.Name == name {
				return i, true
			}
			i++
		}
	}
	return 0, false
}

// boundName is the name a function literal is assigned to (`gauge := func...`, `var gauge = func...`).
func boundName(fl *ast.FuncLit, stack []ast.Node) string {
	if len(stack) == 0 {
		return ""
	}
	switch p := stack[len(stack)-1].(type) {
	case *ast.AssignStmt:
		for i, rhs := range p.Rhs {
			if rhs == fl && i < len(p.Lhs) {
				if id, ok := p.Lhs[i].(*ast.Ident); ok {
					return id.Name
				}
			}
		}
	case *ast.ValueSpec:
		for i, v := range p.Values {
			if v == fl && i < len(p.Names) {
				return p.Names[i].Name
			}
		}
	}
	return ""
}

// TestReadExported: the reader finds each form dkc declares metrics in, from dkc's own source — a literal
// name with namespace and subsystem, a name through a local helper's parameter, a histogram, a metric
// without namespace — and the phases of dkc_sidecar_phase.
func TestReadExported(t *testing.T) {
	e := mustReadExported(t)
	for _, tc := range []struct {
		name string
		kind kind
	}{
		{"dkc_sidecar_connected", kindPlain},               // sidecar/app: Namespace, Subsystem, Name literals
		{"dkc_node_config_active", kindPlain},              // sidecar/internal/agent: Name through gauge(name, help)
		{"dkc_node_config_last_known_good", kindPlain},     // the same helper, another call
		{"dkc_server_push_latency_seconds", kindHistogram}, // services/internal/rpc
		{"workqueue_depth", kindPlain},                     // services/internal/queuemetrics: Subsystem and Name only
		{"workqueue_queue_duration_seconds", kindHistogram},
	} {
		f, ok := e.families[tc.name]
		if !ok {
			t.Errorf("%s not found in dkc's source", tc.name)
			continue
		}
		if f.kind != tc.kind {
			t.Errorf("%s (%s): kind %d, want %d", tc.name, f.pos, f.kind, tc.kind)
		}
	}
	if _, ok := e.series("dkc_server_push_latency_seconds_bucket"); !ok {
		t.Error("a histogram's _bucket series is not recognised")
	}
	if _, ok := e.series("dkc_server_push_latency_seconds"); ok {
		t.Error("a histogram's bare name is taken for a series")
	}
	if _, ok := e.series("dkc_sidecar_connected_count"); ok {
		t.Error("a gauge is taken to have a _count series")
	}
	for name, want := range map[string][]string{
		"dkc_sidecar_phase":               {"phase"},                                                                                            // a literal
		"dkc_node_config_active":          {"node_config_source", "node_config_uid", "node_config_resource_version", "node_config_kubelet_key"}, // a package var
		"workqueue_depth":                 {"name"},                                                                                             // a local variable
		"dkc_server_token_refusals_total": {"reason"},
		"dkc_server_connected_nodes":      nil, // no Vec
	} {
		if got := e.families[name].labels; !slices.Equal(got, want) {
			t.Errorf("%s: labels %v, want %v", name, got, want)
		}
	}
	if !containsAll(e.typed["Phase"], "RolledBack", "LocalFallback", "Good") {
		t.Errorf("phases read from sidecar/internal/agent: %v", e.typed["Phase"])
	}
}

// TestReadExportedRefusesWhatItCannotRead: a metric name the reader cannot resolve is an error, not a
// metric quietly missing from the list.
func TestReadExportedRefusesWhatItCannotRead(t *testing.T) {
	for name, src := range map[string]string{
		"name from a variable": `package p
import "github.com/prometheus/client_golang/prometheus"
var n = "x"
var _ = prometheus.GaugeOpts{Name: n}`,
		"helper called with a variable": `package p
import "github.com/prometheus/client_golang/prometheus"
func f(v string) {
	gauge := func(name string) prometheus.GaugeOpts { return prometheus.GaugeOpts{Name: name} }
	gauge(v)
}`,
		"labels from a call": `package p
import "github.com/prometheus/client_golang/prometheus"
func names() []string { return nil }
var _ = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "g"}, names())`,
		"no name": `package p
import prom "github.com/prometheus/client_golang/prometheus"
var _ = prom.CounterOpts{Help: "h"}`,
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "p.go"), []byte(src), 0o600); err != nil {
				t.Fatal(err)
			}
			if _, err := readExported(dir); err == nil {
				t.Error("no error")
			}
		})
	}
}

func mustReadExported(t *testing.T) exported {
	t.Helper()
	e, err := readExported(repoRoot(t))
	if err != nil {
		t.Fatalf("reading the metrics dkc exports: %v", err)
	}
	if len(e.families) == 0 {
		t.Fatal("no metric found in dkc's source")
	}
	return e
}

func containsAll(have []string, want ...string) bool {
	set := map[string]bool{}
	for _, h := range have {
		set[h] = true
	}
	for _, w := range want {
		if !set[w] {
			return false
		}
	}
	return true
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
