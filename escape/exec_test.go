package escape

import (
	"encoding/json"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// execReadHostFile (ISO-1): a command in the sandbox must see nothing of the host's files.
// It reads the same targets as attempt 02 with cat (directly, through a "/" symlink and
// /proc/{1,self}/root), searches the whole tree for admin.key and the targets' names with
// find (bounded by timeout), and opens them from Python. No output may carry their contents,
// and find must name none of them.
func execReadHostFile(t *testing.T, d *dev) {
	c := d.Tenant[0]
	id := c.create(t, "python", sandboxOpts{})
	var sh strings.Builder
	sh.WriteString("ln -sfn / /tmp/hostroot\n")
	for _, p := range d.hostTargets() {
		for _, v := range []string{p, "/tmp/hostroot" + p, "/proc/1/root" + p, "/proc/self/root" + p, "/proc/self/cwd/../../../.." + p} {
			fmt.Fprintf(&sh, "cat '%s' 2>&1\n", v)
		}
	}
	fmt.Fprintf(&sh, "echo FIND-BEGIN; timeout 20 find / -path /proc -prune -o \\( -name admin.key -o -name berth.db -o -name '%s' -o -name '%s' \\) -print 2>/dev/null; echo FIND-END\n",
		filepath.Base(d.VarTmp), filepath.Base(d.HostDir))
	sh.WriteString("echo PROBE-DONE\n")
	r := c.mustSh(t, id, 45, sh.String())
	out := r.Stdout + r.Stderr
	if leaked := containsAny(out, d.secrets()...); leaked != "" {
		escaped(t, d, "cat/find read a host file", fmt.Sprintf("output carries %q:\n%s", leaked, tail(out, 3000)))
	}
	_, after, _ := strings.Cut(r.Stdout, "FIND-BEGIN")
	found, _, _ := strings.Cut(after, "FIND-END")
	for _, line := range strings.Split(found, "\n") {
		line = strings.TrimSpace(line)
		if strings.HasSuffix(line, "/admin.key") || strings.HasSuffix(line, "/berth.db") ||
			strings.HasSuffix(line, filepath.Base(d.VarTmp)) || strings.Contains(line, filepath.Base(filepath.Dir(d.Data))) {
			escaped(t, d, "find / sees a host file of berth dev or the test", line)
		}
	}
	py := c.mustPy(t, id, 45, map[string]any{"targets": d.hostTargets()}, `
import os
for p in P["targets"]:
    for v in (p, "/proc/1/root" + p, "/proc/self/root" + p, "/tmp/hostroot" + p):
        try:
            with open(v) as f:
                print("READ", v, f.read())
        except Exception as e:
            print("refused", v, type(e).__name__)
print("PROBE-DONE")
`)
	if leaked := containsAny(py.Stdout+py.Stderr, d.secrets()...); leaked != "" {
		escaped(t, d, "python open() read a host file", fmt.Sprintf("output carries %q:\n%s", leaked, tail(py.Stdout, 3000)))
	}
	t.Logf("cat/find:\n%s\npython:\n%s", tail(r.Stdout, 1500), tail(py.Stdout, 1500))
}

// execFindBerthEnviron (ISO-1): berth dev's process must be out of the sandbox's sight. Its
// environment holds a random marker (BERTH_ESCAPE_MARKER); a Python program reads every
// /proc/*/environ and /proc/*/cmdline it can and looks for the marker (spelled backwards in
// the program, so the program itself does not carry it), for berth dev's command line
// ("dev … --data … --listen"), and whether berth dev's host pid exists in its /proc.
func execFindBerthEnviron(t *testing.T, d *dev) {
	c := d.Tenant[0]
	id := c.create(t, "python", sandboxOpts{})
	rev := []rune(d.Marker)
	for i, j := 0, len(rev)-1; i < j; i, j = i+1, j-1 {
		rev[i], rev[j] = rev[j], rev[i]
	}
	r := c.mustPy(t, id, 45, map[string]any{"rev": string(rev), "hostpid": d.PID}, `
import os
marker = P["rev"][::-1]
me = os.getpid()
hits, procs = [], []
for pid in sorted(os.listdir("/proc")):
    if not pid.isdigit():
        continue
    info = {"pid": int(pid)}
    for f in ("environ", "cmdline"):
        try:
            b = open("/proc/%s/%s" % (pid, f), "rb").read()
        except Exception as e:
            info[f] = "unreadable: " + type(e).__name__
            continue
        s = b.replace(b"\0", b" ").decode("utf-8", "replace")
        if f == "cmdline":
            info["cmdline"] = s[:400]
        else:
            info["environ"] = "%d bytes" % len(b)
        if marker in s and int(pid) != me:
            hits.append("/proc/%s/%s" % (pid, f))
    procs.append(info)
hp = str(P["hostpid"])
if os.path.exists("/proc/" + hp):
    try:
        print("HOSTPID-VISIBLE", open("/proc/%s/cmdline" % hp, "rb").read().replace(b"\0", b" ").decode())
    except Exception as e:
        print("HOSTPID-VISIBLE unreadable", e)
print("HITS", json.dumps(hits))
print("PROCS", json.dumps(procs))
print("PROBE-DONE")
`)
	if strings.Contains(r.Stdout, d.Marker) {
		escaped(t, d, "berth dev's environment marker printed inside the sandbox", tail(r.Stdout, 3000))
	}
	var hits []string
	var procs []map[string]any
	for _, line := range strings.Split(r.Stdout, "\n") {
		if s, ok := strings.CutPrefix(line, "HITS "); ok {
			json.Unmarshal([]byte(s), &hits)
		}
		if s, ok := strings.CutPrefix(line, "PROCS "); ok {
			json.Unmarshal([]byte(s), &procs)
		}
	}
	if len(hits) > 0 {
		escaped(t, d, "found berth dev's environment marker (BERTH_ESCAPE_MARKER) in the sandbox's /proc", hits)
	}
	if len(procs) == 0 {
		t.Fatalf("the probe listed no process at all, not even itself: %s", r)
	}
	for _, p := range procs {
		cmd, _ := p["cmdline"].(string)
		if strings.Contains(cmd, "--listen") || (strings.Contains(cmd, " dev ") && strings.Contains(cmd, "--data")) {
			escaped(t, d, "berth dev's process is visible in the sandbox", fmt.Sprintf("pid %v: %s", p["pid"], cmd))
		}
	}
	if line := lineWith(r.Stdout, "HOSTPID-VISIBLE"); line != "" && (strings.Contains(line, "--listen") || strings.Contains(line, d.Data)) {
		escaped(t, d, fmt.Sprintf("berth dev's host pid %d is visible in the sandbox", d.PID), line)
	}
	t.Logf("processes the sandbox sees: %v", procs)
}

func lineWith(s, prefix string) string {
	for _, line := range strings.Split(s, "\n") {
		if strings.HasPrefix(line, prefix) {
			return line
		}
	}
	return ""
}

// execMountGames (ISO-1): the sandbox's user holds no privilege over its mounts or
// namespaces. Every call below must fail outside a user namespace — umount -l of /tmp,
// /proc, / and /.berth; mounting proc, tmpfs, sysfs, cgroup v1 and v2, bind-mounting / and
// remounting it writable; unshare of a mount, network, PID, IPC, UTS or cgroup namespace;
// setns into pid 1's namespaces; chroot; and the same with the umount, mount, nsenter,
// unshare and chroot tools. A user namespace (which the kernel lets any user make) is tried
// too: what it allows — mounts inside a mount namespace of its own, chroot there — may work,
// but must expose nothing of the host: proc, sysfs and cgroup mounts made there and the
// host's files are searched for the host's secrets and berth dev's marker. After all of it
// the host's files are still unreadable.
func execMountGames(t *testing.T, d *dev) {
	c := d.Tenant[0]
	id := c.create(t, "python", sandboxOpts{})
	// The shell tools first.
	tools := []string{"umount -l /tmp", "umount -l /proc", "umount -l /", "mount -t proc proc /tmp/m", "mount -t tmpfs t /tmp/m",
		"mount -t sysfs s /tmp/m", "mount --bind / /tmp/m", "mount -o remount,rw /", "nsenter -t 1 -n true", "nsenter -t 1 -m true",
		"nsenter -t 1 -a true", "unshare -m python3 /tmp/mnt.py", "unshare -n python3 /tmp/mnt.py", "unshare -p -f python3 /tmp/mnt.py",
		"unshare -i python3 /tmp/mnt.py", "unshare -u python3 /tmp/mnt.py", "unshare -C python3 /tmp/mnt.py",
		"/usr/sbin/chroot / true", "/usr/sbin/chroot /tmp /bin/true"}
	var sh strings.Builder
	// mnt.py exits 0 only if it can mount a tmpfs: what an unshare would have to give to matter.
	sh.WriteString("mkdir -p /tmp/m\nprintf 'import ctypes,sys\\nl=ctypes.CDLL(None)\\nsys.exit(0 if l.mount(b\"t\",b\"/tmp/m\",b\"tmpfs\",0,None)==0 else 1)\\n' > /tmp/mnt.py\n")
	for _, tool := range tools {
		fmt.Fprintf(&sh, "%s >/tmp/out 2>&1; echo \"RC=$? :: %s :: $(head -c 200 /tmp/out | tr '\\n' ' ')\"\n", tool, tool)
	}
	sh.WriteString("echo PROBE-DONE\n")
	r := c.mustSh(t, id, 60, sh.String())
	for _, line := range strings.Split(r.Stdout, "\n") {
		if strings.HasPrefix(line, "RC=0 ") {
			escaped(t, d, "a privileged mount/namespace/chroot tool succeeded", line)
		}
	}
	py := c.mustPy(t, id, 90, map[string]any{"targets": d.hostTargets(), "rev": reverse(d.Marker)}, mountProgram)
	for _, line := range strings.Split(py.Stdout, "\n") {
		if s, ok := strings.CutPrefix(line, "MUSTFAIL-OK "); ok {
			escaped(t, d, "a privileged system call succeeded without a user namespace", s)
		}
		if s, ok := strings.CutPrefix(line, "MUSTFAIL-NOTE "); ok {
			t.Logf("NOTE (%s): a namespace was created without privilege, but gave none: %s", d.Runtime, s)
		}
		if s, ok := strings.CutPrefix(line, "EXPOSED "); ok {
			escaped(t, d, "a user namespace exposed the host", s)
		}
	}
	if leaked := containsAny(py.Stdout+py.Stderr+r.Stdout, d.secrets()...); leaked != "" {
		escaped(t, d, "mount/namespace games read a host secret", fmt.Sprintf("%q in\n%s", leaked, tail(py.Stdout, 3000)))
	}
	// After all of that, the host's files are still out of reach.
	var again strings.Builder
	for _, p := range d.hostTargets() {
		fmt.Fprintf(&again, "cat '%s' /proc/1/root'%s' 2>&1\n", p, p)
	}
	if r := c.sh(t, id, 30, again.String()); containsAny(r.Stdout+r.Stderr, d.secrets()...) != "" {
		escaped(t, d, "after the mount/namespace games, cat reads a host file", r.Stdout)
	}
	t.Logf("tools:\n%s\nsyscalls:\n%s", r.Stdout, py.Stdout)
}

func reverse(s string) string {
	r := []rune(s)
	for i, j := 0, len(r)-1; i < j; i, j = i+1, j-1 {
		r[i], r[j] = r[j], r[i]
	}
	return string(r)
}

// mountProgram is attempt 05's Python half: each call runs in a child process of its own
// (so a success cannot disturb the rest) and reports one line.
const mountProgram = `
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
NEWNS, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET, NEWCGROUP = 0x20000, 0x4000000, 0x8000000, 0x10000000, 0x20000000, 0x40000000, 0x02000000
MS_BIND, MS_REMOUNT, MS_REC, MNT_DETACH = 4096, 32, 16384, 2
marker = P["rev"][::-1]
os.makedirs("/tmp/m", exist_ok=True)

def err():
    return os.strerror(ctypes.get_errno())

def mount(src, tgt, fs, flags=0, data=None):
    r = libc.mount(src.encode(), tgt.encode(), fs.encode() if fs else None, ctypes.c_ulong(flags), data.encode() if data else None)
    return "OK" if r == 0 else "ERR " + err()

def umount(tgt):
    return "OK" if libc.umount2(tgt.encode(), MNT_DETACH) == 0 else "ERR " + err()

def unshare(flags):
    # A namespace matters only if it hands out power: after it, try what root could do.
    if libc.unshare(flags) != 0:
        return "ERR " + err()
    follow = [("mount tmpfs", mount("tmpfs", "/tmp/m", "tmpfs")), ("mount proc", mount("proc", "/tmp/m", "proc")),
              ("umount -l /tmp", umount("/tmp"))]
    ok = [label for label, res in follow if res == "OK"]
    if ok:
        return "OK, and then " + ", ".join(ok)
    return "POWERLESS: unshare returned 0, but then " + "; ".join("%s: %s" % f for f in follow)

def setns(path):
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as e:
        return "ERR open: " + e.strerror
    r = libc.setns(fd, 0)
    return "OK" if r == 0 else "ERR " + err()

def chroot(p):
    return "OK" if libc.chroot(p.encode()) == 0 else "ERR " + err()

def in_child(label, fn, prefix):
    rd, wr = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(rd)
        try:
            res = fn()
        except Exception as e:
            res = "ERR exception " + repr(e)
        os.write(wr, res.encode()[:3000])
        os._exit(0)
    os.close(wr)
    out = b""
    while True:
        b = os.read(rd, 4096)
        if not b:
            break
        out += b
    os.close(rd)
    os.waitpid(pid, 0)
    res = out.decode("utf-8", "replace")
    tag = prefix + ("-OK " if res.startswith("OK") else "-NOTE " if res.startswith("POWERLESS") else "-refused ")
    print(tag + label + " :: " + res)

must_fail = [
    ("umount -l /tmp", lambda: umount("/tmp")),
    ("umount -l /proc", lambda: umount("/proc")),
    ("umount -l /", lambda: umount("/")),
    ("umount -l /.berth", lambda: umount("/.berth")),
    ("mount proc", lambda: mount("proc", "/tmp/m", "proc")),
    ("mount tmpfs", lambda: mount("tmpfs", "/tmp/m", "tmpfs")),
    ("mount sysfs", lambda: mount("sysfs", "/tmp/m", "sysfs")),
    ("mount cgroup memory", lambda: mount("cgroup", "/tmp/m", "cgroup", 0, "memory")),
    ("mount cgroup2", lambda: mount("cgroup2", "/tmp/m", "cgroup2")),
    ("bind / on /tmp/m", lambda: mount("/", "/tmp/m", None, MS_BIND | MS_REC)),
    ("remount / rw", lambda: mount("none", "/", None, MS_REMOUNT | MS_BIND)),
    ("unshare mount ns", lambda: unshare(NEWNS)),
    ("unshare net ns", lambda: unshare(NEWNET)),
    ("unshare pid ns", lambda: unshare(NEWPID)),
    ("unshare ipc ns", lambda: unshare(NEWIPC)),
    ("unshare uts ns", lambda: unshare(NEWUTS)),
    ("unshare cgroup ns", lambda: unshare(NEWCGROUP)),
    ("chroot /tmp", lambda: chroot("/tmp")),
]
for ns in ("mnt", "net", "pid", "ipc", "uts", "cgroup", "user"):
    must_fail.append(("setns /proc/1/ns/" + ns, (lambda ns=ns: setns("/proc/1/ns/" + ns))))
for label, fn in must_fail:
    in_child(label, fn, "MUSTFAIL")

def scan_for_host(root, depth=4, budget=[4000]):
    # Walk root (bounded) looking for host secrets in names and small files.
    found = []
    for dirpath, dirs, files in os.walk(root):
        if dirpath.count("/") - root.count("/") >= depth:
            dirs[:] = []
        for f in files:
            budget[0] -= 1
            if budget[0] <= 0:
                return found
            p = os.path.join(dirpath, f)
            if f in ("environ", "cmdline", "admin.key") or "secret" in f:
                try:
                    b = open(p, "rb").read(65536).decode("utf-8", "replace")
                except Exception:
                    continue
                if marker in b or "--listen" in b:
                    found.append(p)
    return found

def userns():
    out = []
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(NEWUSER | NEWNS) != 0:
        return "ERR unshare user+mount ns: " + err()
    out.append("userns+mountns created")
    try:
        open("/proc/self/setgroups", "w").write("deny")
        open("/proc/self/uid_map", "w").write("0 %d 1" % uid)
        open("/proc/self/gid_map", "w").write("0 %d 1" % gid)
        out.append("mapped to root in it")
    except Exception as e:
        out.append("map: " + repr(e))
    for label, args in (("proc", ("proc", "/tmp/m", "proc")), ("sysfs", ("sysfs", "/tmp/m", "sysfs")),
                        ("cgroup2", ("cgroup2", "/tmp/m", "cgroup2")), ("cgroup memory", ("cgroup", "/tmp/m", "cgroup", 0, "memory"))):
        res = mount(*args)
        out.append("mount %s: %s" % (label, res))
        if res == "OK":
            hits = scan_for_host("/tmp/m")
            if hits:
                out.append("EXPOSED via %s mount: %s" % (label, hits))
            try:
                out.append("  %s holds %s" % (label, sorted(os.listdir("/tmp/m"))[:40]))
            except Exception as e:
                out.append("  list: " + repr(e))
            libc.umount2(b"/tmp/m", MNT_DETACH)
    if libc.unshare(NEWNET) == 0:
        res = mount("sysfs", "/tmp/m", "sysfs")
        out.append("net ns + mount sysfs: " + res)
        if res == "OK":
            try:
                out.append("  sysfs/fs/cgroup holds %s" % os.listdir("/tmp/m/fs/cgroup"))
            except Exception as e:
                out.append("  " + repr(e))
            libc.umount2(b"/tmp/m", MNT_DETACH)
    out.append("bind / on /tmp/m: " + mount("/", "/tmp/m", None, MS_BIND | MS_REC))
    out.append("chroot /tmp: " + chroot("/tmp"))
    for p in P["targets"]:
        for v in (p, "/proc/1/root" + p, "/m" + p, "/m/proc/1/root" + p):
            try:
                b = open(v).read()
                out.append("EXPOSED read %s: %s" % (v, b[:200]))
            except Exception:
                pass
    return "OK " + " | ".join(out)

in_child("user namespace", userns, "USERNS")
print("PROBE-DONE")
`

// execReachHostNetwork (ISO-1): no network but the sandbox's own loopback. From Python it
// connects over TCP to berth dev's API port, to every agent's internal API port and to a
// listener this test opens on the host's 127.0.0.1 (also via localhost and ::1), sends UDP
// to a host UDP socket, and lists its network interfaces. Every connect must fail, the
// host's listeners must see nothing, and lo must be the only interface.
func execReachHostNetwork(t *testing.T, d *dev) {
	c := d.Tenant[0]
	id := c.create(t, "python", sandboxOpts{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var accepted atomic.Int64
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			conn.Write([]byte("HOST-LISTENER-REACHED\n"))
			conn.Close()
		}
	}()
	udp, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer udp.Close()
	var udpGot atomic.Int64
	go func() {
		b := make([]byte, 2048)
		for {
			if _, _, err := udp.ReadFrom(b); err != nil {
				return
			}
			udpGot.Add(1)
		}
	}()
	lport := ln.Addr().(*net.TCPAddr).Port
	targets := [][]any{{"127.0.0.1", d.Port}, {"127.0.0.1", lport}, {"localhost", d.Port}, {"localhost", lport}, {"::1", d.Port}, {"::1", lport}}
	for _, a := range d.AgentAddrs {
		host, port, err := net.SplitHostPort(a)
		if p, perr := strconv.Atoi(port); err == nil && perr == nil {
			targets = append(targets, []any{host, p})
		}
	}
	r := c.mustPy(t, id, 60, map[string]any{"targets": targets, "udp": udp.LocalAddr().(*net.UDPAddr).Port}, `
import socket
for host, port in P["targets"]:
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.settimeout(3)
    try:
        s.connect((host, port))
        s.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
        print("CONNECTED %s:%d answered %r" % (host, port, s.recv(200)))
    except Exception as e:
        print("refused %s:%d %s" % (host, port, e))
    finally:
        s.close()
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i in range(5):
    try:
        u.sendto(b"udp from the sandbox", ("127.0.0.1", P["udp"]))
    except Exception as e:
        print("udp refused", e)
print("IFACES", json.dumps([n for _, n in socket.if_nameindex()]))
print("PROBE-DONE")
`)
	time.Sleep(500 * time.Millisecond) // real: an absence: time for a stray UDP datagram from the sandbox to land
	for _, line := range strings.Split(r.Stdout, "\n") {
		if strings.HasPrefix(line, "CONNECTED ") {
			escaped(t, d, "a TCP connect from the sandbox reached a host port", line)
		}
	}
	if n := accepted.Load(); n > 0 {
		escaped(t, d, "the host's TCP listener on 127.0.0.1 accepted connections from the sandbox", n, " connections")
	}
	if n := udpGot.Load(); n > 0 {
		escaped(t, d, "the host's UDP socket on 127.0.0.1 received datagrams from the sandbox", n, " datagrams")
	}
	var ifaces []string
	if s := lineWith(r.Stdout, "IFACES "); s != "" {
		json.Unmarshal([]byte(strings.TrimPrefix(s, "IFACES ")), &ifaces)
	}
	for _, i := range ifaces {
		if i != "lo" {
			escaped(t, d, "the sandbox has a network interface besides lo", ifaces)
			break
		}
	}
	t.Logf("%s", r.Stdout)
}
