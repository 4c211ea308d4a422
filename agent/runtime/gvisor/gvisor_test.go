package gvisor

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth"
)

func TestMain(m *testing.M) {
	MaybeRunInit()
	code := m.Run()
	if shared != nil {
		shared.Close()
	}
	if sharedDir != "" {
		os.RemoveAll(sharedDir)
	}
	os.Exit(code)
}

var (
	shared     *Runtime
	sharedDir  string
	sharedErr  error
	sharedOnce sync.Once
)

// needRuntime returns a runtime for tests: one per test binary (its probe and staging cost
// about a second). Without runsc the test skips locally and fails in CI (CI=true), where
// .ci/run installs it.
func needRuntime(t testing.TB) *Runtime {
	t.Helper()
	if _, err := Find(""); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI needs runsc: %v", err)
		}
		t.Skipf("gVisor tests skipped: %v", err)
	}
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("CI runs the gVisor tests as root")
		}
		t.Skip("gVisor tests need root")
	}
	sharedOnce.Do(func() {
		sharedDir, sharedErr = os.MkdirTemp("", "berth-gvisor-test-")
		if sharedErr != nil {
			return
		}
		shared, sharedErr = New(Config{Dir: sharedDir})
	})
	if sharedErr != nil {
		t.Fatalf("New: %v", sharedErr)
	}
	return shared
}

// start starts a sandbox that the test stops when it ends.
func start(t *testing.T, r *Runtime, s Spec) {
	t.Helper()
	if s.MemoryMiB == 0 {
		s.MemoryMiB = 256
	}
	if err := r.Start(context.Background(), s); err != nil {
		t.Fatalf("Start(%s): %v", s.ID, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := r.Stop(ctx, s.ID); err != nil {
			t.Errorf("Stop(%s): %v", s.ID, err)
		}
	})
}

func run(t *testing.T, r *Runtime, id string, cmd ...string) berth.ExecResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := r.Exec(ctx, id, berth.ExecRequest{Cmd: cmd, TimeoutS: 50})
	if err != nil {
		t.Fatalf("Exec(%q): %v", cmd, err)
	}
	return res
}

func TestExecFilesAndMeasure(t *testing.T) {
	r := needRuntime(t)
	start(t, r, Spec{ID: "gv-basic", Template: "python", MemoryMiB: 512})
	res := run(t, r, "gv-basic", "python3", "-c", "import os; print(2+2, os.getuid(), os.getcwd())")
	if res.ExitCode != 0 || strings.TrimSpace(res.Stdout) != "4 1000 /tmp" {
		t.Fatalf("python = %+v, want 4 1000 /tmp", res)
	}
	if res := run(t, r, "gv-basic", "sh", "-c", "exit 7"); res.ExitCode != 7 {
		t.Errorf("exit code = %d, want 7", res.ExitCode)
	}
	ctx := context.Background()
	data := bytes.Repeat([]byte("berth"), 300_000) // 1.5 MB: several frames
	if err := r.WriteFile(ctx, "gv-basic", "/tmp/a/b/data.bin", bytes.NewReader(data)); err != nil {
		t.Fatalf("WriteFile: %v", err)
	}
	if res := run(t, r, "gv-basic", "wc", "-c", "/tmp/a/b/data.bin"); !strings.HasPrefix(res.Stdout, strconv.Itoa(len(data))) {
		t.Errorf("wc inside = %+v, want %d bytes", res, len(data))
	}
	rc, size, err := r.ReadFile(ctx, "gv-basic", "/tmp/a/b/data.bin")
	if err != nil {
		t.Fatalf("ReadFile: %v", err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || size != int64(len(data)) || !bytes.Equal(got, data) {
		t.Errorf("ReadFile = %d bytes (size %d), %v; want the %d written", len(got), size, err, len(data))
	}
	if _, _, err := r.ReadFile(ctx, "gv-basic", "/tmp/missing"); berth.ErrorCode(err) != berth.ENotFound {
		t.Errorf("ReadFile(missing) = %v, want not_found", err)
	}
	m, err := r.Measure("gv-basic")
	if err != nil || !m.Seen || m.Exited || m.ResidentMiB <= 0 {
		t.Errorf("Measure = %+v, %v; want a seen, running guest", m, err)
	}
}

func TestServiceAndDial(t *testing.T) {
	r := needRuntime(t)
	start(t, r, Spec{ID: "gv-app", Template: "python", MemoryMiB: 512})
	ctx := context.Background()
	if err := r.WriteFile(ctx, "gv-app", "/tmp/index.html", strings.NewReader("hello from gvisor")); err != nil {
		t.Fatal(err)
	}
	if err := r.Serve(ctx, "gv-app", berth.ServiceRequest{Cmd: []string{"python3", "-m", "http.server", "8080", "--bind", "127.0.0.1"}}); err != nil {
		t.Fatalf("Serve: %v", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		conn, err := r.Dial(ctx, "gv-app", 8080)
		if err == nil {
			fmt.Fprintf(conn, "GET /index.html HTTP/1.0\r\nHost: x\r\n\r\n")
			b, _ := io.ReadAll(conn)
			conn.Close()
			if !strings.Contains(string(b), "hello from gvisor") {
				t.Fatalf("app answered %q", b)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("app never answered: %v", err)
		}
		time.Sleep(100 * time.Millisecond) // real: an app starting in a gVisor guest
	}
	st, err := r.ServiceStatus(ctx, "gv-app")
	if err != nil || !st.Started || st.Exited {
		t.Errorf("ServiceStatus = %+v, %v", st, err)
	}
	_ = http.StatusOK
}

func TestCheckpointRestore(t *testing.T) {
	r := needRuntime(t)
	ctx := context.Background()
	start(t, r, Spec{ID: "gv-ckpt", Template: "shell", MemoryMiB: 256})
	run(t, r, "gv-ckpt", "sh", "-c", "echo kept > /tmp/file; (i=0; while true; do i=$((i+1)); echo $i > /tmp/counter.new; mv /tmp/counter.new /tmp/counter; sleep 0.2; done) >/dev/null 2>&1 &")
	// The guest's counter is running: it has ticked a few times.
	var before string
	for deadline := time.Now().Add(30 * time.Second); ; {
		before = strings.TrimSpace(run(t, r, "gv-ckpt", "sh", "-c", "cat /tmp/counter 2>/dev/null || echo 0").Stdout)
		if n, _ := strconv.Atoi(before); n >= 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the guest's counter never reached 3: %q", before)
		}
		time.Sleep(100 * time.Millisecond) // real: a loop in a gVisor guest, on the guest's clock
	}
	img := t.TempDir()
	if err := r.Checkpoint(ctx, "gv-ckpt", img); err != nil {
		t.Fatalf("Checkpoint: %v", err)
	}
	if _, err := r.Measure("gv-ckpt"); berth.ErrorCode(err) != berth.ESandboxNotFound {
		t.Fatalf("after a checkpoint the sandbox is still held: %v", err)
	}
	if err := r.Restore(ctx, Spec{ID: "gv-ckpt", Template: "shell", MemoryMiB: 256}, img); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	after := strings.TrimSpace(run(t, r, "gv-ckpt", "cat", "/tmp/counter", "/tmp/file").Stdout)
	b, _ := strconv.Atoi(before)
	a, _ := strconv.Atoi(strings.Fields(after)[0])
	if a < b || !strings.Contains(after, "kept") {
		t.Fatalf("after restore counter/file = %q, before %q: want the counter to go on from its value", after, before)
	}
	t.Logf("counter %d before the checkpoint, %d after the restore", b, a)
	_ = exec.Command
	_ = filepath.Join
}
