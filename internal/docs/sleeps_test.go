package docs

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// realMark is the comment a real-clock sleep in a test carries, on its line or the line above,
// saying what real thing (a process, a socket, a database, the kernel) it waits on.
const realMark = "// real:"

// TestNoUnexplainedSleeps: no test sleeps on the real clock where a virtual one serves (issue
// 14, point 5). Every time.Sleep call in a _test.go file of the module is either inside a
// testing/synctest bubble (synctest.Test(t, func…)), where time is virtual, or has a
// "// real:" comment on its line or the line above naming the real thing it waits on. A new
// sleep must say why, or wait for its event, or run in a bubble.
func TestNoUnexplainedSleeps(t *testing.T) {
	root := moduleRoot(t)
	var bad []string
	files, sleeps := 0, 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if rel == ".git" || rel == "bin" || rel == "berth-data" || d.Name() == "testdata" || d.Name() == "node_modules" {
				return filepath.SkipDir // VCS state, build output, `berth dev` data, fixtures
			}
			return nil
		}
		if !strings.HasSuffix(rel, "_test.go") {
			return nil
		}
		files++
		n, unmarked, err := unmarkedSleeps(path)
		if err != nil {
			return err
		}
		sleeps += n
		for _, line := range unmarked {
			bad = append(bad, rel+":"+itoa(line))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files == 0 {
		t.Fatalf("found no _test.go file under %s: the scan is broken", root)
	}
	for _, b := range bad {
		t.Errorf("%s: time.Sleep on the real clock without a %q comment: wait for the event, run the test in a synctest bubble, or say what real thing it waits on", b, realMark)
	}
	t.Logf("%d test files, %d real-clock sleeps, each marked", files, sleeps-len(bad))
}

// unmarkedSleeps parses one Go file and returns how many time.Sleep calls outside a synctest
// bubble it has and the lines of those with no realMark comment on their line or the line above.
func unmarkedSleeps(path string) (int, []int, error) {
	src, err := os.ReadFile(path)
	if err != nil {
		return 0, nil, err
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, src, parser.ParseComments)
	if err != nil {
		return 0, nil, err
	}
	marked := map[int]bool{}
	for _, g := range f.Comments {
		for _, c := range g.List {
			if strings.HasPrefix(c.Text, realMark) {
				marked[fset.Position(c.Slash).Line] = true
			}
		}
	}
	var bubbles [][2]token.Pos // synctest.Test calls: sleeps inside them are virtual
	var calls []token.Pos
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		switch pkgFunc(call.Fun) {
		case "synctest.Test":
			bubbles = append(bubbles, [2]token.Pos{call.Pos(), call.End()})
		case "time.Sleep":
			calls = append(calls, call.Pos())
		}
		return true
	})
	n := 0
	var unmarked []int
	for _, p := range calls {
		inBubble := false
		for _, b := range bubbles {
			inBubble = inBubble || (p >= b[0] && p < b[1])
		}
		if inBubble {
			continue
		}
		n++
		if line := fset.Position(p).Line; !marked[line] && !marked[line-1] {
			unmarked = append(unmarked, line)
		}
	}
	return n, unmarked, nil
}

// pkgFunc returns "pkg.Func" for a selector call on a package name, else "".
func pkgFunc(e ast.Expr) string {
	sel, ok := e.(*ast.SelectorExpr)
	if !ok {
		return ""
	}
	x, ok := sel.X.(*ast.Ident)
	if !ok {
		return ""
	}
	return x.Name + "." + sel.Sel.Name
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var b []byte
	for ; n > 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}

// TestUnmarkedSleepsScan: the scan flags a bare sleep, accepts a mark on the line or the line
// above, and skips a sleep inside a synctest bubble (virtual time).
func TestUnmarkedSleepsScan(t *testing.T) {
	src := `package x

func f(t *testing.T) {
	time.Sleep(1) // bare: flagged (line 4)
	time.Sleep(2) // real: a process
	// real: a socket
	time.Sleep(3)
	synctest.Test(t, func(t *testing.T) {
		time.Sleep(4)
	})
	time.Sleep(5)
}
`
	path := filepath.Join(t.TempDir(), "x_test.go")
	if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	n, unmarked, err := unmarkedSleeps(path)
	if err != nil {
		t.Fatal(err)
	}
	if n != 4 || len(unmarked) != 2 || unmarked[0] != 4 || unmarked[1] != 11 {
		t.Fatalf("scan = %d sleeps, unmarked lines %v; want 4 sleeps, unmarked [4 11]", n, unmarked)
	}
}
