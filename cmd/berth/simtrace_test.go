package main

import (
	"os"
	"path/filepath"
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

// TestSimOutputsCheckedFirst (a new user's report: `berth sim --csv /tmp/nodir/x.csv` ran the
// whole simulation and then failed, exit 1): an output path that cannot be written is a bad
// flag value, refused (exit 2) before anything is simulated — no summary on stdout — with
// what is wrong with it; a --plots directory that does not exist yet is fine (it is created,
// as before) when an ancestor can take it, and nothing is left behind by the checks.
func TestSimOutputsCheckedFirst(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "a-file")
	if err := os.WriteFile(file, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--csv", filepath.Join(dir, "nodir", "x.csv")}, "directory " + filepath.Join(dir, "nodir") + " does not exist"},
		{[]string{"--csv", dir}, "is a directory"},
		{[]string{"--csv", filepath.Join(file, "x.csv")}, "a part of the path is a file"},
		{[]string{"--plots", file}, file + " is not a directory"},
		{[]string{"--plots", filepath.Join(file, "sub")}, "a part of the path is a file"},
	} {
		r := runCLI(t, "", append([]string{"sim", "--creates", "50"}, tc.args...)...)
		if r.code != exitInvalid || r.stdout != "" {
			t.Errorf("sim %v: exit %d, stdout %q; want exit %d and nothing simulated", tc.args, r.code, r.stdout, exitInvalid)
			continue
		}
		checkStderr(t, r.stderr, tc.want)
		checkStderr(t, r.stderr, "nothing was simulated")
	}
	if entries, err := os.ReadDir(dir); err != nil || len(entries) != 1 {
		t.Errorf("the refused runs changed %s: %v, %v", dir, entries, err)
	}

	plots := filepath.Join(dir, "new", "plots")
	csv := filepath.Join(dir, "new-file.csv")
	if r := runCLI(t, "", "sim", "--creates", "50", "--csv", csv, "--plots", plots); r.code != 0 {
		t.Fatalf("sim --csv %s --plots %s: exit %d, stderr %q", csv, plots, r.code, r.stderr)
	}
	for _, f := range []string{csv, filepath.Join(plots, "density.png")} {
		if fi, err := os.Stat(f); err != nil || fi.Size() == 0 {
			t.Errorf("%s: %v, want it written", f, err)
		}
	}
}
