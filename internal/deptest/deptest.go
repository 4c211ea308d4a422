// Package deptest is for tests only: it lists what a package links, so a test can hold a
// package to the imports docs/ARCHITECTURE.md allows it (a pure package stays pure, one
// dependency direction stays one).
package deptest

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// Deps returns the import paths of the packages outside the standard library that pkg (an
// import path or a relative "./dir") depends on, directly or not, sorted; its test files and
// pkg itself are not counted. It runs `go list -deps` (go test puts its go first on PATH);
// a failure of go list fails the test.
func Deps(t testing.TB, pkg string) []string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("deptest: no go command on PATH: %v", err)
	}
	out, err := exec.Command(goBin, "list", "-deps",
		"-f", "{{if and .DepOnly (not .Standard)}}{{.ImportPath}}{{end}}", pkg).Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			t.Fatalf("deptest: go list -deps %s: %v\n%s", pkg, err, ee.Stderr)
		}
		t.Fatalf("deptest: go list -deps %s: %v", pkg, err)
	}
	lines := strings.Fields(string(out))
	slices.Sort(lines)
	return lines
}
