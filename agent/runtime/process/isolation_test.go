package process

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/agent/runtime/cgroups"
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
// the runtime's Dir nor other sandboxes (ISO-1).
func TestIsolation(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("isolation needs root; run the tests as root to cover namespaces and cgroups")
	}
	// A Dir outside /tmp: the host's root as a whole is out of the sandbox's view, not only
	// its /tmp.
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
	if err := r.WriteFile(ctx, "sb-iso-a", name, bytes.NewReader([]byte("hi"))); err != nil {
		t.Fatalf("WriteFile: %v", err)
	}
	if got, err := readAll(r.ReadFile(ctx, "sb-iso-a", name)); err != nil || string(got) != "hi" {
		t.Errorf("ReadFile = %q, %v; want hi", got, err)
	}
	if _, err := os.Stat(name); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the sandbox's %s is visible on the host (stat: %v)", name, err)
	}
	if _, err := readAll(r.ReadFile(ctx, "sb-iso-b", name)); berth.ErrorCode(err) != berth.ENotFound {
		t.Errorf("another sandbox reads %s: %v, want %s", name, err, berth.ENotFound)
	}
	// /tmp is a tmpfs in the sandbox's memory, never on the host's disk (ISO-2).
	filepath.WalkDir(r.dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Name() == filepath.Base(name) {
			t.Errorf("the sandbox's %s is on the host's disk at %s", name, p)
		}
		return nil
	})

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
		{"the runtime's Dir is out of sight", []string{"sh", "-c", "test -e " + r.dir + " || echo absent"},
			func(s string) bool { return s == "absent\n" }},
		{"the other sandbox's socket is out of sight", []string{"sh", "-c", "test -e " + held(r, "sb-iso-b").sock + " || echo absent"},
			func(s string) bool { return s == "absent\n" }},
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
	sb := held(r, "sb-limit")
	file := "memory.limit_in_bytes"
	if r.memory.v2 {
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

// C24: clean page cache is not working set. Writing a 200 MiB file into the sandbox's volume
// (on the host's disk) charges its pages to the cgroup, but they sit on the inactive file
// list, which Measure subtracts. Its /tmp is different: a tmpfs, whose pages are memory the
// sandbox holds (ISO-2) and count.
func TestCase_C24_WorkingSetExcludesPageCache(t *testing.T) {
	r := isolatedRuntime(t)
	if err := r.Start(context.Background(), Spec{ID: "sb-cache", MemoryMiB: 512, VolumeDir: t.TempDir()}); err != nil {
		t.Fatalf("Start: %v", err)
	}
	res := run(t, r, "sb-cache", berth.ExecRequest{Cmd: []string{"dd", "if=/dev/zero", "of=/tmp/volume/big", "bs=1M", "count=200", "conv=fsync"}})
	if res.ExitCode != 0 {
		t.Fatalf("dd: %+v", res)
	}
	sb := held(r, "sb-cache")
	usage, inactive, err := cgroups.Usage(sb.cgroup, r.memory.v2)
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
	res = run(t, r, "sb-cache", berth.ExecRequest{Cmd: []string{"dd", "if=/dev/zero", "of=/tmp/scratch", "bs=1M", "count=100"}})
	if res.ExitCode != 0 {
		t.Fatalf("dd into /tmp: %+v", res)
	}
	if m2, err := r.Measure("sb-cache"); err != nil || m2.ResidentMiB < m.ResidentMiB+90 {
		t.Errorf("after 100 MiB into /tmp the working set is %d MiB (%v), want ≥ %d: /tmp is the sandbox's memory", m2.ResidentMiB, err, m.ResidentMiB+90)
	}
}

// A volume (POOL-2) is the sandbox's at /tmp/volume. Isolated, its files are volumeOwner's on
// disk and each sandbox's own inside (an idmapped mount), so the next sandbox on the volume,
// another uid, reads and writes what the previous one wrote; insecure, it is a link in the
// working directory.
func TestVolume(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			r := newRuntime(t, mode)
			vol := t.TempDir()
			ctx := context.Background()
			if !r.Isolated() {
				if err := r.Start(ctx, Spec{ID: "sb-vol", MemoryMiB: 128, VolumeDir: vol}); err != nil {
					t.Fatal(err)
				}
				if res := run(t, r, "sb-vol", berth.ExecRequest{Cmd: []string{"sh", "-c", "echo kept > volume/a && cat volume/a"}}); res.Stdout != "kept\n" {
					t.Fatalf("write into the volume: %+v", res)
				}
				if b, err := os.ReadFile(filepath.Join(vol, "a")); err != nil || string(b) != "kept\n" {
					t.Errorf("the volume on the host holds %q, %v", b, err)
				}
				return
			}
			var uids []int
			for i, id := range []string{"sb-vol-a", "sb-vol-b"} {
				if err := r.Start(ctx, Spec{ID: id, MemoryMiB: 128, VolumeDir: vol}); err != nil {
					t.Fatal(err)
				}
				uid := held(r, id).uid.uid
				uids = append(uids, uid)
				if i == 0 {
					if err := r.WriteFile(ctx, id, "/tmp/volume/sub/a", strings.NewReader("one\n")); err != nil {
						t.Fatalf("WriteFile into the volume: %v", err)
					}
				}
				script := fmt.Sprintf("echo %d >> /tmp/volume/sub/a && stat -c %%u /tmp/volume/sub/a /tmp/volume", i)
				if res := run(t, r, id, berth.ExecRequest{Cmd: []string{"sh", "-c", script}}); res.Stdout != fmt.Sprintf("%d\n%d\n", uid, uid) {
					t.Errorf("%s (uid %d) in the volume: %+v, want it to own what is there", id, uid, res)
				}
				if err := r.Stop(ctx, id); err != nil {
					t.Fatal(err)
				}
			}
			if uids[0] == uids[1] {
				t.Errorf("two sandboxes in a row got uid %d", uids[0])
			}
			b, err := os.ReadFile(filepath.Join(vol, "sub", "a"))
			if err != nil || string(b) != "one\n0\n1\n" {
				t.Errorf("the volume on the host holds %q, %v; want what both sandboxes wrote", b, err)
			}
			for _, p := range []string{vol, filepath.Join(vol, "sub"), filepath.Join(vol, "sub", "a")} {
				if st, err := os.Stat(p); err != nil || st.Sys().(*syscall.Stat_t).Uid != volumeOwner || st.Sys().(*syscall.Stat_t).Gid != volumeOwner {
					t.Errorf("%s on disk: %v, want owned by %d:%d", p, err, volumeOwner, volumeOwner)
				}
			}
		})
	}
}

// An app listens on port 80 as the sandbox's unprivileged uid: the sandbox's own network
// namespace allows low ports, the host's setting is untouched.
func TestLowPortApp(t *testing.T) {
	const setting = "/proc/sys/net/ipv4/ip_unprivileged_port_start"
	before, err := os.ReadFile(setting)
	if err != nil {
		t.Skip(err)
	}
	r := isolatedRuntime(t)
	startSandbox(t, r, "sb-80", 256)
	serve(t, r, "sb-80", berth.ServiceRequest{Cmd: []string{"python3", "-m", "http.server", "80", "--bind", "127.0.0.1"}})
	c := dialWhenUp(t, r, "sb-80", 80)
	defer c.Close()
	io.WriteString(c, "GET / HTTP/1.0\r\n\r\n")
	if got, err := io.ReadAll(c); err != nil || !strings.HasPrefix(string(got), "HTTP/1.0 200") {
		t.Errorf("GET on port 80: %q, %v", got, err)
	}
	if after, _ := os.ReadFile(setting); !bytes.Equal(after, before) {
		t.Errorf("the host's %s changed from %q to %q", setting, before, after)
	}
}
