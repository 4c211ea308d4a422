package main

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/client"
)

// TestDevDataInUse: a second berth dev on the --data directory of one that runs is refused
// before it touches anything (found by a new user: it started anyway, removed the first's
// running sandbox as a leftover, and the two fought over their agents' credentials). The
// first keeps its sandbox and its agent's one live credential; once it stops, the directory
// is free again.
func TestDevDataInUse(t *testing.T) {
	first := bootDev(t, nil)
	ctx := context.Background()
	c := adminClient(first)
	sb, err := c.CreateSandbox(ctx, berth.CreateRequest{Template: "shell"})
	if err != nil {
		t.Fatalf("create: %v", err)
	}

	cfg := devConfigOn(first.dataDir, 1)
	// The running stack writes while the second starts (a snapshot, a volume): the refused
	// start must not take that for its own and remove it.
	written := filepath.Join(first.dataDir, "snapshots", "written-meanwhile")
	cfg.lockHook = func() {
		if err := os.WriteFile(written, []byte("the first stack's"), 0o600); err != nil {
			t.Error(err)
		}
	}
	second, err := startDev(ctx, cfg)
	if err == nil {
		second.Close()
		t.Fatal("a second berth dev on the same --data started")
	}
	if berth.ErrorCode(err) != berth.EInvalidRequest || !strings.Contains(err.Error(), "another berth dev runs with --data "+first.dataDir) {
		t.Fatalf("second start: %v (%s); want invalid_request naming the directory in use", err, berth.ErrorCode(err))
	}
	if exitCode(err) != exitInvalid {
		t.Errorf("second start exits %d, want %d", exitCode(err), exitInvalid)
	}
	if _, err := os.Stat(written); err != nil {
		t.Errorf("the refused start removed what the running stack wrote meanwhile: %v", err)
	}
	cfg.lockHook = nil

	got, err := c.Sandbox(ctx, sb.ID)
	if err != nil || got.State != berth.SandboxRunning {
		t.Fatalf("the first stack's sandbox after the refused start: %+v, %v; want running", got, err)
	}
	if res, err := c.Exec(ctx, sb.ID, berth.ExecRequest{Cmd: []string{"echo", "still"}}); err != nil || res.Stdout != "still\n" {
		t.Fatalf("exec in the first stack's sandbox: %+v, %v", res, err)
	}
	creds, err := first.Store.AgentCredentials(ctx)
	if err != nil || len(creds) != 1 || !creds[0].Live() {
		t.Fatalf("agent credentials after the refused start: %+v, %v; want the first stack's one, live", creds, err)
	}

	if err := first.Close(); err != nil {
		t.Fatalf("close the first: %v", err)
	}
	again, err := startDev(ctx, cfg)
	if err != nil {
		t.Fatalf("start on the directory once the first stopped: %v", err)
	}
	again.Close()
}

// TestDevRevokedAgent: after `berth agents revoke dev-agent-2`, a restart of berth dev on the
// same directory is refused at once, before it serves, naming the agent and the ways on
// (found by a new user: it served for 30 s and then exited saying only that one agent did
// not heartbeat, on every restart). With --agents 1 it starts.
func TestDevRevokedAgent(t *testing.T) {
	st := bootDev(t, func(c *devConfig) { c.Agents = 2 })
	ctx := context.Background()
	if n, err := client.New(st.URL, st.AdminKey).RevokeAgent(ctx, "dev-agent-2"); err != nil || n != 1 {
		t.Fatalf("revoke dev-agent-2: %d, %v", n, err)
	}
	data := st.dataDir
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	cfg := devConfigOn(data, 2)
	start := time.Now()
	again, err := startDev(ctx, cfg)
	if err == nil {
		again.Close()
		t.Fatal("berth dev started with a revoked dev-agent-2")
	}
	if berth.ErrorCode(err) != berth.EForbidden || !strings.Contains(err.Error(), "dev-agent-2 was revoked") ||
		!strings.Contains(err.Error(), "--agents 1") || !strings.Contains(err.Error(), "new --data") {
		t.Fatalf("start with a revoked agent: %v; want forbidden naming dev-agent-2, --agents 1 and a new --data", err)
	}
	t.Logf("refused after %s", time.Since(start)) // before any agent's 30 s heartbeat wait

	cfg.Agents = 1
	one, err := startDev(ctx, cfg)
	if err != nil {
		t.Fatalf("start with --agents 1 (without the revoked one): %v", err)
	}
	one.Close()
}

// devConfigOn is a dev config on data with n agents, on 127.0.0.1:0 and the runtime bootDev
// uses, for a second start on a directory a booted stack used.
func devConfigOn(data string, n int) devConfig {
	cfg := defaultDevConfig()
	cfg.Listen, cfg.Data, cfg.Agents = "127.0.0.1:0", data, n
	cfg.Runtime.Runtime, cfg.Runtime.Insecure = runtimeProcess, os.Geteuid() != 0 // as bootDev
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	return cfg
}

// TestDevDanglingDataLink: a --data that is a symbolic link to nothing is refused and left
// in place (found by an attack: the failed start's cleanup took the link for a directory it
// had made, and removed it).
func TestDevDanglingDataLink(t *testing.T) {
	dir := t.TempDir()
	link := filepath.Join(dir, "data")
	if err := os.Symlink(filepath.Join(dir, "nothing-here"), link); err != nil {
		t.Fatal(err)
	}
	st, err := startDev(context.Background(), devConfigOn(link, 1))
	if err == nil {
		st.Close()
		t.Fatal("berth dev started on a dangling --data link")
	}
	if !strings.Contains(err.Error(), "symbolic link") {
		t.Errorf("start on a dangling link: %v; want it to say the link points nowhere", err)
	}
	if fi, err := os.Lstat(link); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Fatalf("the link after the refused start: %v, %v; want it left in place", fi, err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "nothing-here")); err == nil {
		t.Error("the refused start created the link's target")
	}
}

// TestDevDataMovedStops: when a running stack's --data is moved away (or removed), the lock
// no longer keeps a second berth dev off the path, so the running one reports it and stops
// (found by an attack: after `mv`, a second start on the path ran beside the first and the
// two shared store paths, agent credentials and cgroup names).
func TestDevDataMovedStops(t *testing.T) {
	st := bootDev(t, func(c *devConfig) { c.dataWatchEvery = 20 * time.Millisecond })
	select {
	case err := <-st.DataLost():
		t.Fatalf("data lost before anything moved it: %v", err)
	case <-time.After(200 * time.Millisecond): // real: ten checks that must stay quiet
	}
	moved := st.dataDir + ".moved"
	if err := os.Rename(st.dataDir, moved); err != nil {
		t.Fatal(err)
	}
	defer os.Rename(moved, st.dataDir) // back, for the stack's own cleanup
	select {
	case err := <-st.DataLost():
		if !strings.Contains(err.Error(), "moved or removed") {
			t.Fatalf("data lost: %v; want it to say the directory was moved or removed", err)
		}
	case <-time.After(30 * time.Second): // real: bounded wait for the watcher's report
		t.Fatal("the running stack did not notice its --data was moved")
	}
}
