package escape

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// procSysWrites (ISO-1): the host kernel's settings are out of the sandbox's reach. It
// writes harmless values to /proc/sys/kernel/{hostname,core_pattern,modprobe},
// /proc/sys/vm/drop_caches, /proc/sysrq-trigger ("h": help only), /proc/sys/net/ipv4/
// ip_forward, and lowers its own oom_score_adj to -1000 (which would make it the last thing
// the host's OOM killer takes); from exec and through the files API. Each must fail, and the
// host's values must be unchanged afterwards.
func procSysWrites(t *testing.T, d *dev) {
	c := d.Tenant[0]
	id := c.create(t, "shell", sandboxOpts{})
	tag := randHex(6)
	watched := []string{"/proc/sys/kernel/hostname", "/proc/sys/kernel/core_pattern", "/proc/sys/kernel/modprobe", "/proc/sys/net/ipv4/ip_forward"}
	before := map[string]string{}
	for _, p := range watched {
		b, _ := os.ReadFile(p)
		before[p] = string(b)
	}
	writes := map[string]string{
		"/proc/sys/kernel/hostname": "escaped-" + tag, "/proc/sys/kernel/core_pattern": "core-escape-" + tag,
		"/proc/sys/kernel/modprobe": "/tmp/escape-" + tag, "/proc/sys/vm/drop_caches": "1", "/proc/sysrq-trigger": "h",
		"/proc/sys/net/ipv4/ip_forward": "1", "/proc/self/oom_score_adj": "-1000",
	}
	var sh strings.Builder
	for p, v := range writes {
		fmt.Fprintf(&sh, "if echo '%s' > %s 2>/dev/null; then echo \"WROTE %s\"; else echo \"refused %s\"; fi\n", v, p, p, p)
	}
	sh.WriteString("echo PROBE-DONE\n")
	r := c.mustSh(t, id, 30, sh.String())
	for _, line := range strings.Split(r.Stdout, "\n") {
		if strings.HasPrefix(line, "WROTE ") {
			if strings.HasSuffix(line, "oom_score_adj") && d.Runtime == "gvisor" {
				t.Logf("gvisor: %s (the sentry's own value; the host's is untouched)", line)
				continue
			}
			escaped(t, d, "a write to the kernel's settings succeeded", line)
		}
	}
	for p, v := range writes {
		if st, body := c.put(t, id, p, []byte(v)); st == 204 {
			escaped(t, d, "the files API wrote "+p, body)
		}
	}
	for _, p := range watched {
		b, _ := os.ReadFile(p)
		if string(b) != before[p] {
			escaped(t, d, "the host's "+p+" changed", fmt.Sprintf("%q → %q", before[p], string(b)))
			os.WriteFile(p, []byte(before[p]), 0o644) // put it back
		}
	}
	t.Logf("%s", r.Stdout)
}

// devAccess (ISO-1): no host device is in reach. It opens the host's memory, ports, kernel
// log, disks, consoles and KVM by their usual names, and makes block and character device
// nodes of its own (the host's root disk, /dev/mem) with mknod to read them. None may open
// and read; devices the runtime itself provides (gVisor's /dev/fuse, /dev/net/tun) are
// only reported.
func devAccess(t *testing.T, d *dev) {
	c := d.Tenant[0]
	id := c.create(t, "python", sandboxOpts{})
	var st unix.Stat_t
	rootDev := uint64(0)
	if unix.Stat("/", &st) == nil {
		rootDev = st.Dev
	}
	r := c.mustPy(t, id, 30, map[string]any{"rootmajor": unix.Major(rootDev), "rootminor": unix.Minor(rootDev)}, `
import os, stat
print("DEV", sorted(os.listdir("/dev")))
bad = ["/dev/mem", "/dev/kmem", "/dev/port", "/dev/kmsg", "/dev/vda", "/dev/vdb", "/dev/sda", "/dev/nvme0n1", "/dev/xvda",
       "/dev/loop0", "/dev/console", "/dev/tty0", "/dev/tty1", "/dev/ttyS0", "/dev/hvc0", "/dev/mapper/control", "/dev/kvm",
       "/dev/vsock", "/dev/vhost-net", "/dev/vhost-vsock", "/dev/dm-0", "/dev/sr0", "/dev/snapshot", "/dev/cpu/0/msr"]
info = ["/dev/fuse", "/dev/net/tun", "/dev/ptmx", "/dev/full"]  # not /dev/tty: a read from a background group stops the reader (11h covers it)
for p in bad + info:
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        print("refused", p, e.strerror)
        continue
    try:
        n = len(os.read(fd, 64))
    except OSError as e:
        n = "read refused: " + e.strerror
    os.close(fd)
    print(("OPENED " if p in bad else "info-opened ") + p, n)
for name, kind, major, minor in (("blk-root", stat.S_IFBLK, P["rootmajor"], P["rootminor"]), ("chr-mem", stat.S_IFCHR, 1, 1),
                                 ("chr-kmsg", stat.S_IFCHR, 1, 11)):
    for d in ("/tmp", "/dev/shm"):
        p = os.path.join(d, name)
        try:
            os.mknod(p, 0o600 | kind, os.makedev(major, minor))
        except OSError as e:
            print("mknod refused", p, e.strerror)
            continue
        print("mknod made", p)
        try:
            fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
            b = os.read(fd, 512)
            os.close(fd)
            print("MKNOD-READ", p, len(b), b[:32])
        except OSError as e:
            print("mknod node refused", p, e.strerror)
print("PROBE-DONE")
`)
	for _, line := range strings.Split(r.Stdout, "\n") {
		if strings.HasPrefix(line, "OPENED ") || strings.HasPrefix(line, "MKNOD-READ ") {
			escaped(t, d, "a host device opened", line)
		}
	}
	t.Logf("%s", r.Stdout)
}

// ptraceOthers (ISO-1): ptrace reaches nothing of the host. From Python it PTRACE_ATTACHes
// to every process it can see but itself. On the process runtime the init (pid 1) is not
// dumpable and must refuse; on gVisor every process in view is the sandbox's own (attempt 04
// checks that none of the host's is), so an attach there is reported, not an escape.
func ptraceOthers(t *testing.T, d *dev) {
	c := d.Tenant[0]
	id := c.create(t, "python", sandboxOpts{})
	r := c.mustPy(t, id, 30, nil, `
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
me, parent = os.getpid(), os.getppid()
for pid in sorted(int(p) for p in os.listdir("/proc") if p.isdigit()):
    if pid == me:
        continue
    try:
        cmd = open("/proc/%d/cmdline" % pid, "rb").read().replace(b"\0", b" ")[:120]
    except Exception:
        cmd = b"?"
    if libc.ptrace(16, pid, None, None) == 0:
        os.waitpid(pid, 0x40000000)
        libc.ptrace(17, pid, None, None)
        print("ATTACHED", pid, cmd)
    else:
        print("refused", pid, os.strerror(ctypes.get_errno()), cmd)
print("PROBE-DONE")
`)
	for _, line := range strings.Split(r.Stdout, "\n") {
		if strings.HasPrefix(line, "ATTACHED ") {
			if d.Runtime == "process" && strings.HasPrefix(line, "ATTACHED 1 ") {
				escaped(t, d, "ptrace attached to the sandbox's init, which must not be dumpable", line)
			} else {
				t.Logf("%s: %s (a process of the sandbox itself)", d.Runtime, line)
			}
		}
	}
	t.Logf("%s", r.Stdout)
}

// initSocket (ISO-1): the init's socket and directory lead nowhere but the sandbox itself.
// It writes to /.berth (the init binary, shared by every sandbox of an agent, must be
// read-only), then finds every unix socket on its file system and every abstract one in
// /proc/net/unix and sends each an init "exec" request for `hostname`: whatever answers must
// be its own init (its own hostname), never another sandbox's.
func initSocket(t *testing.T, d *dev) {
	c := d.Tenant[0]
	id := c.create(t, "python", sandboxOpts{})
	own := c.mustSh(t, id, 30, "hostname")
	host := strings.TrimSpace(own.Stdout)
	r := c.mustPy(t, id, 60, nil, `
import os, socket, stat, time
for p in ("/.berth/berth", "/.berth/lib/loader.so", "/.berth/planted", "/.berth/lib/planted"):
    try:
        with open(p, "ab") as f:
            f.write(b"x")
        print("WROTE", p)
    except Exception as e:
        print("refused", p, type(e).__name__)
socks, t0 = [], time.time()
for dirpath, dirs, files in os.walk("/"):
    if dirpath == "/" and "proc" in dirs:
        dirs.remove("proc")
    if time.time() - t0 > 20:
        break
    for f in files:
        p = os.path.join(dirpath, f)
        try:
            if stat.S_ISSOCK(os.lstat(p).st_mode):
                socks.append(p)
        except Exception:
            pass
try:
    for line in open("/proc/net/unix").read().splitlines()[1:]:
        parts = line.split()
        if len(parts) >= 8 and parts[7].startswith("@"):
            socks.append("\0" + parts[7][1:])
except Exception as e:
    print("no /proc/net/unix", e)
print("SOCKETS", json.dumps(socks))
req = json.dumps({"op": "exec", "cmd": ["/bin/sh", "-c", "echo HOST=$(hostname)"], "timeout_s": 5}).encode() + b"\n"
for p in socks:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    try:
        s.connect(p)
        s.sendall(req)  # and keep our side open: an init reads EOF as "the runtime gave up"
        got = b""
        while len(got) < 4096 and not got.endswith(b"\n"):
            b = s.recv(4096)
            if not b:
                break
            got += b
        print("ANSWER", repr(p), got[:300])
    except Exception as e:
        print("refused", repr(p), e)
    finally:
        s.close()
print("PROBE-DONE")
`)
	for _, line := range strings.Split(r.Stdout, "\n") {
		if strings.HasPrefix(line, "WROTE ") {
			escaped(t, d, "the sandbox wrote into /.berth, the init directory its agent's sandboxes share", line)
		}
		if strings.HasPrefix(line, "ANSWER ") && strings.Contains(line, "HOST=") && !strings.Contains(line, "HOST="+host+`\\n`) {
			escaped(t, d, "a socket in view led to another sandbox's init", fmt.Sprintf("own hostname %q; %s", host, line))
		}
	}
	if strings.Contains(r.Stdout, `"/.berth/run/init.sock"`) && !strings.Contains(r.Stdout, "HOST="+host+`\\n`) {
		t.Errorf("%s: the sandbox's own init socket is in view but did not answer the probe, so the socket check proves nothing:\n%s", d.Runtime, r.Stdout)
	}
	t.Logf("%s", r.Stdout)
}

// setuidBinaries (ISO-1): nothing in the sandbox regains privilege. It lists the setuid
// binaries in view (the host's /usr has su, newgrp, mount, passwd …) and runs su and newgrp
// to become root or join group 0; it checks its capability sets are empty. Any uid or gid 0,
// or a capability, is an escape.
func setuidBinaries(t *testing.T, d *dev) {
	c := d.Tenant[0]
	id := c.create(t, "shell", sandboxOpts{})
	r := c.mustSh(t, id, 60, `
grep -E '^(Uid|Gid|Cap(Inh|Prm|Eff|Bnd|Amb)|NoNewPrivs)' /proc/self/status
echo "SETUID: $(timeout 20 find / -path /proc -prune -o -perm -4000 -type f -print 2>/dev/null | tr '\n' ' ')"
echo "SU=$(timeout 5 su root -c 'id -u' </dev/null 2>&1 | tr '\n' ' ')"
echo "NEWGRP=$(echo 'id -g' | timeout 5 newgrp root 2>&1 | tr '\n' ' ')"
echo "NEWGRP0=$(echo 'id -g' | timeout 5 newgrp 2>&1 | tr '\n' ' ')"
echo PROBE-DONE`)
	for _, line := range strings.Split(r.Stdout, "\n") {
		f := strings.Fields(line)
		switch {
		case strings.HasPrefix(line, "SU=") && len(f) > 0 && f[0] == "SU=0":
			escaped(t, d, "su became root", line)
		case strings.HasPrefix(line, "NEWGRP") && len(f) > 0 && strings.HasSuffix(f[0], "=0"):
			escaped(t, d, "newgrp joined group 0", line)
		case strings.HasPrefix(line, "Cap") && len(f) == 2 && strings.Trim(f[1], "0") != "":
			escaped(t, d, "a sandbox process holds a capability", line)
		case (strings.HasPrefix(line, "Uid:") || strings.HasPrefix(line, "Gid:")) && strings.Contains(" "+strings.Join(f[1:], " ")+" ", " 0 "):
			escaped(t, d, "a sandbox process runs as root", line)
		}
	}
	t.Logf("%s", r.Stdout)
}

// kernelLog (ISO-1): the host kernel's log (which names other sandboxes' cgroups in its OOM
// reports) is not readable: dmesg, /dev/kmsg and syslog(2). What answers must carry nothing
// of the host's log — its kernel release, OOM reports, command line.
func kernelLog(t *testing.T, d *dev) {
	c := d.Tenant[0]
	id := c.create(t, "python", sandboxOpts{})
	var uts unix.Utsname
	unix.Uname(&uts)
	release := unix.ByteSliceToString(uts.Release[:])
	r := c.mustPy(t, id, 30, nil, `
import ctypes, os, subprocess
libc = ctypes.CDLL(None, use_errno=True)
buf = ctypes.create_string_buffer(1 << 16)
n = libc.syscall(103, 3, buf, 1 << 16)
print("SYSLOG", n, buf.raw[:max(n, 0)][:4000])
try:
    fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    print("KMSG", os.read(fd, 4000))
except OSError as e:
    print("kmsg refused", e.strerror)
r = subprocess.run(["dmesg"], capture_output=True, text=True)
print("DMESG", r.returncode, r.stdout[:4000], r.stderr[:200])
print("PROBE-DONE")
`)
	if hit := containsAny(r.Stdout, release, "oom-kill:", "Memory cgroup out of memory", "Command line:", "berth"); hit != "" {
		escaped(t, d, "the sandbox read the host kernel's log", fmt.Sprintf("%q in %s", hit, tail(r.Stdout, 2000)))
	}
	t.Logf("%s", tail(r.Stdout, 2000))
}

// sessionKeyring (ISO-1): the operator's kernel keys are out of reach. berth dev runs in a
// session keyring holding a secret "user" key (as an ssh login's pam_keyinit session would);
// the sandbox looks the key up by its description (request_key), walks its own session
// keyring and reads what it finds. It must get neither the key nor its payload.
func sessionKeyring(t *testing.T, d *dev) {
	c := d.Tenant[0]
	id := c.create(t, "python", sandboxOpts{})
	r := c.mustPy(t, id, 30, map[string]any{"desc": d.KeyDesc}, `
import ctypes, os, struct
libc = ctypes.CDLL(None, use_errno=True)
SYS_add_key, SYS_request_key, SYS_keyctl = 248, 249, 250
def keyctl(*a):
    return libc.syscall(SYS_keyctl, *[ctypes.c_long(x) if isinstance(x, int) else x for x in a])
def read(kid):
    buf = ctypes.create_string_buffer(4096)
    n = keyctl(11, kid, buf, 4096)
    return buf.raw[:n] if n >= 0 else None
def describe(kid):
    buf = ctypes.create_string_buffer(512)
    n = keyctl(6, kid, buf, 512)
    return buf.raw[:max(n - 1, 0)].decode("utf-8", "replace") if n > 0 else "?"
sess = keyctl(0, -3, 0)
print("SESSION", sess, describe(sess))
kid = libc.syscall(SYS_request_key, b"user", P["desc"].encode(), None, 0)
if kid > 0:
    print("FOUND-KEY by request_key", kid, describe(kid), "payload:", read(kid))
else:
    print("request_key refused", os.strerror(ctypes.get_errno()))
links = read(sess) or b""
for i in range(0, len(links) - len(links) % 4, 4):
    k = struct.unpack("i", links[i:i + 4])[0]
    desc = describe(k)
    print("LINKED", k, desc, "payload:", read(k))
    if P["desc"] in desc:
        print("FOUND-KEY in the session keyring", k)
try:
    print("PROC-KEYS", open("/proc/keys").read())
except Exception as e:
    print("no /proc/keys", e)
print("PROBE-DONE")
`)
	if strings.Contains(r.Stdout, d.KeySecret) || strings.Contains(r.Stdout, "FOUND-KEY") {
		escaped(t, d, "the sandbox reached the operator's session keyring (berth dev's) and its secret key",
			fmt.Sprintf("(key %q holds %q)\n%s", d.KeyDesc, d.KeySecret, tail(r.Stdout, 2000)))
	}
	t.Logf("%s", tail(r.Stdout, 2000))
}

// controllingTerminal (ISO-1): berth dev runs in the operator's terminal (here a
// pseudo-terminal the test holds); a sandbox must not reach it. From Python it opens
// /dev/tty, writes a token to it, sets NOFLSH on it (so the Ctrl-C that stops berth dev keeps
// pending input) and pushes a command into its input with TIOCSTI — which, in a real
// terminal, the operator's shell would run as root once berth dev exits — and tries to become
// the terminal's foreground process group (which reads the operator's keystrokes). The test
// watches its end of the terminal: neither token may show up there, nor the injected input.
func controllingTerminal(t *testing.T, d *dev) {
	c := d.Tenant[0]
	id := c.create(t, "python", sandboxOpts{})
	wrote, injected := "BERTH-ESCAPE-TTY-"+randHex(6), "BERTH-ESCAPE-INJECT-"+randHex(6)
	r := c.mustPy(t, id, 30, map[string]any{"wrote": reverse(wrote), "inject": reverse(injected)}, `
import os, fcntl, termios
for fd in (0, 1, 2):
    try:
        print("fd", fd, os.ttyname(fd))
    except OSError as e:
        print("fd", fd, "not a tty")
try:
    tty = os.open("/dev/tty", os.O_RDWR)
    print("TTY-OPEN", os.ttyname(tty))
    os.write(tty, ("\n" + P["wrote"][::-1] + "\n").encode())
    # NOFLSH: the operator's Ctrl-C (which stops berth dev) would no longer flush what is
    # injected below, so the shell runs it. A background group needs SIGTTOU ignored.
    import signal
    signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        a = termios.tcgetattr(tty)
        a[3] |= termios.NOFLSH
        termios.tcsetattr(tty, termios.TCSANOW, a)
        print("TCSETATTR-OK: NOFLSH set on the operator's terminal")
    except (OSError, termios.error) as e:
        print("tcsetattr refused", e)
    try:
        for ch in ("echo " + P["inject"][::-1] + "\n").encode():
            fcntl.ioctl(tty, termios.TIOCSTI, bytes([ch]))
        print("TIOCSTI-OK")
    except OSError as e:
        print("tiocsti refused", e.strerror)
    # Become the terminal's foreground group, which would read the operator's keystrokes.
    try:
        os.tcsetpgrp(tty, os.getpgrp())
        print("TCSETPGRP-OK: foreground of the operator's terminal")
    except OSError as e:
        print("tcsetpgrp refused", e.strerror)
except OSError as e:
    print("tty refused", e.strerror)
print("PROBE-DONE")
`)
	time.Sleep(500 * time.Millisecond) // real: an absence: time for a sandboxed process to write to the operator's terminal, if it can
	// What a shell on this terminal would read next.
	var input string
	if fd := int(d.pts.Fd()); unix.SetNonblock(fd, true) == nil {
		buf := make([]byte, 4096)
		if n, err := unix.Read(fd, buf); err == nil && n > 0 {
			input = string(buf[:n])
		}
	}
	screen := d.tty.String()
	switch {
	case strings.Contains(input, injected):
		escaped(t, d, "the sandbox injected input into berth dev's controlling terminal (TIOCSTI on /dev/tty): the operator's shell would run it as root",
			fmt.Sprintf("the terminal's pending input is %q; sandbox said:\n%s", input, r.Stdout))
	case strings.Contains(screen, wrote) || strings.Contains(screen, injected):
		escaped(t, d, "the sandbox wrote to berth dev's controlling terminal (/dev/tty)", fmt.Sprintf("the terminal shows %q; sandbox said:\n%s", tail(screen, 500), r.Stdout))
	case strings.Contains(r.Stdout, "TTY-OPEN") || strings.Contains(r.Stdout, "TIOCSTI-OK"):
		escaped(t, d, "the sandbox opened a controlling terminal", r.Stdout)
	}
	t.Logf("%s", r.Stdout)
}

// initDescriptorsWrite (ISO-2): scratch data never lands on the host's disk, not even
// through a descriptor the sandbox's init inherited from the host (its log is a host file).
// From Python it opens every /proc/1/fd/N it may for appending and writes up to 32 MiB into
// each (non-blocking, bounded). On the host no file under berth dev's data directory may
// grow by more than 4 MiB, and the disk's free space must not fall by half of what the
// sandbox says it wrote.
func initDescriptorsWrite(t *testing.T, d *dev) {
	diskMu.Lock()
	defer diskMu.Unlock()
	c := d.Tenant[0]
	id := c.create(t, "shell", sandboxOpts{})
	agents := filepath.Join(d.Data, "agents")
	before := dirSizes(agents)
	free0 := freeBytes(d.Data)
	r := c.mustPy(t, id, 60, nil, `
import os, errno
chunk = b"B" * (1 << 20)
try:
    fds = sorted(os.listdir("/proc/1/fd"), key=lambda s: int(s) if s.isdigit() else 0)
except OSError as e:
    fds = []
    print("no /proc/1/fd:", e.strerror)
for fd in fds:
    p = "/proc/1/fd/" + fd
    try:
        target = os.readlink(p)
    except OSError as e:
        target = "? " + e.strerror
    if target.startswith(("pipe:", "socket:", "anon_inode:")):
        print("skipped", p, target, "(inside the sandbox: a pipe back to this very exec, or not a file)")
        continue
    try:
        w = os.open(p, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK)
    except OSError as e:
        print("refused", p, target, e.strerror)
        continue
    n = 0
    try:
        for i in range(32):
            n += os.write(w, chunk)
    except OSError as e:
        pass
    os.close(w)
    print("WROTE", p, target, n)
print("PROBE-DONE")
`)
	free1 := freeBytes(d.Data)
	if g := grown(before, agents, 4<<20); len(g) > 0 {
		escaped(t, d, "the sandbox wrote into host files on the data directory's disk through its init's descriptors (/proc/1/fd/N): unbounded by its /tmp",
			fmt.Sprintf("grew: %v\n  sandbox said:\n%s", g, tail(r.Stdout, 1500)))
	} else if drop := free0 - free1; wroteTotal(r.Stdout) >= 16<<20 && drop > wroteTotal(r.Stdout)/2 {
		// Only what the sandbox says it wrote can be blamed on it: the disk is shared.
		escaped(t, d, "writing through /proc/1/fd consumed the host's disk", fmt.Sprintf("free space fell by %d MiB; sandbox said:\n%s", drop>>20, tail(r.Stdout, 1500)))
	}
	t.Logf("%s", r.Stdout)
}

// wroteTotal sums the byte counts of attempt 11i's "WROTE <path> <target> <n>" lines.
func wroteTotal(out string) int64 {
	var total int64
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) == 4 && f[0] == "WROTE" {
			if n, err := strconv.ParseInt(f[3], 10, 64); err == nil {
				total += n
			}
		}
	}
	return total
}

// initImpostor (found attacks): the guest stands in for its sandbox's init — it moves the
// init's socket aside, listens in its place, passes one exec on to the real init and, once
// the command has run, answers it with a forged line. Two forgeries: Berth's own refusal
// rate_limited, which every SDK resends for any call (the server sends it before doing
// anything); an init's code with a message of 200 KB, past what the replica reads of an
// agent's error, which turned into "agent unavailable", retryable; and no answer at all, which
// the replica's wait (timeout_s + 10 s) answered 503 unavailable, retryable. None may reach
// the caller as a retryable answer (the last must be 504 outcome_unknown), and the command
// must have run exactly once each time. Where
// the guest cannot move the socket (the process runtime keeps it out of the sandbox's view),
// there is nothing to impersonate; on gVisor the setup must work, or it proves nothing.
func initImpostor(t *testing.T, d *dev) {
	c := d.Tenant[0]
	id := c.create(t, "python", sandboxOpts{})
	impostor := `
import os, socket, sys
run = "/.berth/run"
sock, real = run + "/init.sock", run + "/real.sock"
forged = open("/tmp/forged").read().encode() + b"\n"
os.rename(sock, real)
srv = socket.socket(socket.AF_UNIX)
srv.bind(sock)
srv.listen(8)
srv.settimeout(60)
open("/tmp/impostor-ready", "w").close()
try:
    conn, _ = srv.accept()
    line = conn.makefile("rb").readline()
    up = socket.socket(socket.AF_UNIX)
    up.connect(real)
    up.sendall(line)
    up.makefile("rb").readline()  # the real init's answer: the command has run
    if forged.strip() == b"HOLD":
        conn.settimeout(60)
        try:
            conn.recv(1)  # never answer: wait for the agent to give up and hang up
        except OSError:
            pass
    else:
        conn.sendall(forged)
    conn.close()
    up.close()
finally:
    os.unlink(sock)
    os.rename(real, sock)
    open("/tmp/impostor-done", "w").close()
`
	if st, body := c.put(t, id, "/tmp/impostor.py", []byte(impostor)); st != 204 {
		t.Fatalf("could not write the impostor (so the attempt proves nothing): %d %s", st, body)
	}
	for round, forged := range []string{
		`{"code":"rate_limited","message":"forged by the guest"}`,
		`{"code":"conflict","message":"` + strings.Repeat("A", 200_000) + `"}`,
		"HOLD", // no answer until the agent hangs up
	} {
		if !impostorAnswers(t, d, c, id, round, forged) {
			return
		}
	}
}

// impostorAnswers runs one round of initImpostor: the guest's impostor answers one exec with
// forged. It reports false when the guest cannot stand in for its init on this runtime.
func impostorAnswers(t *testing.T, d *dev, c client, id string, round int, forged string) bool {
	if st, body := c.put(t, id, "/tmp/forged", []byte(forged)); st != 204 {
		t.Fatalf("could not write the forged answer (so the attempt proves nothing): %d %s", st, body)
	}
	setup := c.mustPy(t, id, 30, nil, `
import os, subprocess, sys, time
for f in ("/tmp/impostor-ready", "/tmp/impostor-done"):
    if os.path.exists(f):
        os.unlink(f)
subprocess.Popen([sys.executable, "/tmp/impostor.py"], start_new_session=True, stdin=subprocess.DEVNULL,
                 stdout=open("/tmp/impostor.log", "w"), stderr=subprocess.STDOUT)
for _ in range(100):
    if os.path.exists("/tmp/impostor-ready"):
        print("READY")
        break
    time.sleep(0.1)
print("PROBE-DONE")
`)
	if !strings.Contains(setup.Stdout, "READY") {
		log := c.sh(t, id, 10, "cat /tmp/impostor.log")
		if d.Runtime == "gvisor" {
			t.Fatalf("the guest could not stand in for its init on gVisor, so the attempt proves nothing: %s", log.Stdout)
		}
		t.Logf("%s: the guest cannot move its init's socket: %s", d.Runtime, log.Stdout)
		return false
	}
	count := fmt.Sprintf("/tmp/count-%d", round)
	timeoutS := 30
	if forged == "HOLD" {
		timeoutS = 2 // the replica waits timeout_s + 10 s for an answer that never comes
	}
	r := c.sh(t, id, timeoutS, "echo ran >> "+count)
	if r.Status == 429 || r.Status == 503 || strings.Contains(r.Body, `"retryable":true`) {
		escaped(t, d, "a guest answering for its init made an exec that ran look retryable", fmt.Sprintf("round %d: %s", round, tail(r.String(), 600)))
	}
	if forged == "HOLD" && (r.Status != 504 || r.Code != "outcome_unknown") {
		t.Errorf("round %d: an exec whose answer never came: %s; want 504 outcome_unknown (it ran)", round, tail(r.String(), 600))
	}
	var ran execResult
	for range 50 { // the impostor puts the real socket back once it has answered
		if ran = c.sh(t, id, 10, "cat /tmp/impostor-done && cat "+count); ran.ok() && ran.ExitCode == 0 {
			break
		}
		time.Sleep(200 * time.Millisecond) // real: the guest's own process restoring the socket
	}
	if n := strings.Count(ran.Stdout, "ran"); n != 1 {
		t.Errorf("round %d: the exec answered by the impostor ran %d times, want once: %s (its answer: %s)", round, n, ran, tail(r.String(), 600))
	}
	t.Logf("%s round %d: the impostor's exec was answered %s", d.Runtime, round, tail(r.String(), 300))
	return true
}
