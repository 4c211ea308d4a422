package process

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/berth-dev/berth"
)

// isolatedRuntime returns a runtime with isolation on, or skips the test.
func isolatedRuntime(t *testing.T) *Runtime {
	t.Helper()
	r := newRuntime(t, IsolateOn)
	if !r.Isolated() {
		t.Fatal("New with Isolate on returned a runtime without isolation")
	}
	return r
}

// Each sandbox has its own /tmp, hostname, PID namespace and /proc (AGT-3), and sees neither
// the runtime's Dir nor other sandboxes.
func TestIsolation(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("isolation needs root; run the tests as root to cover namespaces and cgroups")
	}
	// A Dir outside /tmp, so that what hides it is the tmpfs cover, not the /tmp bind-mount.
	dir, err := os.MkdirTemp("/var/tmp", "berth-process-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	r := newRuntimeIn(t, dir, IsolateOn)
	startSandbox(t, r, "sb-iso-a", 256)
	startSandbox(t, r, "sb-iso-b", 256)
	ctx := context.Background()

	name := fmt.Sprintf("/tmp/berth-hello-%d", os.Getpid())
	if err := r.WriteFile(ctx, "sb-iso-a", name, []byte("hi")); err != nil {
		t.Fatalf("WriteFile: %v", err)
	}
	if got, err := r.ReadFile(ctx, "sb-iso-a", name); err != nil || string(got) != "hi" {
		t.Errorf("ReadFile = %q, %v; want hi", got, err)
	}
	if _, err := os.Stat(name); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the sandbox's %s is visible on the host (stat: %v)", name, err)
	}
	if _, err := r.ReadFile(ctx, "sb-iso-b", name); berth.ErrorCode(err) != berth.ENotFound {
		t.Errorf("another sandbox reads %s: %v, want %s", name, err, berth.ENotFound)
	}
	if got, err := os.ReadFile(filepath.Join(r.sandboxes["sb-iso-a"].dir, rootDir, filepath.Base(name))); err != nil || string(got) != "hi" {
		t.Errorf("the file is not in the sandbox's root dir: %q, %v", got, err)
	}

	checks := []struct {
		name string
		cmd  []string
		want func(stdout string) bool
	}{
		{"hostname is the id", []string{"cat", "/proc/sys/kernel/hostname"},
			func(s string) bool { return s == "sb-iso-a\n" }},
		{"the init is PID 1", []string{"cat", "/proc/1/cmdline"},
			func(s string) bool { return strings.Contains(s, initArg) && strings.Contains(s, "-id=sb-iso-a") }},
		{"a command gets a small pid", []string{"sh", "-c", "echo $$"},
			func(s string) bool {
				n, err := strconv.Atoi(strings.TrimSpace(s))
				return err == nil && n > 1 && n < 100
			}},
		{"cwd is /tmp", []string{"pwd"}, func(s string) bool { return s == "/tmp\n" }},
		{"the runtime's Dir is hidden", []string{"ls", "-A", r.dir}, func(s string) bool { return s == "" }},
		{"only the init and the command run", []string{"python3", "-c", "import os; print(sum(p.isdigit() for p in os.listdir('/proc')))"},
			func(s string) bool { return s == "2\n" }},
	}
	for _, c := range checks {
		res := run(t, r, "sb-iso-a", berth.ExecRequest{Cmd: c.cmd})
		if res.ExitCode != 0 || !c.want(res.Stdout) {
			t.Errorf("%s: %q gave %+v", c.name, c.cmd, res)
		}
	}
}

// The memory cgroup carries the configured size as its limit, and the limit holds.
func TestMemoryLimit(t *testing.T) {
	r := isolatedRuntime(t)
	startSandbox(t, r, "sb-limit", 128)
	sb := r.sandboxes["sb-limit"]
	file := "memory.limit_in_bytes"
	if r.cg.v2 {
		file = "memory.max"
	}
	b, err := os.ReadFile(filepath.Join(sb.cgroup, file))
	if err != nil {
		t.Fatalf("read %s: %v", file, err)
	}
	if got, want := strings.TrimSpace(string(b)), strconv.Itoa(128<<20); got != want {
		t.Errorf("%s = %s, want %s", file, got, want)
	}
	// Touching 300 MiB in a 128 MiB sandbox (no swap here) ends in the cgroup's OOM kill.
	res := run(t, r, "sb-limit", berth.ExecRequest{Cmd: []string{"python3", "-c", "b=bytes(range(256))*(300*4096); print('survived')"}})
	if res.ExitCode != 137 || strings.Contains(res.Stdout, "survived") {
		t.Errorf("allocating over the limit gave %+v, want exit 137 (SIGKILL by the OOM killer)", res)
	}
	if res := run(t, r, "sb-limit", berth.ExecRequest{Cmd: []string{"echo", "ok"}}); res.Stdout != "ok\n" {
		t.Errorf("the sandbox does not serve after the OOM kill: %+v", res)
	}
}

// C24: clean page cache is not working set. Writing a 200 MiB file into the sandbox's /tmp
// charges its pages to the cgroup, but they sit on the inactive file list, which Measure
// subtracts.
func TestCase_C24_WorkingSetExcludesPageCache(t *testing.T) {
	r := isolatedRuntime(t)
	startSandbox(t, r, "sb-cache", 512)
	res := run(t, r, "sb-cache", berth.ExecRequest{Cmd: []string{"dd", "if=/dev/zero", "of=/tmp/big", "bs=1M", "count=200", "conv=fsync"}})
	if res.ExitCode != 0 {
		t.Fatalf("dd: %+v", res)
	}
	sb := r.sandboxes["sb-cache"]
	usage, inactive, err := cgroupUsage(sb.cgroup, r.cg.v2)
	if err != nil {
		t.Fatalf("cgroupUsage: %v", err)
	}
	m, err := r.Measure("sb-cache")
	if err != nil {
		t.Fatalf("Measure: %v", err)
	}
	t.Logf("usage %d MiB, inactive file %d MiB, working set %d MiB", usage>>20, inactive>>20, m.ResidentMiB)
	if usage < 150<<20 || inactive < 150<<20 {
		t.Fatalf("after writing 200 MiB: usage %d MiB, inactive file %d MiB; want both ≥ 150 MiB", usage>>20, inactive>>20)
	}
	if m.ResidentMiB > 50 || m.ResidentMiB >= usage>>20-150 {
		t.Errorf("working set %d MiB counts the page cache (usage %d MiB)", m.ResidentMiB, usage>>20)
	}
}
