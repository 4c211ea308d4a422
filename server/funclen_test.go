package server

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// maxFuncLines is the longest a function in server/ may be, counted from its `func` keyword
// to its closing brace (its doc comment not included): issue 14's "a function a newcomer can
// read in one screen". Function literals count toward the function that holds them.
const maxFuncLines = 60

// TestFuncLen_ServerFunctionsAtMost60Lines fails when a non-test function or method of this
// package is longer than maxFuncLines, listing every offender with its file, line and length,
// longest first.
func TestFuncLen_ServerFunctionsAtMost60Lines(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	type long struct {
		where string
		lines int
	}
	var offenders []long
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatalf("parse %s: %v", name, err)
		}
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			start, end := fset.Position(fd.Pos()), fset.Position(fd.End())
			if n := end.Line - start.Line + 1; n > maxFuncLines {
				offenders = append(offenders, long{fmt.Sprintf("%s:%d %s", name, start.Line, funcName(fd)), n})
			}
		}
	}
	if len(offenders) == 0 {
		return
	}
	sort.Slice(offenders, func(i, j int) bool {
		if offenders[i].lines != offenders[j].lines {
			return offenders[i].lines > offenders[j].lines
		}
		return offenders[i].where < offenders[j].where
	})
	var b strings.Builder
	for _, o := range offenders {
		fmt.Fprintf(&b, "\n\t%s: %d lines", o.where, o.lines)
	}
	t.Errorf("%d functions in server/ are longer than %d lines (from func to its closing brace); split them into steps:%s",
		len(offenders), maxFuncLines, b.String())
}

// funcName is "Recv.name" for a method, "name" for a function.
func funcName(fd *ast.FuncDecl) string {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return fd.Name.Name
	}
	typ := fd.Recv.List[0].Type
	for {
		switch x := typ.(type) {
		case *ast.StarExpr:
			typ = x.X
			continue
		case *ast.IndexExpr:
			typ = x.X
			continue
		case *ast.IndexListExpr:
			typ = x.X
			continue
		case *ast.Ident:
			return x.Name + "." + fd.Name.Name
		}
		return fd.Name.Name
	}
}
