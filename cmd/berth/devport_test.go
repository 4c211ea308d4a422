package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/berth-dev/berth/internal/sdktest"
)

// buildBerthBinary builds the real berth binary (main, not the test binary's Main) into a
// temp dir removed when the test ends, and returns its path.
func buildBerthBinary(t *testing.T) string { return sdktest.BuildBerth(t) }

// runBerth runs bin with args in dir (bounded to two minutes; the child is killed with the
// test binary) and returns its stdout, stderr and exit code.
func runBerth(t *testing.T, bin, dir string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "HOME="+t.TempDir()) // never the user's ~/.berth
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.WaitDelay = 10 * time.Second
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		code = ee.ExitCode()
	default:
		t.Fatalf("run berth %v: %v", args, err)
	}
	if ctx.Err() != nil {
		t.Fatalf("berth %v did not end within two minutes (killed)\nstdout: %s\nstderr: %s", args, out.String(), errb.String())
	}
	return out.String(), errb.String(), code
}

// treeOf lists everything under dir as path → mode and content digest ("missing" when dir
// does not exist), to compare a directory before and after a command.
func treeOf(t *testing.T, dir string) map[string]string {
	t.Helper()
	tree := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		info, err := d.Info()
		if err != nil {
			return err
		}
		v := info.Mode().String()
		if info.Mode().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(b)
			v += " " + hex.EncodeToString(sum[:8])
		}
		tree[rel] = v
		return nil
	})
	if errors.Is(err, fs.ErrNotExist) {
		return map[string]string{".": "missing"}
	}
	if err != nil {
		t.Fatal(err)
	}
	return tree
}

// devDataDirs are the data directories the tests below start `berth dev` on: one that does
// not exist yet, an empty one, and one a previous run left with its admin.key (which must
// never be rewritten) and an agents directory.
func devDataDirs(t *testing.T) map[string]string {
	existing := t.TempDir()
	if err := os.WriteFile(filepath.Join(existing, "admin.key"), []byte("bk_a_key_from_an_earlier_run\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(existing, "agents", "dev-agent-1"), 0o700); err != nil {
		t.Fatal(err)
	}
	return map[string]string{
		"missing dir":        filepath.Join(t.TempDir(), "new", "data"),
		"empty dir":          t.TempDir(),
		"existing admin.key": existing,
	}
}

// busyAddr returns a loopback address another listener holds until the test ends.
func busyAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	return ln.Addr().String()
}

// TestDevBusyPort: `berth dev --listen ADDR` where another process already listens on ADDR
// exits non-zero with a message naming ADDR and writes nothing into --data: no admin.key
// (which the CLI would then send to whoever owns the port), no berth.db, no agent
// directories, not even the directory itself; an existing admin.key is left as it was
// (issue 13, "a new user's first hour").
func TestDevBusyPort(t *testing.T) {
	bin := buildBerthBinary(t)
	addr := busyAddr(t)
	for name, data := range devDataDirs(t) {
		t.Run(name, func(t *testing.T) {
			before := treeOf(t, data)
			stdout, stderr, code := runBerth(t, bin, t.TempDir(), "dev", "--listen", addr, "--data", data)
			if code == 0 {
				t.Fatalf("berth dev on a busy %s exited 0\nstdout: %s\nstderr: %s", addr, stdout, stderr)
			}
			if !strings.Contains(stderr, "cannot listen on "+addr) || !strings.Contains(stderr, "address already in use") {
				t.Errorf("stderr does not say that %s is in use:\n%s", addr, stderr)
			}
			if strings.Contains(stdout, "is up") {
				t.Errorf("stdout claims the stack is up:\n%s", stdout)
			}
			if diff := cmp.Diff(before, treeOf(t, data)); diff != "" {
				t.Errorf("berth dev on a busy port changed --data %s (-before +after):\n%s", data, diff)
			}
		})
	}
}

// TestDevFailedStartLeavesDataDir: a start that fails after the port was bound — here the
// runtime refuses a --template-rootfs that does not exist (as root) or refuses to run
// unisolated without --insecure (not root), both after it made its directory — removes what
// it created and leaves an existing admin.key alone (issue 13).
func TestDevFailedStartLeavesDataDir(t *testing.T) {
	bin := buildBerthBinary(t)
	for name, data := range devDataDirs(t) {
		t.Run(name, func(t *testing.T) {
			before := treeOf(t, data)
			stdout, stderr, code := runBerth(t, bin, t.TempDir(), "dev", "--listen", "127.0.0.1:0", "--data", data,
				"--runtime", "process", "--template-rootfs", "python=/nonexistent-berth-root")
			if code == 0 {
				t.Fatalf("berth dev with a missing template root exited 0\nstdout: %s\nstderr: %s", stdout, stderr)
			}
			if !strings.Contains(stderr, "dev-agent-1") {
				t.Errorf("stderr does not name the runtime failure:\n%s", stderr)
			}
			if diff := cmp.Diff(before, treeOf(t, data)); diff != "" {
				t.Errorf("a failed berth dev changed --data %s (-before +after):\n%s", data, diff)
			}
		})
	}
}

// TestServerBusyPort: `berth server --listen ADDR` where another process already listens on
// ADDR exits with a message naming ADDR and writes nothing into --data (no admin.key, no
// berth.db), as `berth dev` does (issue 13). This test binary plays the berth binary (the
// BERTH_TEST_RUN_MAIN path of TestMain, which exits as the binary does).
func TestServerBusyPort(t *testing.T) {
	addr := busyAddr(t)
	for name, data := range devDataDirs(t) {
		t.Run(name, func(t *testing.T) {
			before := treeOf(t, data)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0], "server", "--listen", addr, "--data", data)
			cmd.Env = append(os.Environ(), envRunMain+"=1", "BERTH_NODE_TOKEN="+strings.Repeat("t", 64), "HOME="+t.TempDir())
			cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) {
				t.Fatalf("berth server on a busy %s: %v (want a non-zero exit)\n%s", addr, err, out)
			}
			if !strings.Contains(string(out), "cannot listen on "+addr) || !strings.Contains(string(out), "address already in use") {
				t.Errorf("output does not say that %s is in use:\n%s", addr, out)
			}
			if diff := cmp.Diff(before, treeOf(t, data)); diff != "" {
				t.Errorf("berth server on a busy port changed --data %s (-before +after):\n%s", data, diff)
			}
		})
	}
}

// TestListenNotHostPort: a --listen value no bind can ever take — not HOST:PORT, a port that
// is not a number 0..65535 nor a service name — is a bad flag value: `berth dev`, `berth
// server` and `berth agent` exit 2 (it exited 1 on dev and server) naming the address and
// the form wanted, and write nothing: the data directory is not even created. A port in use
// stays exit 1 (TestDevBusyPort).
func TestListenNotHostPort(t *testing.T) {
	t.Setenv("BERTH_NODE_TOKEN", strings.Repeat("t", 64))
	insecure := []string{}
	if os.Geteuid() != 0 {
		insecure = []string{"--insecure"}
	}
	for _, addr := range []string{"notaport", "127.0.0.1:abc", "127.0.0.1:99999", "::1:7070", ""} {
		dir := filepath.Join(t.TempDir(), "data")
		for _, args := range [][]string{
			append([]string{"dev", "--data", dir, "--runtime", "process"}, insecure...),
			{"server", "--data", dir},
			append([]string{"agent", "--dir", dir, "--volume-dir", filepath.Join(dir, "volumes"), "--runtime", "process", "--server", "http://127.0.0.1:9"}, insecure...),
		} {
			args = append(args, "--listen", addr)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second) // bounds a command that wrongly starts
			err := Main(ctx, args, strings.NewReader(""), io.Discard, io.Discard)
			cancel()
			msg := errorMessage(err)
			if code := exitCode(err); code != exitInvalid || !strings.Contains(msg, "cannot listen on "+addr+":") || !strings.Contains(msg, "--listen wants HOST:PORT") {
				t.Errorf("berth %s --listen %q: exit %d, %q; want exit %d naming the address and HOST:PORT", args[0], addr, code, msg, exitInvalid)
			}
			if _, serr := os.Stat(dir); !errors.Is(serr, fs.ErrNotExist) {
				t.Errorf("berth %s --listen %q: %s exists after the refusal (%v), want nothing written", args[0], addr, dir, serr)
			}
		}
	}
}
