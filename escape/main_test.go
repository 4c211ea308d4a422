package escape

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// berthBin is the berth binary TestMain built for this run.
var berthBin string

// The test binary doubles as the launcher of `berth dev` (runLauncher): these variables ask
// for it and carry what it must set up before it execs berth.
const (
	launcherEnv    = "BERTH_ESCAPE_LAUNCHER"     // "1": this process is the launcher
	keyringEnv     = "BERTH_ESCAPE_KEYRING"      // name of the session keyring to join
	keyDescEnv     = "BERTH_ESCAPE_KEY_DESC"     // description of the secret key to add
	keySecretEnv   = "BERTH_ESCAPE_KEY_SECRET"   // its payload
	markerEnvName  = "BERTH_ESCAPE_MARKER"       // stays in berth dev's environment (attempt 04)
	launcherBinEnv = "BERTH_ESCAPE_LAUNCHER_BIN" // the berth binary to exec
)

func TestMain(m *testing.M) {
	if os.Getenv(launcherEnv) == "1" {
		os.Exit(runLauncher())
	}
	os.Exit(buildAndRun(m))
}

func buildAndRun(m *testing.M) int {
	dir, err := os.MkdirTemp("", "berth-escape-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "escape: temp dir:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	// The process runtime's init drops to a sandbox uid and execs this binary again: it and
	// its directory must be reachable by other users.
	if err := os.Chmod(dir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "escape:", err)
		return 1
	}
	berthBin = filepath.Join(dir, "berth")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	root, err := moduleRoot(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "escape:", err)
		return 1
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-o", berthBin, "./cmd/berth")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "escape: go build ./cmd/berth: %v\n%s", err, out)
		return 1
	}
	if err := os.Chmod(berthBin, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "escape:", err)
		return 1
	}
	return m.Run()
}

// moduleRoot is the directory of the module's go.mod.
func moduleRoot(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", fmt.Errorf("not inside a Go module")
	}
	return filepath.Dir(mod), nil
}

// runLauncher is the test binary re-executed as the parent of `berth dev`: it joins a fresh
// session keyring holding a secret key — as a login session's pam_keyinit gives the
// operator's shell one — and execs berth with the rest of its arguments, keeping its pid,
// its session and its controlling terminal (the test's pseudo-terminal). The keyring calls
// act on the calling thread's credentials, hence the locked thread that also does the exec.
func runLauncher() int {
	runtime.LockOSThread()
	if name := os.Getenv(keyringEnv); name != "" {
		if _, err := unix.KeyctlJoinSessionKeyring(name); err != nil {
			fmt.Fprintln(os.Stderr, "escape launcher: join session keyring:", err)
			return 1
		}
		if _, err := unix.AddKey("user", os.Getenv(keyDescEnv), []byte(os.Getenv(keySecretEnv)), unix.KEY_SPEC_SESSION_KEYRING); err != nil {
			fmt.Fprintln(os.Stderr, "escape launcher: add key:", err)
			return 1
		}
	}
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case launcherEnv, keyringEnv, keyDescEnv, keySecretEnv, launcherBinEnv:
			continue
		}
		env = append(env, kv)
	}
	bin := os.Getenv(launcherBinEnv)
	err := syscall.Exec(bin, append([]string{bin}, os.Args[1:]...), env)
	fmt.Fprintln(os.Stderr, "escape launcher: exec berth:", err)
	return 1
}
