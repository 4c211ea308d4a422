// Package python_test runs the Python SDK's tests (sdk/python/tests, standard unittest) from
// `go test`, so the README's `go test -count=1 -timeout 25m ./...` and .ci/run cover them (issue 17,
// point 2). The directory holds no Go code besides this test.
package python_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/sdktest"
)

// pythonTimeout bounds the whole Python suite (which starts and stops its own `berth dev`).
const pythonTimeout = 10 * time.Minute

// TestPythonSDK builds the berth binary once, then runs `python3 -m unittest -v` in
// sdk/python with BERTH_BIN set, so the integration tests start that binary as `berth dev`
// on 127.0.0.1. It fails with the suite's output when the suite fails, reports no test run,
// or outlasts pythonTimeout (python3 is then killed, and its `berth dev` with it: the Python
// tests start it with PR_SET_PDEATHSIG). Without python3 it skips, except under CI=true,
// where that is a failure.
func TestPythonSDK(t *testing.T) {
	sdktest.RequireTools(t, "the Python SDK's tests", "python3")
	bin := sdktest.BuildBerth(t)

	ctx, cancel := context.WithTimeout(context.Background(), pythonTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "python3", "-m", "unittest", "-v")
	cmd.Dir = "." // go test runs in the package's directory: sdk/python
	cmd.Env = append(os.Environ(),
		"BERTH_BIN="+bin,
		"PYTHONDONTWRITEBYTECODE=1", // no __pycache__ left in the repository
		"PYTHONUNBUFFERED=1",
	)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.WaitDelay = 30 * time.Second
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("python3 -m unittest did not end within %s (killed):\n%s", pythonTimeout, out.String())
	}
	if err != nil {
		t.Fatalf("python3 -m unittest -v: %v\n%s", err, out.String())
	}
	// unittest exits 0 with "Ran 0 tests" when it finds none (a renamed directory, say):
	// that must not pass for a green run.
	m := regexp.MustCompile(`(?m)^Ran (\d+) tests? in`).FindStringSubmatch(out.String())
	if m == nil || m[1] == "0" {
		t.Fatalf("python3 -m unittest ran no tests:\n%s", out.String())
	}
	// Nothing in the suite skips when python3 and the binary are there.
	if strings.Contains(out.String(), "... skipped") {
		t.Fatalf("python3 -m unittest skipped tests although BERTH_BIN was set:\n%s", out.String())
	}
	t.Logf("python3 -m unittest -v:\n%s", out.String())
}
