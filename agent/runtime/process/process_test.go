package process

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/agent/runtime/cgroups"
	"github.com/berth-dev/berth/agent/runtime/sbinit"
)

func TestMain(m *testing.M) {
	MaybeRunInit()
	if mode := os.Getenv(fakeAgentEnv); mode != "" {
		os.Exit(fakeAgent(mode, os.Getenv(fakeAgentDirEnv)))
	}
	if dir := os.Getenv(newAsEnv); dir != "" {
		os.Exit(newAs(dir))
	}
	os.Exit(m.Run())
}

// modes are the isolation settings every behaviour test runs under: insecure plain processes,
// and isolated.
var modes = []string{IsolateOff, IsolateOn}

// newRuntime returns a runtime in a fresh Dir that is closed when the test ends. IsolateOn
// skips the test when the machine cannot isolate.
func newRuntime(t *testing.T, isolate string) *Runtime {
	t.Helper()
	if isolate == IsolateOn && os.Geteuid() != 0 {
		t.Skip("isolation needs root; run the tests as root to cover namespaces and cgroups")
	}
	return newRuntimeIn(t, t.TempDir(), isolate)
}

func newRuntimeIn(t *testing.T, dir, isolate string) *Runtime {
	t.Helper()
	r, err := New(Config{Dir: dir, Isolate: isolate, Insecure: isolate == IsolateOff})
	if err != nil {
		t.Fatalf("New(isolate=%s): %v", isolate, err)
	}
	t.Cleanup(func() {
		if err := r.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return r
}

func startSandbox(t *testing.T, r *Runtime, id string, memoryMiB int64) {
	t.Helper()
	if err := r.Start(context.Background(), Spec{ID: id, MemoryMiB: memoryMiB, VCPUs: 1}); err != nil {
		t.Fatalf("Start(%s): %v", id, err)
	}
}

func run(t *testing.T, r *Runtime, id string, req berth.ExecRequest) berth.ExecResult {
	t.Helper()
	if req.TimeoutS == 0 {
		req.TimeoutS = 30
	}
	res, err := r.Exec(context.Background(), id, req)
	if err != nil {
		t.Fatalf("Exec(%q): %v", req.Cmd, err)
	}
	return res
}

func TestExec(t *testing.T) {
	big := strings.Repeat("x", 100_000) // more than a pipe buffer
	cases := []struct {
		name string
		req  berth.ExecRequest
		want berth.ExecResult
	}{
		{"python", berth.ExecRequest{Cmd: []string{"python3", "-c", "print(2+2)"}}, berth.ExecResult{Stdout: "4\n"}},
		{"stdin", berth.ExecRequest{Cmd: []string{"cat"}, Stdin: "hello"}, berth.ExecResult{Stdout: "hello"}},
		{"big stdin", berth.ExecRequest{Cmd: []string{"wc", "-c"}, Stdin: big}, berth.ExecResult{Stdout: "100000\n"}},
		{"stdin ignored", berth.ExecRequest{Cmd: []string{"true"}, Stdin: big}, berth.ExecResult{}},
		{"no stdin", berth.ExecRequest{Cmd: []string{"cat"}}, berth.ExecResult{}},
		{"exit code", berth.ExecRequest{Cmd: []string{"sh", "-c", "echo out; echo err >&2; exit 3"}},
			berth.ExecResult{ExitCode: 3, Stdout: "out\n", Stderr: "err\n"}},
		{"killed by signal", berth.ExecRequest{Cmd: []string{"sh", "-c", "kill -9 $$"}}, berth.ExecResult{ExitCode: 137}},
		{"not found", berth.ExecRequest{Cmd: []string{"no-such-command-berth"}},
			berth.ExecResult{ExitCode: 127, Stderr: "sandbox: no-such-command-berth: command not found\n"}},
		{"absolute path", berth.ExecRequest{Cmd: []string{"/bin/sh", "-c", "echo $PATH"}},
			berth.ExecResult{Stdout: sandboxPathMark}},
	}
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			r := newRuntime(t, mode)
			startSandbox(t, r, "sb-exec", 256)
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					got := run(t, r, "sb-exec", tc.req)
					if tc.want.Stdout == sandboxPathMark {
						// Isolated: the standard directories and the agent's that exist in
						// the sandbox's root; insecure: the standard ones, then the agent's.
						tc.want.Stdout = held(r, "sb-exec").path + "\n"
					}
					if diff := cmp.Diff(tc.want, got); diff != "" {
						t.Errorf("Exec(%q) (-want +got):\n%s", tc.req.Cmd, diff)
					}
				})
			}
		})
	}
}

// sandboxPathMark stands for the sandbox's PATH in a wanted output.
const sandboxPathMark = "<the sandbox's PATH>"

func TestExecCapsOutput(t *testing.T) {
	r := newRuntime(t, IsolateOff)
	startSandbox(t, r, "sb-cap", 256)
	got := run(t, r, "sb-cap", berth.ExecRequest{Cmd: []string{"head", "-c", "1500000", "/dev/zero"}})
	if len(got.Stdout) != sbinit.MaxOutputBytes {
		t.Errorf("stdout is %d bytes, want the cap %d", len(got.Stdout), sbinit.MaxOutputBytes)
	}
	if want := fmt.Sprintf("stdout truncated to %d bytes (%d dropped)", sbinit.MaxOutputBytes, 1500000-sbinit.MaxOutputBytes); !strings.Contains(got.Stderr, want) {
		t.Errorf("stderr = %q, want a note %q", got.Stderr, want)
	}
}

// A command that leaves a process in the background returns when the command itself exits;
// the background process keeps running and holding the output pipes (SPEC §13). Were Exec to
// wait for the pipes' EOF, it would hit the timeout and report -1.
func TestExecDoesNotWaitForBackground(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			r := newRuntime(t, mode)
			startSandbox(t, r, "sb-bg", 256)
			got := run(t, r, "sb-bg", berth.ExecRequest{
				Cmd:      []string{"sh", "-c", "sleep 1000 & echo started; echo also >&2"},
				TimeoutS: 20,
			})
			if diff := cmp.Diff(berth.ExecResult{Stdout: "started\n", Stderr: "also\n"}, got); diff != "" {
				t.Errorf("Exec (-want +got):\n%s", diff)
			}
			// The background sleep still runs: the tree holds the init and sleep at least.
			if pids := sandboxPids(t, r, "sb-bg"); len(pids) < 2 {
				t.Errorf("sandbox processes after exec = %v, want the init and the background sleep", pids)
			}
		})
	}
}

func TestExecTimeout(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			r := newRuntime(t, mode)
			startSandbox(t, r, "sb-timeout", 256)
			got := run(t, r, "sb-timeout", berth.ExecRequest{Cmd: []string{"sh", "-c", "echo before; sleep 600"}, TimeoutS: 1})
			if got.ExitCode != -1 || got.Stdout != "before\n" || !strings.Contains(got.Stderr, "timed out after 1s") {
				t.Errorf("Exec = %+v, want exit -1, the output before the timeout and a note", got)
			}
			// The killed group's processes vanish once the init reaps them: wait for that
			// state (bounded), do not sample it once.
			pids := sandboxPids(t, r, "sb-timeout")
			for deadline := time.Now().Add(10 * time.Second); len(pids) != 1 && time.Now().Before(deadline); {
				time.Sleep(20 * time.Millisecond) // real: the sandbox init reaping a killed process group
				pids = sandboxPids(t, r, "sb-timeout")
			}
			if len(pids) != 1 {
				t.Errorf("sandbox processes after the timeout = %v, want only the init (the process group is killed)", pids)
			}
		})
	}
}

func TestExecContextCancelKillsCommand(t *testing.T) {
	r := newRuntime(t, IsolateOff)
	startSandbox(t, r, "sb-cancel", 256)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := r.Exec(ctx, "sb-cancel", berth.ExecRequest{Cmd: []string{"sleep", "600"}})
		errc <- err
	}()
	waitFor(t, "the sleep to start", func() bool { return len(sandboxPids(t, r, "sb-cancel")) == 2 })
	cancel()
	if err := <-errc; err == nil || !strings.Contains(err.Error(), context.Canceled.Error()) {
		t.Fatalf("Exec after cancel = %v, want context.Canceled", err)
	}
	waitFor(t, "the sleep to be killed", func() bool { return len(sandboxPids(t, r, "sb-cancel")) == 1 })
}

// TestFiles: what WriteFile writes, ReadFile and commands see (ISO-3). Isolated, any path of
// the sandbox's own root works and the file is the sandbox uid's; insecure, only /tmp paths
// work, and they name the sandbox's working directory.
func TestFiles(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			r := newRuntime(t, mode)
			startSandbox(t, r, "sb-files", 256)
			ctx := context.Background()
			dir := "/tmp/berth-files-test/nested"
			path := filepath.Join(dir, "data.bin")
			cmdPath := path // where a command finds it
			if !r.Isolated() {
				cmdPath = strings.TrimPrefix(path, "/tmp/") // relative to its working directory
			}
			data := []byte("line one\n\x00binary\xff")
			if err := r.WriteFile(ctx, "sb-files", path, bytes.NewReader(data)); err != nil {
				t.Fatalf("WriteFile: %v", err)
			}
			got, err := readAll(r.ReadFile(ctx, "sb-files", path))
			if err != nil {
				t.Fatalf("ReadFile: %v", err)
			}
			if diff := cmp.Diff(data, got); diff != "" {
				t.Errorf("ReadFile (-want +got):\n%s", diff)
			}
			if res := run(t, r, "sb-files", berth.ExecRequest{Cmd: []string{"wc", "-c", cmdPath}}); res.Stdout != fmt.Sprintf("%d %s\n", len(data), cmdPath) {
				t.Errorf("wc inside = %+v", res)
			}
			if r.Isolated() {
				want := strconv.Itoa(held(r, "sb-files").uid.uid) + "\n"
				if res := run(t, r, "sb-files", berth.ExecRequest{Cmd: []string{"stat", "-c", "%u", path}}); res.Stdout != want {
					t.Errorf("owner of a file the files API wrote = %+v, want the sandbox's uid %s", res, want)
				}
			} else if _, err := readAll(r.ReadFile(ctx, "sb-files", "/etc/hostname")); berth.ErrorCode(err) != berth.EForbidden {
				t.Errorf("insecure ReadFile(/etc/hostname) = %v, want %s: only /tmp is reachable", err, berth.EForbidden)
			}
			empty, err := readAll(r.ReadFile(ctx, "sb-files", path+"-missing"))
			if code := berth.ErrorCode(err); code != berth.ENotFound || empty != nil {
				t.Errorf("ReadFile(missing) = %q, %v; want code %s", empty, err, berth.ENotFound)
			}
			if _, err := readAll(r.ReadFile(ctx, "sb-files", dir)); berth.ErrorCode(err) != berth.EInvalidRequest {
				t.Errorf("ReadFile(directory) error = %v, want %s", err, berth.EInvalidRequest)
			}
			if err := r.WriteFile(ctx, "sb-files", dir, bytes.NewReader(data)); berth.ErrorCode(err) != berth.EInvalidRequest {
				t.Errorf("WriteFile(directory) error = %v, want %s", err, berth.EInvalidRequest)
			}
		})
	}
}

// sandboxPids lists the host pids of the sandbox's processes: its cgroup's with isolation, the
// init's tree without.
func sandboxPids(t *testing.T, r *Runtime, id string) []int {
	t.Helper()
	sb := held(r, id)
	if sb == nil {
		t.Fatalf("no sandbox %s", id)
	}
	if sb.cgroup != "" {
		pids, err := cgroups.Procs(sb.cgroup)
		if err != nil {
			t.Fatalf("cgroup.procs: %v", err)
		}
		return pids
	}
	return processTree("/proc", sb.proc.Pid)
}

// startTime returns field 22 of /proc/<pid>/stat, "" when the process is gone; with the pid it
// names one process for good.
func startTime(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 20 || f[0] == "Z" {
		return ""
	}
	return f[19]
}

// waitFor polls cond until it holds or 20 s pass: waiting for a state, not timing it.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond) // real: sandbox processes
	}
}

// TestFilesRefuseNonRegular: reading or writing a FIFO, a device or a directory is an
// invalid_request at once, never a call that hangs until its deadline. Isolated, /dev/zero is
// the device in the sandbox's own /dev; insecure, it is out of reach (forbidden).
func TestFilesRefuseNonRegular(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			r := newRuntime(t, mode)
			startSandbox(t, r, "sb-fifo", 256)
			// Relative to the working directory: the sandbox's /tmp either way.
			if res := run(t, r, "sb-fifo", berth.ExecRequest{Cmd: []string{"mkfifo", "pipe"}}); res.ExitCode != 0 {
				t.Fatalf("mkfifo: %+v", res)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			want := map[string]string{"/tmp/pipe": berth.EInvalidRequest, "/tmp": berth.EInvalidRequest, "/dev/zero": berth.EInvalidRequest}
			if !r.Isolated() {
				want["/dev/zero"] = berth.EForbidden
			}
			for p, code := range want {
				if _, err := readAll(r.ReadFile(ctx, "sb-fifo", p)); berth.ErrorCode(err) != code {
					t.Errorf("ReadFile(%s) = %v, want %s", p, err, code)
				}
			}
			if err := r.WriteFile(ctx, "sb-fifo", "/tmp/pipe", bytes.NewReader([]byte("x"))); berth.ErrorCode(err) != berth.EInvalidRequest {
				t.Errorf("WriteFile(fifo) = %v, want invalid_request", err)
			}
			if ctx.Err() != nil {
				t.Fatal("a file call hung until the test's deadline")
			}
		})
	}
}

// TestLongDirKeepsWorking: a runtime Dir so deep that <Dir>/<id>/init.sock passes the kernel's
// 107-byte socket limit still starts and serves sandboxes (the socket moves to a short
// directory), instead of failing every start.
func TestLongDirKeepsWorking(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			if mode == IsolateOn && os.Geteuid() != 0 {
				t.Skip("isolation needs root")
			}
			dir := filepath.Join(t.TempDir(), strings.Repeat("d", 60), strings.Repeat("e", 20))
			r := newRuntimeIn(t, dir, mode)
			startSandbox(t, r, "sb-0123456789abcdef", 256)
			if res := run(t, r, "sb-0123456789abcdef", berth.ExecRequest{Cmd: []string{"echo", "ok"}}); res.Stdout != "ok\n" {
				t.Fatalf("exec = %+v", res)
			}
			if err := r.Stop(context.Background(), "sb-0123456789abcdef"); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// readAll reads a whole ReadFile answer, for tests.
func readAll(rc io.ReadCloser, _ int64, err error) ([]byte, error) {
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(rc)
}

// held returns the runtime's record of sandbox id, or nil.
func held(r *Runtime, id string) *sandbox {
	sb, _ := r.sandboxes.Peek(id)
	return sb
}
