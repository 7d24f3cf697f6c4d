// Package apicheck holds the test that keeps kvbridge's public API — the
// exported identifiers of its importable packages — equal to a golden
// list, so that every change to it is deliberate and reviewed.
package apicheck

import (
	"bytes"
	"flag"
	"fmt"
	"go/ast"
	"go/build"
	"go/parser"
	"go/token"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var update = flag.Bool("update", false, "rewrite testdata/api.txt from the packages")

// publicPackages are the packages an engine imports (internal/ and
// examples/ are not importable from outside the module or not meant to be).
var publicPackages = []string{"bootstrap", "gpu", "kvmanager", "nixl", "receiver", "sender", "transfer"}

// module is this module's path: an alias to one of its internal packages
// (type X = wire.Y) lists Y's fields and methods as X's, so a change
// behind the alias changes the public API too.
const module = "github.com/kvbridge/kvbridge/"

// fileImports is the import path each local import name of f stands for.
func fileImports(f *ast.File) map[string]string {
	imports := map[string]string{}
	for _, im := range f.Imports {
		path := strings.Trim(im.Path.Value, `"`)
		local := filepath.Base(path)
		if im.Name != nil {
			local = im.Name.Name
		}
		imports[local] = path
	}
	return imports
}

// parseDir returns the files of dir in this build (tags, cgo) and the
// import path each local import name stands for.
func parseDir(t *testing.T, dir string) ([]*ast.File, map[string]string) {
	bp, err := build.Default.ImportDir(dir, 0)
	require.NoError(t, err)
	fs := token.NewFileSet()
	var files []*ast.File
	imports := map[string]string{}
	for _, name := range append(bp.GoFiles, bp.CgoFiles...) {
		f, err := parser.ParseFile(fs, filepath.Join(dir, name), nil, 0)
		require.NoError(t, err)
		files = append(files, f)
		maps.Copy(imports, fileImports(f))
	}
	return files, imports
}

// members maps each type of files to its exported methods, fields and
// embedded types ("method", "Type.Name").
func members(files []*ast.File) map[string][][2]string {
	m := map[string][][2]string{}
	for _, f := range files {
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if !d.Name.IsExported() || d.Recv == nil {
					continue
				}
				rt := d.Recv.List[0].Type
				if s, ok := rt.(*ast.StarExpr); ok {
					rt = s.X
				}
				if ix, ok := rt.(*ast.IndexExpr); ok {
					rt = ix.X
				}
				if id, ok := rt.(*ast.Ident); ok && id.IsExported() {
					m[id.Name] = append(m[id.Name], [2]string{"method", d.Name.Name})
				}
			case *ast.GenDecl:
				for _, sp := range d.Specs {
					ts, ok := sp.(*ast.TypeSpec)
					if !ok {
						continue
					}
					if it, ok := ts.Type.(*ast.InterfaceType); ok { // an interface's methods are API too
						for _, f := range it.Methods.List {
							for _, n := range f.Names {
								if n.IsExported() {
									m[ts.Name.Name] = append(m[ts.Name.Name], [2]string{"method", n.Name})
								}
							}
						}
						continue
					}
					st, ok := ts.Type.(*ast.StructType)
					if !ok {
						continue
					}
					for _, fl := range st.Fields.List {
						for _, n := range fl.Names {
							if n.IsExported() {
								m[ts.Name.Name] = append(m[ts.Name.Name], [2]string{"field", n.Name})
							}
						}
						if len(fl.Names) == 0 { // embedded
							et := fl.Type
							if s, ok := et.(*ast.StarExpr); ok {
								et = s.X
							}
							if sel, ok := et.(*ast.SelectorExpr); ok {
								et = sel.Sel
							}
							if id, ok := et.(*ast.Ident); ok && id.IsExported() {
								m[ts.Name.Name] = append(m[ts.Name.Name], [2]string{"embeds", id.Name})
							}
						}
					}
				}
			}
		}
	}
	return m
}

// exported lists a package's exported identifiers, one per line: consts,
// vars, funcs, types, methods on exported types, and exported fields of
// exported struct types — an alias's from the type it names, where that is
// in one of this module's packages.
func exported(t *testing.T, root, dir string) []string {
	files, imports := parseDir(t, filepath.Join(root, dir))
	own := members(files)
	var out []string
	add := func(kind, name string) { out = append(out, fmt.Sprintf("%s %s %s", dir, kind, name)) }
	for _, f := range files {
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Name.IsExported() && d.Recv == nil {
					add("func", d.Name.Name)
				}
			case *ast.GenDecl:
				for _, sp := range d.Specs {
					switch sp := sp.(type) {
					case *ast.ValueSpec:
						for _, n := range sp.Names {
							if n.IsExported() {
								add(d.Tok.String(), n.Name)
							}
						}
					case *ast.TypeSpec:
						if !sp.Name.IsExported() {
							continue
						}
						add("type", sp.Name.Name)
						ms := own[sp.Name.Name]
						if sel, ok := sp.Type.(*ast.SelectorExpr); ok && sp.Assign != 0 {
							pkg, _ := sel.X.(*ast.Ident)
							if path, ok := imports[pkg.Name]; ok && strings.HasPrefix(path, module) {
								af, _ := parseDir(t, filepath.Join(root, strings.TrimPrefix(path, module)))
								ms = members(af)[sel.Sel.Name]
							}
						}
						for _, m := range ms {
							add(m[0], sp.Name.Name+"."+m[1])
						}
					}
				}
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// TestPublicAPI: the exported identifiers of the public packages are
// testdata/api.txt's. A change to the API fails it until the list is
// regenerated (go test ./internal/apicheck -update) and the change
// reviewed with it; docs/EMBEDDING.md's "The public API" table says which of these an
// engine needs.
func TestPublicAPI(t *testing.T) {
	var got []string
	for _, p := range publicPackages {
		got = append(got, exported(t, filepath.Join("..", ".."), p)...)
	}
	golden := filepath.Join("testdata", "api.txt")
	if *update {
		require.NoError(t, os.WriteFile(golden, []byte(strings.Join(got, "\n")+"\n"), 0o644))
	}
	b, err := os.ReadFile(golden)
	require.NoError(t, err)
	want := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	var added, removed []string
	for _, g := range got {
		if !slices.Contains(want, g) {
			added = append(added, g)
		}
	}
	for _, w := range want {
		if !slices.Contains(got, w) {
			removed = append(removed, w)
		}
	}
	assert.Zero(t, len(added)+len(removed), "the public API changed: added %q, removed %q.\nIf deliberate: go test ./internal/apicheck -update, and review testdata/api.txt's diff", added, removed)
}

// TestDocFigures: docs/PACKAGES.md states the exported list's length as
// it is.
func TestDocFigures(t *testing.T) {
	api, err := os.ReadFile("testdata/api.txt")
	require.NoError(t, err)
	n := bytes.Count(api, []byte("\n"))
	doc, err := os.ReadFile("../../docs/PACKAGES.md")
	require.NoError(t, err)
	m := regexp.MustCompile("in `testdata/api.txt`\\s+\\(([0-9,]+) lines").FindSubmatch(doc)
	require.NotNil(t, m, "docs/PACKAGES.md no longer states api.txt's length")
	assert.Equal(t, fmt.Sprintf("%d", n), strings.ReplaceAll(string(m[1]), ",", ""), "docs/PACKAGES.md: api.txt's length")
}
