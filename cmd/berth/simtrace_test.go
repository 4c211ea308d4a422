package main

import (
	"strings"
	"testing"
)

// TestSimAlibabaFromAnyDirectory: the installed binary runs `berth sim --workload alibaba`
// from a directory that is not the repository (no ../shared/data beside it) on the trace
// built into it, and a --trace-dir without the CSVs is a usage error (exit 2) that names the
// file it wants and the way out (issue 13, SIM-1).
func TestSimAlibabaFromAnyDirectory(t *testing.T) {
	bin := buildBerthBinary(t)
	elsewhere := t.TempDir()
	stdout, stderr, code := runBerth(t, bin, elsewhere, "sim", "--workload", "alibaba", "--policies", "committed", "--burst=false")
	if code != 0 {
		t.Fatalf("berth sim --workload alibaba from %s exited %d\nstdout: %s\nstderr: %s", elsewhere, code, stdout, stderr)
	}
	if !strings.Contains(stdout, "committed") || !strings.Contains(stdout, "/8151") {
		t.Errorf("the summary does not report the 8,151 pods of the built-in trace:\n%s", stdout)
	}

	stdout, stderr, code = runBerth(t, bin, elsewhere, "sim", "--workload", "alibaba", "--trace-dir", elsewhere, "--burst=false")
	if code != 2 {
		t.Fatalf("--trace-dir without the CSVs exited %d, want 2\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}
	for _, want := range []string{alibabaPodList, "github.com/alibaba/clusterdata", "leave it out"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("the error does not say %q:\n%s", want, stderr)
		}
	}
}
