// Package sdktest is for tests only: what the tests that run another language's suite (the
// Python and TypeScript SDKs', issue 17) and the tests of the real binary share — requiring a
// tool the way CI requires it, and building the berth binary.
package sdktest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// buildBound bounds one `go build` of the berth binary.
const buildBound = 5 * time.Minute

// RequireTools skips t when one of tools is not on PATH, or fails it under CI=true, where
// .ci/run has installed them and a missing one is a broken machine, not a reason to skip.
func RequireTools(t testing.TB, why string, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s is not installed: %s (CI=true: this is a failure; .ci/run installs it): %v", tool, why, err)
			}
			t.Skipf("%s is not installed: skipping %s: %v", tool, why, err)
		}
	}
}

// BuildBerth builds the real berth binary (main, not a test binary) into a temp dir removed
// when t ends, within five minutes, and returns its path.
func BuildBerth(t testing.TB) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("these tests build the berth binary and need the go command: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "berth")
	ctx, cancel := context.WithTimeout(context.Background(), buildBound)
	defer cancel()
	cmd := exec.CommandContext(ctx, goBin, "build", "-o", bin, "github.com/berth-dev/berth/cmd/berth")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/berth: %v\n%s", err, out)
	}
	return bin
}
