// Package typescript_test runs the TypeScript SDK's own tests (issue 17, point 3) from `go
// test`, so the README's `go test -count=1 -timeout 25m ./...` and .ci/run run them: it builds the berth
// binary once, installs the SDK's locked dev dependencies when node_modules is missing (`npm
// ci`), and runs `npm test` (compile with tsc, type-check the declarations, `node --test`)
// with BERTH_BIN set, so the integration tests start that binary as a real `berth dev`.
package typescript_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/sdktest"
)

// Bounds of `npm ci` and of `npm test` (compile, then the suites: the integration suite
// starts one `berth dev` and creates a handful of sandboxes; the whole takes seconds). Both
// fit in go test's default 10 min, and each is cut shorter when the test's own deadline
// (-timeout) comes first, so the process group is ended here rather than orphaned.
const (
	npmCIBound   = 3 * time.Minute
	npmTestBound = 5 * time.Minute
)

// TestTypeScriptSDK fails with npm's output when the TypeScript SDK's tests fail. Without
// node or npm it skips, except in CI (CI=true), where it fails.
func TestTypeScriptSDK(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the TypeScript SDK's suite starts a berth dev")
	}
	sdktest.RequireTools(t, "the TypeScript SDK's tests", "node", "npm")
	sdk, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	bin := sdktest.BuildBerth(t)

	if _, err := os.Stat(filepath.Join(sdk, "node_modules")); errors.Is(err, os.ErrNotExist) {
		run(t, sdk, npmCIBound, nil, "npm", "ci", "--no-audit", "--no-fund")
	} else if err != nil {
		t.Fatal(err)
	}
	run(t, sdk, npmTestBound, []string{"BERTH_BIN=" + bin}, "npm", "test")
}

// run runs name args in dir with env added, in its own process group so that a timeout ends
// everything it started (node, its test processes, the berth dev they run), and fails the
// test with the combined output when it fails or outlives bound (or the test's deadline,
// less 30 s).
func run(t *testing.T, dir string, bound time.Duration, env []string, name string, args ...string) {
	t.Helper()
	if d, ok := t.Deadline(); ok {
		bound = min(bound, time.Until(d)-30*time.Second)
	}
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 30 * time.Second
	err := cmd.Run()
	if cmd.Process != nil {
		// Whatever of the group outlived npm (a berth dev whose node was killed) ends here.
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	if ctx.Err() != nil {
		t.Fatalf("%s %v did not finish within %s:\n%s", name, args, bound.Round(time.Second), out.String())
	}
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out.String())
	}
	t.Logf("%s %v:\n%s", name, args, lastLines(out.String(), 12))
}

// lastLines returns the last n lines of s (node --test's summary).
func lastLines(s string, n int) string {
	b := []byte(s)
	b = bytes.TrimRight(b, "\n")
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] == '\n' {
			n--
			if n == 0 {
				return string(b[i+1:])
			}
		}
	}
	return string(b)
}
