package process

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth"
)

// The escape suite: each test tries to break out of an isolated sandbox, or past a limit it
// must not raise, and must fail (ISO-1, ISO-2, ISO-3). They need root.

// escapeRuntime returns an isolated runtime with cfg's limits in a fresh Dir, closed (every
// sandbox stopped) when the test ends, and starts sandbox id in it.
func escapeRuntime(t *testing.T, cfg Config, id string) *Runtime {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("isolation needs root; run the tests as root")
	}
	cfg.Dir, cfg.Isolate = t.TempDir(), IsolateOn
	r, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		if err := r.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	startSandbox(t, r, id, 256)
	return r
}

// sh runs a shell command in the sandbox.
func sh(t *testing.T, r *Runtime, id, script string) berth.ExecResult {
	t.Helper()
	return run(t, r, id, berth.ExecRequest{Cmd: []string{"sh", "-c", script}, TimeoutS: 20})
}

// mustFail runs script, which must exit non-zero.
func mustFail(t *testing.T, r *Runtime, id, what, script string) {
	t.Helper()
	if res := sh(t, r, id, script); res.ExitCode == 0 {
		t.Errorf("%s succeeded: %q gave %+v", what, script, res)
	}
}

// Nothing of the host's file system is in view: neither a file the test makes (readable by
// anyone or not), nor the host's /tmp, /root, /var, the runtime's Dir or its sockets; and the
// files API cannot reach them either, not even through /proc's magic links.
func TestEscapeHostFiles(t *testing.T) {
	r := escapeRuntime(t, Config{}, "sb-files")
	ctx := context.Background()
	dir := t.TempDir()
	os.Chmod(dir, 0o755) // so file modes alone would not stop a reader
	secret, public := filepath.Join(dir, "secret"), filepath.Join(dir, "public")
	os.WriteFile(secret, []byte("secret"), 0o600)
	os.WriteFile(public, []byte("public"), 0o644)
	hostTmp, err := os.CreateTemp("/tmp", "berth-escape-")
	if err != nil {
		t.Fatal(err)
	}
	hostTmp.Close()
	t.Cleanup(func() { os.Remove(hostTmp.Name()) })

	for _, p := range []string{secret, public, hostTmp.Name()} {
		mustFail(t, r, "sb-files", "reading a host file", "cat "+p)
		if got, err := readAll(r.ReadFile(ctx, "sb-files", p)); berth.ErrorCode(err) != berth.ENotFound {
			t.Errorf("ReadFile(%s) = %q, %v; want %s", p, got, err, berth.ENotFound)
		}
	}
	for _, p := range []string{"/root", "/var", "/home", "/run", "/sys", "/work", "/etc/shadow", r.dir,
		held(r, "sb-files").sock, uidLockFile} {
		mustFail(t, r, "sb-files", "seeing "+p, "test -e "+p)
	}
	// The init's /proc links name host files (its log is its stdout): the files API refuses
	// magic links, and commands may not open the init's /proc files at all.
	for _, p := range []string{"/proc/self/fd/1", "/proc/1/fd/1", "/proc/self/root/etc/hostname", "/proc/1/cwd/x"} {
		if got, err := readAll(r.ReadFile(ctx, "sb-files", p)); err == nil {
			t.Errorf("ReadFile(%s) = %q, want an error", p, got)
		}
	}
	for _, p := range []string{"/proc/1/fd/1", "/proc/1/environ", "/proc/1/exe", "/proc/1/root/"} {
		mustFail(t, r, "sb-files", "opening the init's "+p, "cat "+p)
	}
}

// Writing outside the sandbox's /tmp fails — its root is read-only — and creates nothing on
// the host; writing to a host path's name inside /tmp lands in the sandbox's own /tmp.
func TestEscapeWrites(t *testing.T) {
	r := escapeRuntime(t, Config{}, "sb-write")
	ctx := context.Background()
	name := fmt.Sprintf("berth-escape-%d", os.Getpid())
	for _, p := range []string{"/var/tmp/" + name, "/etc/passwd", "/usr/bin/" + name, "/" + name, "/dev/" + name, "/proc/" + name} {
		if err := r.WriteFile(ctx, "sb-write", p, bytes.NewReader([]byte("x"))); err == nil {
			t.Errorf("WriteFile(%s) succeeded", p)
		}
		mustFail(t, r, "sb-write", "writing "+p, "echo x > "+p)
	}
	for _, p := range []string{"/var/tmp/" + name, "/usr/bin/" + name, "/" + name} {
		if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("a sandbox's write created %s on the host (stat: %v)", p, err)
		}
	}
	dir := t.TempDir()
	planted := filepath.Join(dir, "planted")
	if err := r.WriteFile(ctx, "sb-write", planted, bytes.NewReader([]byte("x"))); err != nil {
		t.Errorf("WriteFile(%s) inside the sandbox's /tmp: %v", planted, err)
	}
	if _, err := os.Stat(planted); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a sandbox's write reached the host's %s (stat: %v)", planted, err)
	}
}

// The sandbox cannot unmount its /tmp or /proc to see what lies below, with the setuid umount
// binary or the system call, nor from a user namespace of its own (the mounts are locked).
func TestEscapeUnmount(t *testing.T) {
	r := escapeRuntime(t, Config{}, "sb-umount")
	for _, mp := range []string{"/tmp", "/proc", "/usr", "/dev/null"} {
		mustFail(t, r, "sb-umount", "umount "+mp, "umount -l "+mp)
		mustFail(t, r, "sb-umount", "umount2 "+mp, `python3 -c "
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
sys.exit(0 if libc.umount2(b'`+mp+`', 2) == 0 else 1)"`)
		mustFail(t, r, "sb-umount", "umount "+mp+" in a user namespace", "unshare -rm umount -l "+mp)
	}
	if res := sh(t, r, "sb-umount", "stat -f -c %T /tmp; test -e /proc/self/status && echo proc"); res.Stdout != "tmpfs\nproc\n" {
		t.Errorf("after the attempts: %+v, want /tmp a tmpfs and /proc mounted", res)
	}
}

// Commands run as the sandbox's uid with no capability and no_new_privs, so a setuid binary
// gains nothing; the init itself too.
func TestEscapePrivileges(t *testing.T) {
	r := escapeRuntime(t, Config{}, "sb-priv")
	sb := held(r, "sb-priv")
	uid := strconv.Itoa(sb.uid.uid)
	if res := sh(t, r, "sb-priv", "id -u; id -g; id -G"); res.Stdout != uid+"\n"+uid+"\n"+uid+"\n" {
		t.Errorf("id = %+v, want uid, gid and groups %s", res, uid)
	}
	if uid == "0" || sb.uid.uid < uidBase {
		t.Fatalf("sandbox uid %s", uid)
	}
	want := []string{"CapInh:\t0000000000000000", "CapPrm:\t0000000000000000", "CapEff:\t0000000000000000",
		"CapBnd:\t0000000000000000", "CapAmb:\t0000000000000000", "NoNewPrivs:\t1", "Uid:\t" + uid + "\t" + uid}
	status := sh(t, r, "sb-priv", "cat /proc/self/status").Stdout
	initStatus, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", sb.proc.Pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range want {
		if !strings.Contains(status, w) {
			t.Errorf("a command's /proc/self/status lacks %q:\n%s", w, status)
		}
		if !strings.Contains(string(initStatus), w) {
			t.Errorf("the init's status lacks %q:\n%s", w, initStatus)
		}
	}
	// Nothing of the init's (its socket, log, uid lease) is inherited: only stdin, stdout,
	// stderr, and the descriptor listdir opens.
	fds := `import os; print(sorted(os.listdir("/proc/self/fd")))`
	if res := run(t, r, "sb-priv", berth.ExecRequest{Cmd: []string{"python3", "-c", fds}}); res.Stdout != "['0', '1', '2', '3']\n" {
		t.Errorf("a command's descriptors: %+v", res)
	}
	// su and mount are setuid root on the host; here they run as the sandbox's uid.
	mustFail(t, r, "sb-priv", "su", "su -c id root </dev/null")
	mustFail(t, r, "sb-priv", "setuid mount", "mount -t tmpfs none /tmp")
}

// No cgroup file system is in view and none can be mounted, so no limit can be raised; the
// host's processes are invisible.
func TestEscapeCgroupsAndHostProc(t *testing.T) {
	r := escapeRuntime(t, Config{}, "sb-cg")
	mustFail(t, r, "sb-cg", "seeing /sys/fs/cgroup", "test -e /sys/fs/cgroup")
	mustFail(t, r, "sb-cg", "mounting the memory cgroup", "mkdir -p /tmp/cg && unshare -rm mount -t cgroup -o memory none /tmp/cg")
	mustFail(t, r, "sb-cg", "mounting sysfs", "mkdir -p /tmp/sys && unshare -rm mount -t sysfs none /tmp/sys")
	pid := strconv.Itoa(os.Getpid())
	mustFail(t, r, "sb-cg", "seeing the test's process", "test -e /proc/"+pid)
	mustFail(t, r, "sb-cg", "signalling the test's process", "kill -0 "+pid)
	count := `import os; print(sum(p.isdigit() for p in os.listdir("/proc")))`
	if res := run(t, r, "sb-cg", berth.ExecRequest{Cmd: []string{"python3", "-c", count}}); res.Stdout != "2\n" {
		t.Errorf("processes in view: %+v, want the init and python", res)
	}
}

// /tmp is a tmpfs of TmpMiB in the sandbox's memory: writing past it fails with "No space
// left", nothing reaches the host's disk, and what it holds is measured.
func TestEscapeTmpBounded(t *testing.T) {
	r := escapeRuntime(t, Config{TmpMiB: 32}, "sb-tmp")
	res := sh(t, r, "sb-tmp", "dd if=/dev/zero of=/tmp/fill bs=1M count=64")
	if res.ExitCode == 0 || !strings.Contains(res.Stderr, "No space left") {
		t.Errorf("writing 64 MiB into a 32 MiB /tmp: %+v, want No space left", res)
	}
	if res := sh(t, r, "sb-tmp", "stat -f -c %T /tmp; du -m /tmp/fill | cut -f1"); res.Stdout != "tmpfs\n32\n" {
		t.Errorf("/tmp: %+v, want a tmpfs holding 32 MiB", res)
	}
	if err := r.WriteFile(context.Background(), "sb-tmp", "/tmp/more", bytes.NewReader(make([]byte, 8<<20))); berth.ErrorCode(err) != berth.EConflict {
		t.Errorf("WriteFile into a full /tmp = %v, want %s", err, berth.EConflict)
	}
	var hostBytes int64
	filepath.WalkDir(r.dir, func(p string, d fs.DirEntry, err error) error {
		if info, err := d.Info(); err == nil && info.Mode().IsRegular() {
			hostBytes += info.Size()
		}
		return nil
	})
	if hostBytes > 1<<20 {
		t.Errorf("the runtime's Dir holds %d bytes on the host's disk after /tmp filled", hostBytes)
	}
	if m, err := r.Measure("sb-tmp"); err != nil || m.ResidentMiB < 30 {
		t.Errorf("Measure = %+v, %v; want the 32 MiB of /tmp counted", m, err)
	}
}

// A process bomb cannot pass PidsLimit, and the init keeps serving.
func TestEscapePidsLimit(t *testing.T) {
	const limit = 64
	r := escapeRuntime(t, Config{PidsLimit: limit}, "sb-pids")
	script := `import os, sys
spawned = 0
for _ in range(2 * int(sys.argv[1])):
    try:
        os.posix_spawn("/usr/bin/sleep", ["sleep", "30"], {})
        spawned += 1
    except OSError:
        pass
print(spawned, sum(p.isdigit() for p in os.listdir("/proc")))`
	res := run(t, r, "sb-pids", berth.ExecRequest{Cmd: []string{"python3", "-c", script, strconv.Itoa(limit)}, TimeoutS: 20})
	var spawned, procs int
	if _, err := fmt.Sscan(res.Stdout, &spawned, &procs); err != nil || res.ExitCode != 0 {
		t.Fatalf("bomb: %+v", res)
	}
	sb := held(r, "sb-pids")
	current := ""
	for _, cg := range sb.cgroups {
		if b, err := os.ReadFile(filepath.Join(cg, "pids.current")); err == nil {
			current = strings.TrimSpace(string(b))
		}
	}
	n, _ := strconv.Atoi(current)
	t.Logf("spawned %d of %d, %d processes in view, pids.current %s", spawned, 2*limit, procs, current)
	if spawned >= 2*limit || procs > limit || n == 0 || n > limit {
		t.Errorf("spawned %d, %d processes in view, pids.current %q; want all within %d", spawned, procs, current, limit)
	}
	// At the limit a command cannot start (126), but the init keeps serving.
	for range 3 {
		res, err := r.Exec(context.Background(), "sb-pids", berth.ExecRequest{Cmd: []string{"true"}, TimeoutS: 10})
		if err != nil || (res.ExitCode != 0 && res.ExitCode != 126) {
			t.Errorf("exec at the limit: %+v, %v; want 0 or 126", res, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.Ping(ctx, "sb-pids"); err != nil {
		t.Errorf("the init stopped serving under the limit: %v; its log begins: %s", err, logHead(sb))
	}
	if m, err := r.Measure("sb-pids"); err != nil || m.Exited {
		t.Errorf("Measure = %+v, %v; want the init alive", m, err)
	}
}

// The sandbox reaches nothing of the host's network: not a listener on the host's loopback,
// nor any other address (it has only its own lo).
func TestEscapeNetwork(t *testing.T) {
	r := escapeRuntime(t, Config{}, "sb-net")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	addrs := []string{l.Addr().String()}
	if all, err := net.Listen("tcp", ":0"); err == nil {
		defer all.Close()
		port := all.Addr().(*net.TCPAddr).Port
		ifAddrs, _ := net.InterfaceAddrs()
		for _, a := range ifAddrs {
			if ip, ok := a.(*net.IPNet); ok && !ip.IP.IsLoopback() && ip.IP.To4() != nil {
				addrs = append(addrs, net.JoinHostPort(ip.IP.String(), strconv.Itoa(port)))
			}
		}
	}
	for _, a := range addrs {
		host, port, _ := net.SplitHostPort(a)
		mustFail(t, r, "sb-net", "connecting to the host's "+a, fmt.Sprintf(
			`python3 -c "import socket; socket.create_connection(('%s', %s), timeout=3)"`, host, port))
	}
	l.(*net.TCPListener).SetDeadline(time.Now())
	if c, err := l.Accept(); err == nil {
		c.Close()
		t.Errorf("the host's listener got a connection from %s", c.RemoteAddr())
	}
}

// logHead returns the start of the init's log, where a Go runtime abort says why.
func logHead(sb *sandbox) string {
	b, _ := os.ReadFile(filepath.Join(sb.dir, logFile))
	return string(b[:min(len(b), 1500)])
}
