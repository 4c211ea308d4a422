package escape

import (
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// cgroupWatch samples a sandbox's host cgroup files every 100 ms until stopped, keeping the
// highest value of each and whether the limit ever moved.
type cgroupWatch struct {
	mu      sync.Mutex
	max     map[string]int64
	changed []string
	stop    chan struct{}
	done    chan struct{}
}

// watchCgroup starts sampling files (names relative to dir); limits maps a file to the value
// it must keep (a change is recorded).
func watchCgroup(dir string, files []string, limits map[string]int64) *cgroupWatch {
	w := &cgroupWatch{max: map[string]int64{}, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			for _, f := range files {
				v, err := readInt(filepath.Join(dir, f))
				if err != nil {
					continue
				}
				w.mu.Lock()
				if v > w.max[f] {
					w.max[f] = v
				}
				if want, ok := limits[f]; ok && v != want {
					w.changed = append(w.changed, fmt.Sprintf("%s was %d, want %d", f, v, want))
				}
				w.mu.Unlock()
			}
			select {
			case <-w.stop:
				return
			case <-tick.C:
			}
		}
	}()
	return w
}

func (w *cgroupWatch) finish() (map[string]int64, []string) {
	close(w.stop)
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.max, w.changed
}

// memoryLimit (ISO-2): a sandbox cannot raise its memory limit nor hold more than it. First
// it looks for every cgroup limit file it can see (memory.limit_in_bytes, memory.max,
// memory.memsw.limit_in_bytes, memory.high, pids.max …; /sys/fs/cgroup must not even be
// there writable) and writes a huge value into each; then a Python loop allocates and
// touches twice the sandbox's memory_mb in 16 MiB bytearrays. The allocation must not
// succeed (MemoryError, or the process or sandbox is killed). On the host, the sandbox's
// memory cgroup is sampled throughout: its limit must stay memory_mb, its usage never above
// it (but for the page or so the kernel force-charges while it kills); and berth dev must survive.
func memoryLimit(t *testing.T, d *dev) {
	const mem = 256
	c := d.Tenant[0]
	id := c.create(t, "python", sandboxOpts{MemoryMiB: mem})
	cg := cgroupDir(id, "memory")
	if cg == "" {
		t.Fatalf("cannot find sandbox %s's memory cgroup on the host, so cannot check its limit", id)
	}
	limitFile, usageFiles := "memory.limit_in_bytes", []string{"memory.usage_in_bytes", "memory.max_usage_in_bytes"}
	if !strings.Contains(cg, "/memory/") { // cgroup v2
		limitFile, usageFiles = "memory.max", []string{"memory.current", "memory.peak"}
	}
	if v, err := readInt(filepath.Join(cg, limitFile)); err != nil || v != mem<<20 {
		t.Fatalf("sandbox %s's host memory limit is %d (%v), want %d", id, v, err, mem<<20)
	}
	w := watchCgroup(cg, append([]string{limitFile}, usageFiles...), map[string]int64{limitFile: mem << 20})

	raise := c.mustPy(t, id, 60, nil, `
import os
root = "/sys/fs/cgroup"
print("SYS_FS_CGROUP exists=%s writable=%s" % (os.path.exists(root), os.path.exists(root) and os.access(root, os.W_OK)))
names = {"memory.limit_in_bytes", "memory.max", "memory.memsw.limit_in_bytes", "memory.high", "memory.soft_limit_in_bytes",
         "memory.swap.max", "pids.max", "cgroup.procs", "tasks"}
found, budget = [], [30000]
for top in ("/sys", "/proc/self", "/proc/1", "/dev", "/tmp", "/.berth"):
    for dirpath, dirs, files in os.walk(top):
        budget[0] -= len(files) + 1
        if budget[0] <= 0:
            break
        if dirpath.count("/") > 8:
            dirs[:] = []
        for f in files:
            if f in names:
                found.append(os.path.join(dirpath, f))
print("FOUND", json.dumps(found))
for p in found:
    try:
        with open(p, "w") as f:
            f.write("9223372036854771712" if not p.endswith(("procs", "tasks")) else str(os.getpid()))
        print("RAISED", p)
    except Exception as e:
        print("refused", p, type(e).__name__, e)
os.makedirs("/tmp/cg", exist_ok=True)
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
for fs, data in (("cgroup", b"memory"), ("cgroup2", None)):
    r = libc.mount(fs.encode(), b"/tmp/cg", fs.encode(), 0, data)
    print(("MOUNTED " if r == 0 else "mount refused ") + fs)
print("PROBE-DONE")
`)
	for _, line := range strings.Split(raise.Stdout, "\n") {
		if strings.HasPrefix(line, "RAISED ") || strings.HasPrefix(line, "MOUNTED ") {
			escaped(t, d, "the sandbox wrote a cgroup limit file or mounted a cgroup hierarchy", line)
		}
		if strings.HasPrefix(line, "SYS_FS_CGROUP") && strings.Contains(line, "writable=True") {
			escaped(t, d, "/sys/fs/cgroup is writable inside the sandbox", line)
		}
	}

	target := 2 * mem
	alloc := c.py(t, id, 90, map[string]any{"mib": target}, `
chunks, mb = [], 0
try:
    while mb < P["mib"]:
        b = bytearray(16 << 20)
        b[::4096] = b"\x01" * len(range(0, 16 << 20, 4096))
        chunks.append(b)
        mb += 16
        print("ALLOC", mb, flush=True)
    print("ALLOC-DONE", mb)
except MemoryError:
    print("MEMORYERROR at", mb)
`)
	time.Sleep(300 * time.Millisecond) // real: the host cgroup watcher takes its last readings
	peak, changed := w.finish()
	if strings.Contains(alloc.Stdout, "ALLOC-DONE") {
		escaped(t, d, fmt.Sprintf("python allocated and touched %d MiB in a %d MiB sandbox", target, mem),
			lineWith(alloc.Stdout, "ALLOC-DONE"), fmt.Sprintf("; host cgroup peak %d MiB", peak[usageFiles[len(usageFiles)-1]]>>20))
	}
	if len(changed) > 0 {
		escaped(t, d, "the sandbox's host memory limit changed while it ran", changed[0])
	}
	// The kernel itself lets a cgroup's usage pass its limit by a few pages while it kills
	// the task that hit it (mm/memcontrol.c: a charge for a task with a fatal signal pending,
	// or one that may not fail, is forced "temporarily"); a clean-clone CI run saw one page
	// (268439552 for a 268435456 limit). That is the kernel's own bound, not an escape;
	// holding more than forcedChargeSlack past the limit is. The slack is one charge batch
	// (MEMCG_CHARGE_BATCH, 64 pages of 4 KiB), the most a single forced charge adds.
	const forcedChargeSlack = 64 * 4096
	for _, f := range usageFiles {
		if peak[f] > mem<<20+forcedChargeSlack {
			escaped(t, d, "the sandbox's host memory cgroup held more than its limit", fmt.Sprintf("%s peaked at %d bytes > %d (limit %d MiB + %d bytes the kernel may force-charge)", f, peak[f], mem<<20+forcedChargeSlack, mem, forcedChargeSlack))
		}
	}
	if err := d.alive(); err != nil {
		t.Errorf("%s: berth dev did not survive the sandbox's allocation: %v", d.Runtime, err)
	}
	// The allocation's own outcome, for the log: MemoryError, exit 137, or the sandbox gone.
	t.Logf("limit files: %s\nallocation: %s\nhost cgroup %s maxima: %v; sandbox state now %s",
		lineWith(raise.Stdout, "FOUND"), alloc, cg, peak, d.state(t, id))
}

// pidsLimitAttempt (ISO-2): a sandbox cannot fork past its pids limit (berth dev runs with
// --pids-limit 128). It first tries to raise RLIMIT_NPROC, then starts `sleep 60` from
// Python up to 4× the limit (bounded: 40 s, and it stops after 40 failures in a row), and
// counts the processes (and tasks) in its /proc. The count must stay at or below the limit;
// the sandbox may refuse or die. On the host the process runtime's pids cgroup is sampled:
// its limit must stay 128. Afterwards another sandbox of the same tenant still runs
// commands, and berth dev still answers.
func pidsLimitAttempt(t *testing.T, d *dev) {
	c := d.Tenant[0]
	bystander := c.create(t, "shell", sandboxOpts{})
	id := c.create(t, "shell", sandboxOpts{MemoryMiB: 768}) // room for the ptrace platform's host stubs
	var w *cgroupWatch
	cg := cgroupDir(id, "pids")
	if d.Runtime == "process" {
		if cg == "" {
			t.Fatalf("cannot find sandbox %s's pids cgroup on the host", id)
		}
		w = watchCgroup(cg, []string{"pids.current", "pids.max"}, map[string]int64{"pids.max": pidsLimit})
	}
	r := c.py(t, id, 90, map[string]any{"limit": pidsLimit}, `
import os, subprocess, time, resource
try:
    resource.setrlimit(resource.RLIMIT_NPROC, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    print("RAISED-NPROC", resource.getrlimit(resource.RLIMIT_NPROC))
except Exception as e:
    print("nproc raise refused:", e)
kids, fails, run, last, t0 = [], 0, 0, "", time.time()
for i in range(4 * P["limit"]):
    try:
        kids.append(subprocess.Popen(["sleep", "60"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        run = 0
    except OSError as e:
        fails, run, last = fails + 1, run + 1, str(e)
        if run >= 40:
            break
    if time.time() - t0 > 40:
        break
procs = [p for p in os.listdir("/proc") if p.isdigit()]
tasks = 0
for p in procs:
    try:
        tasks += len(os.listdir("/proc/%s/task" % p))
    except Exception:
        pass
print("STARTED %d FAILED %d PROCS %d TASKS %d LAST %s" % (len(kids), fails, len(procs), tasks, last))
for k in kids:
    k.kill()
for k in kids:
    k.wait()
# Threads are tasks too: the pids cgroup counts them, and on gVisor's ptrace platform each
# costs a host thread.
import threading
ev, ths, terr, t1 = threading.Event(), [], "", time.time()
for i in range(4 * P["limit"]):
    th = threading.Thread(target=ev.wait, daemon=True)
    try:
        th.start()
        ths.append(th)
    except RuntimeError as e:
        terr = str(e)
        break
    if time.time() - t1 > 20:
        break
tasks = len(os.listdir("/proc/self/task"))
print("THREADS %d TASKS %d ERR %s" % (len(ths), tasks, terr))
ev.set()
print("PROBE-DONE")
`)
	var hostMax map[string]int64
	if w != nil {
		var changed []string
		hostMax, changed = w.finish()
		if len(changed) > 0 {
			escaped(t, d, "the sandbox's host pids limit changed", changed[0])
		}
		if hostMax["pids.current"] > pidsLimit {
			escaped(t, d, "the sandbox's host pids cgroup held more tasks than its limit", hostMax)
		}
	}
	if strings.Contains(r.Stdout, "RAISED-NPROC") {
		escaped(t, d, "the sandbox raised its RLIMIT_NPROC", lineWith(r.Stdout, "RAISED-NPROC"))
	}
	if m := regexp.MustCompile(`STARTED (\d+) FAILED (\d+) PROCS (\d+) TASKS (\d+)`).FindStringSubmatch(r.Stdout); m != nil {
		procs, _ := strconv.Atoi(m[3])
		tasks, _ := strconv.Atoi(m[4])
		if procs > pidsLimit {
			escaped(t, d, fmt.Sprintf("forked past the pids limit of %d", pidsLimit), m[0])
		}
		if d.Runtime == "process" && tasks > pidsLimit {
			escaped(t, d, fmt.Sprintf("ran more tasks than the pids limit of %d", pidsLimit), m[0])
		}
	} else if r.ok() {
		t.Fatalf("the fork attempt did not report its count: %s", r)
	} // else: the sandbox died under the attempt, which is allowed
	if m := regexp.MustCompile(`THREADS (\d+) TASKS (\d+)`).FindStringSubmatch(r.Stdout); m != nil {
		tasks, _ := strconv.Atoi(m[2])
		switch {
		case d.Runtime == "process" && tasks > pidsLimit:
			escaped(t, d, fmt.Sprintf("one process ran more threads than the pids limit of %d", pidsLimit), m[0])
		case tasks > pidsLimit:
			t.Logf("NOTE (%s): RLIMIT_NPROC does not bound threads here: one process ran %s (the host pids cgroup, %d × %d + 256, is the backstop)",
				d.Runtime, m[0], pidsLimit, 16)
		}
	}
	if b := c.sh(t, bystander, 30, "echo alive"); !b.ok() || strings.TrimSpace(b.Stdout) != "alive" {
		t.Errorf("%s: another sandbox of the tenant stopped working after the fork attempt: %s", d.Runtime, b)
	}
	if err := d.alive(); err != nil {
		t.Errorf("%s: berth dev did not survive the fork attempt: %v", d.Runtime, err)
	}
	t.Logf("fork attempt: %s\nhost pids cgroup maxima: %v; sandbox state now %s", r, hostMax, d.state(t, id))
}

// tmpFill (ISO-2): a sandbox's scratch space is bounded and never on the host's disk. With
// memory_mb 256 its /tmp holds 128 MiB; dd writes 2× the sandbox's memory (512 MiB) into
// /tmp, then into /dev/shm. Each must stop at "No space left on device" near its bound (or
// the sandbox is killed). On the host, the free space of the file system holding berth
// dev's data directory must not shrink by more than a quarter of what was written, and no
// file of the sandbox's host directories may grow by more than 4 MiB.
func tmpFill(t *testing.T, d *dev) {
	diskMu.Lock()
	defer diskMu.Unlock()
	const mem, tmpBound = 256, 128 // berth's default: /tmp is half the memory
	c := d.Tenant[0]
	id := c.create(t, "shell", sandboxOpts{MemoryMiB: mem})
	before := map[string]map[string]int64{}
	for _, dir := range d.sandboxHostDirs(id) {
		before[dir] = dirSizes(dir)
	}
	free0 := freeBytes(d.Data)
	r := c.sh(t, id, 90, fmt.Sprintf(`
dd if=/dev/zero of=/tmp/fill bs=1M count=%[1]d 2>&1; echo "DD_RC=$?"
echo "SIZE $(wc -c < /tmp/fill)"
dd if=/dev/zero of=/dev/shm/fill bs=1M count=%[1]d 2>&1; echo "SHM_RC=$?"
echo "SHMSIZE $(wc -c < /dev/shm/fill)"
df -k /tmp /dev/shm 2>&1
echo PROBE-DONE`, 2*mem))
	free1 := freeBytes(d.Data)
	written := int64(2*mem) << 20
	if r.ok() {
		if !strings.Contains(r.Stdout, "PROBE-DONE") {
			t.Fatalf("the fill did not run to its end: %s", r)
		}
		for _, k := range []string{"SIZE", "SHMSIZE"} {
			line := lineWith(r.Stdout, k+" ")
			n, err := strconv.ParseInt(strings.TrimSpace(strings.TrimPrefix(line, k+" ")), 10, 64)
			if err != nil {
				t.Errorf("cannot read the filled size %q: %s", line, r)
				continue
			}
			bound := int64(tmpBound)
			if k == "SHMSIZE" {
				bound = 64
			}
			if n > (bound+1)<<20 {
				escaped(t, d, fmt.Sprintf("wrote past the scratch bound of %d MiB", bound), line)
			}
		}
		if !strings.Contains(r.Stdout, "No space left") {
			t.Errorf("%s: dd of %d MiB into /tmp did not stop at \"No space left on device\": %s", d.Runtime, 2*mem, r)
		}
	}
	if drop := free0 - free1; drop > written/4 {
		escaped(t, d, "filling the sandbox's /tmp consumed the host's disk",
			fmt.Sprintf("free space of %s's file system fell by %d MiB while the sandbox wrote %d MiB", d.Data, drop>>20, written>>20))
	}
	for dir, sizes := range before {
		if g := grown(sizes, dir, 4<<20); len(g) > 0 {
			escaped(t, d, "filling /tmp grew host files of the sandbox", g)
		}
	}
	t.Logf("fill: %s\nhost free space %d → %d MiB", r, free0>>20, free1>>20)
}
