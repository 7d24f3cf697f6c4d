package core

import (
	"go/ast"
	"go/parser"
	"go/token"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRolesApart: the prefill and decode cores are distinct types (issue
// 20): the role code in core_prefill.go is methods of *prefillCore and in
// core_decode.go of *decodeCore (besides helpers of the file's own small
// types), neither file defines a method of Core, base or the other role,
// and neither names the other role's type — so a prefill path cannot reach
// decode code or tables (the compiler refuses it), and only the Core
// facade dispatches by role.
func TestRolesApart(t *testing.T) {
	for file, tc := range map[string]struct{ own, other string }{
		"core_prefill.go": {"prefillCore", "decodeCore"},
		"core_decode.go":  {"decodeCore", "prefillCore"},
	} {
		f, err := parser.ParseFile(token.NewFileSet(), file, nil, 0)
		require.NoError(t, err)
		own := 0
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv == nil {
				continue
			}
			typ := fn.Recv.List[0].Type
			if star, ok := typ.(*ast.StarExpr); ok {
				typ = star.X
			}
			switch name := typ.(*ast.Ident).Name; name {
			case tc.own:
				own++
			case "Core", "base", tc.other:
				assert.Fail(t, "a method of another type", "%s: method %s of %s", file, fn.Name.Name, name)
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if id, ok := n.(*ast.Ident); ok && id.Name == tc.other {
				assert.Fail(t, "names the other role's type", "%s names %s", file, tc.other)
			}
			return true
		})
		require.GreaterOrEqual(t, own, 10, "%s: only %d methods of %s", file, own, tc.own)
	}
}
