package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth"
)

// berthCLI runs the berth command line in-process against st and returns stdout.
func berthCLI(t *testing.T, st *devStack, stdin string, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	full := append([]string{"--url", st.URL, "--key", st.AdminKey}, args...)
	err := Main(context.Background(), full, strings.NewReader(stdin), &out, &errOut)
	return out.String(), err
}

// TestCLI_SandboxLifecycle walks the operator subcommands the README shows: create, exec,
// write, read, list, get, agents list, kill.
func TestCLI_SandboxLifecycle(t *testing.T) {
	st := bootDev(t, nil)
	out, err := berthCLI(t, st, "", "sandbox", "create", "python")
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	var sb berth.Sandbox
	if err := json.Unmarshal([]byte(out), &sb); err != nil || sb.ID == "" {
		t.Fatalf("create printed %q: %v", out, err)
	}
	if out, err := berthCLI(t, st, "", "sandbox", "exec", sb.ID, "--", "python3", "-c", "print(2+2)"); err != nil || out != "4\n" {
		t.Fatalf("exec = %q, %v; want 4", out, err)
	}
	if _, err := berthCLI(t, st, "", "sandbox", "exec", sb.ID, "--", "sh", "-c", "exit 7"); exitCode(err) != 7 {
		t.Fatalf("exec of a command exiting 7: %v (exit %d), want berth to exit 7", err, exitCode(err))
	}
	if out, err := berthCLI(t, st, "", "sandbox", "create", "-q", "shell"); err != nil || !strings.HasPrefix(out, "sb-") || strings.Count(out, "\n") != 1 {
		t.Fatalf("create -q printed %q, %v; want only the id", out, err)
	}
	if _, err := berthCLI(t, st, "hello from berth\n", "sandbox", "write", sb.ID, "/tmp/hello.txt"); err != nil {
		t.Fatalf("write: %v", err)
	}
	if out, err := berthCLI(t, st, "", "sandbox", "read", sb.ID, "/tmp/hello.txt"); err != nil || out != "hello from berth\n" {
		t.Fatalf("read = %q, %v", out, err)
	}
	for _, args := range [][]string{{"sandbox", "list"}, {"sandbox", "get", sb.ID}, {"agents", "list"}} {
		out, err := berthCLI(t, st, "", args...)
		if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		want := sb.ID
		if args[0] == "agents" {
			want = "dev-agent-1"
		}
		if !strings.Contains(out, want) {
			t.Fatalf("%v printed %q, want it to mention %s", args, out, want)
		}
	}
	if out, err := berthCLI(t, st, "", "templates"); err != nil || !strings.Contains(out, "python") || !strings.Contains(out, "shell") {
		t.Fatalf("templates = %q, %v", out, err)
	}
	if out, err := berthCLI(t, st, "", "agents", "drain", "dev-agent-1", "--reason", "cli test"); err != nil || !strings.Contains(out, "draining") {
		t.Fatalf("agents drain: %q, %v", out, err)
	}
	if _, err := berthCLI(t, st, "", "--wait", "1s", "sandbox", "create", "shell"); !strings.Contains(fmt.Sprint(err), "no_capacity") || exitCode(err) != 3 {
		t.Fatalf("create on the drained fleet: %v, want no_capacity", err)
	}
	if _, err := berthCLI(t, st, "", "agents", "undrain", "dev-agent-1"); err != nil {
		t.Fatalf("agents undrain: %v", err)
	}
	if out, err := berthCLI(t, st, "", "events", "agent/dev-agent-1"); err != nil || !strings.Contains(out, "cli test") {
		t.Fatalf("events: %q, %v; want the drain with its reason", out, err)
	}
	if out, err := berthCLI(t, st, "", "sandbox", "kill", sb.ID); err != nil || out != "stopped "+sb.ID+"\n" {
		t.Fatalf("kill: %q, %v; want it to say it stopped %s", out, err, sb.ID)
	}
	out, err = berthCLI(t, st, "", "sandbox", "get", sb.ID)
	if err != nil || !strings.Contains(out, `"stopped"`) {
		t.Fatalf("after kill: %q, %v", out, err)
	}
	// A sandbox that had already ended is left as it is, and kill says so (not "stopped").
	gone, err := adminClient(st).CreateSandbox(context.Background(), berth.CreateRequest{Template: "shell"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Store.TransitionSandbox(context.Background(), gone.ID, nil, berth.SandboxLost, "test: its host went away", "test", time.Now()); err != nil {
		t.Fatal(err)
	}
	if out, err := berthCLI(t, st, "", "sandbox", "kill", gone.ID); err != nil || out != gone.ID+" had already ended (lost): nothing to stop\n" {
		t.Fatalf("kill of a lost sandbox: %q, %v; want it to say the sandbox had already ended", out, err)
	}
	_, err = berthCLI(t, st, "", "sandbox", "create", "cobol")
	if code := berth.ErrorCode(err); code != berth.ETemplateNotFound || exitCode(err) != exitInvalid {
		t.Fatalf("unknown template: %v (code %s, exit %d)", err, code, exitCode(err))
	}
}

// TestPLAN1_BerthPlan: `berth plan` reproduces the worked example of PLAN-1.
func TestPLAN1_BerthPlan(t *testing.T) {
	run := func(args ...string) string {
		var out, errOut bytes.Buffer
		if err := Main(context.Background(), append([]string{"plan"}, args...), strings.NewReader(""), &out, &errOut); err != nil {
			t.Fatalf("berth plan %v: %v", args, err)
		}
		return out.String()
	}
	out := run("--memory-mb", "4096", "--notice", "30s", "--link-gbps", "1", "--guests", "20", "--authoritative", "inside")
	for _, want := range []string{"136.5 MiB/s", "0 of 20", "pool", "stateful"} {
		if !strings.Contains(out, want) {
			t.Errorf("30 s notice: output lacks %q:\n%s", want, out)
		}
	}
	out = run("--memory-mb", "4096", "--notice", "2m", "--link-gbps", "1", "--guests", "20")
	for _, want := range []string{"34.1 MiB/s", "3 of 20", "ephemeral"} {
		if !strings.Contains(out, want) {
			t.Errorf("2 min notice: output lacks %q:\n%s", want, out)
		}
	}
	var out2, errOut bytes.Buffer
	if err := Main(context.Background(), []string{"plan", "--memory-mb", "0"}, strings.NewReader(""), &out2, &errOut); exitCode(err) != 2 {
		t.Fatalf("bad input: %v (exit %d), want an invalid request", err, exitCode(err))
	}
}

// TestSIM1_BerthSim: `berth sim` prints the policies side by side and the ledger burst in one
// invocation, writes the CSV and the plots it is asked for, prints the same bytes for the
// same seed, and refuses bad input with exit code 2.
func TestSIM1_BerthSim(t *testing.T) {
	dir := t.TempDir()
	run := func(extra ...string) string {
		var out, errOut bytes.Buffer
		args := append([]string{"sim", "--creates", "200"}, extra...)
		if err := Main(context.Background(), args, strings.NewReader(""), &out, &errOut); err != nil {
			t.Fatal(err)
		}
		return out.String()
	}
	out := run("--csv", filepath.Join(dir, "sim.csv"), "--plots", filepath.Join(dir, "plots"))
	for _, want := range []string{"committed", "working-set", "none", "shared", "per-replica", "OOM_KILLS", "EVICTIONS", "TTS_P99_S"} {
		if !strings.Contains(out, want) {
			t.Fatalf("output lacks %q:\n%s", want, out)
		}
	}
	if !regexp.MustCompile(`(?m)^committed\s+7/200\s`).MatchString(out) {
		t.Fatalf("committed does not admit 7 of 200 on the seed host:\n%s", out)
	}
	for _, f := range []string{"sim.csv", "plots/density.png", "plots/refusals.png"} {
		if fi, err := os.Stat(filepath.Join(dir, f)); err != nil || fi.Size() == 0 {
			t.Fatalf("%s: %v", f, err)
		}
	}
	if again := run("--csv", filepath.Join(dir, "sim.csv"), "--plots", filepath.Join(dir, "plots")); again != out {
		t.Fatalf("same seed, different output:\n%s\nvs\n%s", out, again)
	}
	busy := run("--hosts", "8", "--rate", "2", "--lifetime", "2m", "--spike-prob", "0.2", "--loss-rate", "1", "--policies", "working-set,working-set:pack:nogate")
	if !strings.Contains(busy, "working-set:pack:nogate") || !strings.Contains(busy, "HOST_LOSS") {
		t.Fatalf("busy fleet:\n%s", busy)
	}
	knobs := run("--policies", "working-set,working-set:reserve=0.1:floor=256")
	if !regexp.MustCompile(`(?m)^working-set:reserve=0\.1:floor=256\s+\d+/200\s`).MatchString(knobs) {
		t.Fatalf("reserve knobs (ADM-4) do not name their policy:\n%s", knobs)
	}
	for _, bad := range [][]string{{"--policies", "lucky"}, {"--spike-prob", "2"}, {"--workload", "nope"}, {"--hosts", "0"},
		{"--policies", "working-set:reserve=2"}, {"--policies", "committed:floor=256"}} {
		var o, e bytes.Buffer
		if err := Main(context.Background(), append([]string{"sim"}, bad...), strings.NewReader(""), &o, &e); exitCode(err) != 2 {
			t.Fatalf("%v: %v (exit %d), want an invalid request", bad, err, exitCode(err))
		}
	}
}

// TestCLI_HelpNeverPrintsKey: with BERTH_KEY set, no --help shows it (a flag default would),
// while the key is still what the CLI uses.
func TestCLI_HelpNeverPrintsKey(t *testing.T) {
	st := bootDev(t, nil)
	t.Setenv("BERTH_KEY", st.AdminKey)
	for _, args := range [][]string{{"--help"}, {"sandbox", "--help"}, {"apps", "create", "--help"}} {
		var out, errOut bytes.Buffer
		_ = Main(context.Background(), args, strings.NewReader(""), &out, &errOut)
		if strings.Contains(out.String()+errOut.String(), st.AdminKey) {
			t.Fatalf("berth %v printed the API key", args)
		}
	}
	var out, errOut bytes.Buffer
	if err := Main(context.Background(), []string{"--url", st.URL, "--key-file", "/nonexistent", "templates"}, strings.NewReader(""), &out, &errOut); err != nil || !strings.Contains(out.String(), "python") {
		t.Fatalf("templates with BERTH_KEY: %v %q", err, out.String())
	}
}
