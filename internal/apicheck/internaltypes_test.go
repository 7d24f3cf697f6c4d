package apicheck

import (
	"fmt"
	"go/ast"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestNoInternalTypes: no exported field, signature or type of a public
// package names a type of an internal package — a user could hold such a
// value but not name its type, and go doc would send them to a package
// they cannot import. (api.txt lists names, not types, so it cannot see
// this.)
func TestNoInternalTypes(t *testing.T) {
	var found []string
	for _, p := range publicPackages {
		files, _ := parseDir(t, filepath.Join("..", "..", p))
		for _, f := range files {
			imports := fileImports(f) // per file: two files may name one import differently
			check := func(where string, n ast.Node) {
				if n == nil {
					return
				}
				ast.Inspect(n, func(n ast.Node) bool {
					if fl, ok := n.(*ast.Field); ok && len(fl.Names) > 0 && !anyExported(fl.Names) {
						return false // unexported fields
					}
					if sel, ok := n.(*ast.SelectorExpr); ok {
						if x, ok := sel.X.(*ast.Ident); ok && strings.Contains(imports[x.Name], "/internal/") {
							found = append(found, fmt.Sprintf("%s: %s names %s.%s", p, where, imports[x.Name], sel.Sel.Name))
						}
					}
					return true
				})
			}
			for _, d := range f.Decls {
				switch d := d.(type) {
				case *ast.FuncDecl:
					if !d.Name.IsExported() || d.Recv != nil && !exportedRecv(d.Recv) {
						continue
					}
					check(d.Name.Name, d.Type)
				case *ast.GenDecl:
					for _, s := range d.Specs {
						switch s := s.(type) {
						case *ast.TypeSpec:
							if s.Name.IsExported() {
								check(s.Name.Name, s.Type)
							}
						case *ast.ValueSpec:
							if anyExported(s.Names) {
								check(s.Names[0].Name, s.Type)
							}
						}
					}
				}
			}
		}
	}
	assert.Empty(t, found, "public names that name internal types")
}

func anyExported(ids []*ast.Ident) bool {
	for _, id := range ids {
		if id.IsExported() {
			return true
		}
	}
	return false
}

func exportedRecv(r *ast.FieldList) bool {
	if len(r.List) == 0 {
		return false
	}
	t := r.List[0].Type
	if s, ok := t.(*ast.StarExpr); ok {
		t = s.X
	}
	if ix, ok := t.(*ast.IndexExpr); ok {
		t = ix.X
	}
	id, ok := t.(*ast.Ident)
	return ok && id.IsExported()
}
