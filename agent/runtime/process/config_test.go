package process

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/berth-dev/berth"
)

// newAsEnv makes the test binary call New in its Dir and print the outcomes (see TestMain):
// one line for New without Insecure, one with.
const newAsEnv = "BERTH_PROCESS_TEST_NEW_IN"

func newAs(dir string) int {
	_, err := New(Config{Dir: filepath.Join(dir, "a")})
	fmt.Printf("%s|%v\n", berth.ErrorCode(err), err)
	r, err := New(Config{Dir: filepath.Join(dir, "b"), Insecure: true})
	if err != nil {
		fmt.Printf("error|%v\n", err)
		return 1
	}
	defer r.Close()
	fmt.Printf("isolated=%t\n", r.Isolated())
	return 0
}

// Without isolation New refuses, saying why and how to run insecure on purpose; with
// Insecure it runs plain processes. Isolate "off" needs Insecure too.
func TestNewRefusesUnisolated(t *testing.T) {
	_, err := New(Config{Dir: t.TempDir(), Isolate: IsolateOff})
	if berth.ErrorCode(err) != berth.EInvalidRequest || !strings.Contains(err.Error(), "--runtime process --insecure") {
		t.Errorf("New(isolate off) = %v, want %s naming --runtime process --insecure", err, berth.EInvalidRequest)
	}
	if os.Geteuid() != 0 {
		t.Skip("the not-root case runs the test binary as nobody, which needs root")
	}
	// The test binary, copied where nobody may run it, runs New as nobody.
	dir, err := os.MkdirTemp("", "berth-nonroot-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o777)
	bin := filepath.Join(dir, "process.test")
	if err := copyExecutable(os.Args[0], bin); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-test.run=^$")
	cmd.Env = []string{newAsEnv + "=" + dir}
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.Output()
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if err != nil || len(lines) != 2 {
		t.Fatalf("New as nobody: %q, %v", out, err)
	}
	if code, msg, _ := strings.Cut(lines[0], "|"); code != berth.EUnsupported || !strings.Contains(msg, "not root") || !strings.Contains(msg, "--insecure") {
		t.Errorf("New as nobody = %s, want %s saying not root and naming --insecure", lines[0], berth.EUnsupported)
	}
	if lines[1] != "isolated=false" {
		t.Errorf("New as nobody with Insecure: %s, want an unisolated runtime", lines[1])
	}
}

func copyExecutable(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// A template named in Config.Rootfs gets that root instead of the built-in; other templates
// keep the built-in. A root lacking this binary's ELF interpreter is refused by New.
func TestCustomRootfs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("isolation needs root")
	}
	interp, err := ownInterpreter()
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	os.Chmod(root, 0o755)
	files := map[string]string{"/bin/sh": "/usr/bin/dash", "/lib/x86_64-linux-gnu/libc.so.6": "/usr/lib/x86_64-linux-gnu/libc.so.6"}
	if interp != "" {
		files[interp] = interp
	}
	for dst, src := range files {
		os.MkdirAll(filepath.Join(root, filepath.Dir(dst)), 0o755)
		if err := copyExecutable(src, filepath.Join(root, dst)); err != nil {
			t.Skipf("cannot build a tiny root from this host: %v", err)
		}
	}
	os.MkdirAll(filepath.Join(root, "etc"), 0o755)
	os.WriteFile(filepath.Join(root, "etc", "marker"), []byte("custom-root\n"), 0o644)

	r, err := New(Config{Dir: t.TempDir(), Isolate: IsolateOn, Rootfs: map[string]string{"tiny": root}})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { r.Close() })
	ctx := context.Background()
	if err := r.Start(ctx, Spec{ID: "sb-tiny", MemoryMiB: 128, Template: "tiny"}); err != nil {
		t.Fatalf("Start(tiny): %v", err)
	}
	script := "read m < /etc/marker; echo $m; test -e /usr/bin/python3 || echo no-python"
	if res := run(t, r, "sb-tiny", berth.ExecRequest{Cmd: []string{"sh", "-c", script}}); res.Stdout != "custom-root\nno-python\n" {
		t.Errorf("in the tiny root: %+v", res)
	}
	startSandbox(t, r, "sb-builtin", 128)
	if res := run(t, r, "sb-builtin", berth.ExecRequest{Cmd: []string{"sh", "-c", "test -e /etc/marker || echo builtin"}}); res.Stdout != "builtin\n" {
		t.Errorf("a template not in Rootfs: %+v, want the built-in root", res)
	}
	if interp == "" {
		return
	}
	os.Remove(filepath.Join(root, interp))
	if _, err := New(Config{Dir: t.TempDir(), Isolate: IsolateOn, Rootfs: map[string]string{"tiny": root}}); berth.ErrorCode(err) != berth.EInvalidRequest {
		t.Errorf("New with a root lacking %s = %v, want %s", interp, err, berth.EInvalidRequest)
	}
}

// A sandbox's uid is leased host-wide: no other lease gets it while the sandbox's init lives,
// even once the runtime's own hold is gone, and it is free again after Stop.
func TestUIDLeaseLivesWithTheSandbox(t *testing.T) {
	r := isolatedRuntime(t)
	startSandbox(t, r, "sb-uid", 128)
	sb := held(r, "sb-uid")
	slot := sb.uid.uid - uidBase
	sb.uid.file.Close() // the init's inherited copy alone holds the lock now
	leaseAt := func(slot int) *uidLease {
		t.Helper()
		uidCursor.Lock()
		uidCursor.next = slot
		uidCursor.Unlock()
		l, err := leaseUID()
		if err != nil {
			t.Fatalf("leaseUID: %v", err)
		}
		t.Cleanup(l.release)
		return l
	}
	if l := leaseAt(slot); l.uid == sb.uid.uid {
		t.Fatalf("uid %d leased again while its sandbox runs", l.uid)
	}
	if err := r.Stop(context.Background(), "sb-uid"); err != nil {
		t.Fatal(err)
	}
	if l := leaseAt(slot); l.uid != sb.uid.uid {
		t.Errorf("after Stop the lease at slot %d got uid %d, want %d free again", slot, l.uid, sb.uid.uid)
	}
}
