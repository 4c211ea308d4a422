package main

import (
	"bytes"
	"context"
	"regexp"
	"runtime/debug"
	"testing"
)

// TestVersion_PrintsModuleAndCommit: `berth version` prints one line with the module path,
// its version ("(devel)" for a working-tree build) and the commit, or "unknown" when the build
// stamped none (issue 15).
func TestVersion_PrintsModuleAndCommit(t *testing.T) {
	var out, errOut bytes.Buffer
	if err := Main(context.Background(), []string{"version"}, nil, &out, &errOut); err != nil {
		t.Fatalf("berth version: %v (stderr %q)", err, errOut.String())
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		t.Fatal("no build info in the test binary")
	}
	want := regexp.MustCompile(`^berth (\(devel\)|v\S+) ` + regexp.QuoteMeta(info.Main.Path) + ` commit ([0-9a-f]{7,}\S*( \S+)?( \(modified\))?|unknown) go\S+\n$`)
	if !want.MatchString(out.String()) {
		t.Fatalf("berth version printed %q, want a line matching %s", out.String(), want)
	}
}

// TestVersion_Line pins the line's shape for each kind of build: tagged, working tree with a
// stamped commit, and without VCS information.
func TestVersion_Line(t *testing.T) {
	for _, tc := range []struct {
		v    buildVersion
		want string
	}{
		{buildVersion{Module: "github.com/berth-dev/berth", Version: "v1.2.0", Go: "go1.26.0"},
			"berth v1.2.0 github.com/berth-dev/berth commit unknown go1.26.0"},
		{buildVersion{Module: "github.com/berth-dev/berth", Version: "(devel)", Commit: "1a57537a", Time: "2026-12-01T05:15:26Z", Modified: true, Go: "go1.26.0"},
			"berth (devel) github.com/berth-dev/berth commit 1a57537a 2026-12-01T05:15:26Z (modified) go1.26.0"},
	} {
		if got := tc.v.String(); got != tc.want {
			t.Errorf("got %q, want %q", got, tc.want)
		}
	}
}
