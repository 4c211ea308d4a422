// Package process is the process runtime driver (SPEC AGT-3): every sandbox is a real process
// tree under a small init (package sbinit, reached over a unix socket), on the host's kernel.
//
// As root it isolates (ISO-1, ISO-2, ISO-3). Each sandbox gets fresh PID, mount, UTS, IPC and
// network namespaces (only its own loopback); a root of its own, read-only — the built-in
// (package rootfs: the host's /usr and /lib* read-only and a generated /etc) or a template's
// unpacked root (Config.Rootfs) — with its own /proc, a minimal /dev, no /sys, and a /tmp
// that is a tmpfs of Config.TmpMiB charged to its memory (never on the host's disk); the
// host's root is detached, so no host path, other sandbox or runtime state is reachable. Its
// init and everything in it run as a host uid of its own (leased, 200000 and up) with no
// capability, no_new_privs, and every mount nosuid. Its memory cgroup limits memory to the
// configured size and its pids cgroup limits tasks to Config.PidsLimit; the sandbox sees no
// cgroup file system, so it cannot raise either. The files API resolves paths in the
// sandbox's root as its uid. mount.go and drop.go say how.
//
// What it does not isolate: the sandbox shares the host kernel's whole system call surface —
// there is no seccomp filter — so a kernel bug reachable from a system call (user namespaces
// included) is an escape path. That is why the gVisor runtime is the default; this one is
// for hosts that cannot run it. CPU is not limited (Spec.VCPUs is accepted and ignored:
// memory is the resource that refuses, CPU only degrades).
//
// Without root, namespaces or cgroups, or with Isolate "off", sandboxes can only be plain
// process trees of the agent's user that see the host's file system and network: New refuses
// that unless Config.Insecure is set (berth's --runtime process --insecure), for development
// only. Such a sandbox's files API reaches only its private directory, mapped onto /tmp.
//
// Resident memory is the memory cgroup's working set (usage minus inactive file pages, C24);
// without isolation, the RSS of the process tree from /proc. A sandbox idles until exec'd; a
// process it starts in the background keeps running, and is measured, until the sandbox is
// stopped (SPEC §13). Hosted apps (APP-1, app.go): a sandbox runs at most one long-lived
// service at a time, and Dial reaches a TCP port on the sandbox's own loopback through the
// init, since the host cannot enter its network namespace.
//
// The init is this very binary, re-executed with a magic argv[1]: main() (and TestMain of any
// package that starts sandboxes) must call MaybeRunInit first.
package process

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/agent/runtime/cgroups"
	"github.com/berth-dev/berth/agent/runtime/driver"
	"github.com/berth-dev/berth/agent/runtime/rootfs"
	"github.com/berth-dev/berth/agent/runtime/sbinit"
)

// Isolation modes of Config.Isolate.
const (
	IsolateAuto = "auto" // isolate when possible; otherwise fail, or plain processes if Insecure
	IsolateOn   = "on"   // New fails when isolation is impossible, Insecure or not
	IsolateOff  = "off"  // plain processes; New fails unless Insecure
)

// Defaults of Config.
const (
	DefaultPidsLimit = 512
	minTmpMiB        = 16
	maxShmMiB        = 64
)

// Config configures a Runtime. Zero fields take the defaults documented on them.
type Config struct {
	// Dir holds one directory per sandbox (<Dir>/<id>: the init's socket and log, and the
	// mount point of its root, or without isolation its working directory root/) and the
	// built-in root file system (<Dir>/rootfs/builtin). Required; created if missing.
	// Leftovers from an earlier run with the same Dir are cleaned by New.
	Dir string
	// CgroupParent names the parent cgroup, relative to each hierarchy's mount (default
	// "berth"). Sandbox cgroups live at <mount>/<CgroupParent>/<instance>/<id> in the memory
	// and pids hierarchies, where instance is derived from Dir.
	CgroupParent string
	// Isolate is IsolateAuto (default), IsolateOn or IsolateOff.
	Isolate string
	// Insecure allows sandboxes that are plain processes — not a security boundary: they run
	// as the agent's user and see the host — when Isolate is "off" or, with "auto", when
	// isolation is impossible. For development only.
	Insecure bool
	// TmpMiB bounds an isolated sandbox's /tmp (ISO-2), in MiB: a tmpfs charged to the
	// sandbox's memory cgroup. 0 means half the sandbox's memory size, at least 16 MiB.
	TmpMiB int64
	// PidsLimit bounds the tasks (processes and threads) of an isolated sandbox through its
	// pids cgroup (ISO-2), the init's own included: about 20 threads, most kept in reserve so
	// it still serves when the sandbox has used up the rest (drop.go). 0 means
	// DefaultPidsLimit (512).
	PidsLimit int
	// Rootfs maps a template name to an unpacked root file system directory (absolute) on
	// this host; an isolated sandbox whose Spec.Template is not named here gets the built-in
	// root (rootfs.Builtin). If this binary is dynamically linked, each such root must hold
	// its ELF interpreter (the init runs inside it); build with CGO_ENABLED=0 otherwise.
	Rootfs map[string]string
	// Logger receives the runtime's logs; nil means slog.Default().
	Logger *slog.Logger
}

// Runtime runs sandboxes as process trees (AGT-3). It is safe for concurrent use.
type Runtime struct {
	dir        string
	log        *slog.Logger
	isolated   bool
	cloneflags uintptr
	cgroups    []*cgroupSet // one per hierarchy (memory, pids; one for both on v2); nil without isolation
	memory     *cgroupSet   // the one of cgroups with the memory controller
	builtin    rootfs.Layout
	custom     map[string]rootfs.Layout // Config.Rootfs
	tmpMiB     int64                    // Config.TmpMiB
	pidsLimit  int
	spawner    *driver.Spawner

	sandboxes *driver.Registry[*sandbox]
	// Ops are the sandbox calls (exec, files, service, dials, ping) over the init's socket.
	sbinit.Ops
}

// New prepares a runtime: it checks that this binary serves as a sandbox init (MaybeRunInit),
// decides isolation (probing the namespaces for real, finding the memory and pids cgroup
// hierarchies — v2 where one offers the controller, else v1), prepares the root file systems
// and cleans up sandboxes an earlier run with the same Dir left behind. Errors:
// EInvalidRequest for a bad Config, or Isolate "off" without Insecure; EUnsupported when
// isolation is impossible (the message says why) and Isolate is "on", or Insecure is unset.
func New(cfg Config) (*Runtime, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.CgroupParent == "" {
		cfg.CgroupParent = "berth"
	}
	if cfg.PidsLimit == 0 {
		cfg.PidsLimit = DefaultPidsLimit
	}
	switch cfg.Isolate {
	case "":
		cfg.Isolate = IsolateAuto
	case IsolateAuto, IsolateOn, IsolateOff:
	default:
		return nil, berth.Errorf(berth.EInvalidRequest, "isolate must be auto, on or off, not %q", cfg.Isolate)
	}
	switch {
	case cfg.Dir == "":
		return nil, berth.Errorf(berth.EInvalidRequest, "process runtime needs a Dir")
	case cfg.TmpMiB < 0 || cfg.PidsLimit < 0:
		return nil, berth.Errorf(berth.EInvalidRequest, "process runtime: TmpMiB and PidsLimit must not be negative")
	case cfg.Isolate == IsolateOff && !cfg.Insecure:
		return nil, berth.Errorf(berth.EInvalidRequest, "process runtime: isolate off makes sandboxes plain processes, no security boundary: %s", insecureHint)
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("process: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("process: create %s: %w", dir, err)
	}
	r := &Runtime{dir: dir, log: cfg.Logger, sandboxes: driver.NewRegistry[*sandbox]("process"), tmpMiB: cfg.TmpMiB, pidsLimit: cfg.PidsLimit}
	r.Ops = sbinit.Ops{Client: r.clientFor}
	if err := probeInit(0); err != nil {
		return nil, fmt.Errorf("process: this binary cannot serve as a sandbox init (is MaybeRunInit the first call in main?): %w", err)
	}
	if cfg.Isolate != IsolateOff {
		why := r.canIsolate(cfg.CgroupParent)
		switch {
		case why == nil:
			if err := r.prepareRoots(cfg.Rootfs); err != nil {
				r.removeCgroupSets()
				return nil, err
			}
			r.isolated = true
		case cfg.Isolate == IsolateOn:
			return nil, berth.Errorf(berth.EUnsupported, "process runtime: isolation required but impossible: %v", why)
		case !cfg.Insecure:
			return nil, berth.Errorf(berth.EUnsupported, "process runtime: cannot isolate sandboxes: %v; %s", why, insecureHint)
		default:
			r.log.Warn("process runtime: isolation impossible", "err", why)
		}
	}
	if !r.isolated {
		r.log.Warn("process runtime: INSECURE: sandboxes are plain processes of the agent's user that see the host (no namespaces, no limits); for development only",
			"dir", dir)
	}
	r.cleanLeftovers()
	r.spawner = driver.NewSpawner()
	return r, nil
}

// insecureHint tells the operator the ways out of a refusal.
const insecureHint = "isolation needs root, namespaces and memory and pids cgroups; use the gVisor runtime (install runsc), " +
	"or --runtime process --insecure to run unisolated plain processes, for development only"

// canIsolate checks root, the init binary, the cgroup hierarchies and namespaces that really
// clone, and creates the runtime's cgroup sets. It returns why isolation is impossible.
func (r *Runtime) canIsolate(parent string) error {
	if os.Geteuid() != 0 {
		return errors.New("not root")
	}
	// Stage 2 of the init is exec'd as the sandbox's uid (drop.go).
	st, err := os.Stat("/proc/self/exe")
	if err != nil {
		return err
	}
	if st.Mode()&0o001 == 0 {
		return fmt.Errorf("this binary (mode %v) must be executable by other users: the init drops to a sandbox uid", st.Mode().Perm())
	}
	if err := kernelHasMountAPI(); err != nil {
		return err
	}
	if err := checkUIDLockDir(); err != nil {
		return err
	}
	mountinfo, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	controllers := func(mp string) string {
		b, _ := os.ReadFile(filepath.Join(mp, "cgroup.controllers"))
		return string(b)
	}
	mem, ok := cgroups.Find(string(mountinfo), ctrlMemory, controllers)
	if !ok {
		return errors.New("no cgroup hierarchy with the memory controller")
	}
	pids, ok := cgroups.Find(string(mountinfo), ctrlPids, controllers)
	if !ok {
		return errors.New("no cgroup hierarchy with the pids controller")
	}
	// Every namespace, the network's included: without it a sandbox reaches the host's
	// network (ISO-1).
	flags := uintptr(syscall.CLONE_NEWPID | syscall.CLONE_NEWNS | syscall.CLONE_NEWUTS | syscall.CLONE_NEWIPC | syscall.CLONE_NEWNET)
	if err := probeInit(flags); err != nil {
		return fmt.Errorf("namespaces: %w", err)
	}
	sum := sha256.Sum256([]byte(r.dir))
	instance := "rt-" + hex.EncodeToString(sum[:6])
	hierarchies := []struct {
		m     cgroups.Mount
		ctrls []string
	}{{mem, []string{ctrlMemory}}, {pids, []string{ctrlPids}}}
	if mem == pids {
		hierarchies = hierarchies[:1]
		hierarchies[0].ctrls = []string{ctrlMemory, ctrlPids}
	}
	for _, h := range hierarchies {
		cg, err := newCgroupSet(h.m, h.ctrls, parent, instance)
		if err != nil {
			r.removeCgroupSets()
			r.cgroups = nil // an insecure runtime has none
			return err
		}
		r.cgroups = append(r.cgroups, cg)
	}
	r.cloneflags, r.memory = flags, r.cgroups[0]
	r.log.Info("process runtime: isolation on", "memory_cgroup", r.memory.base, "pids_cgroup", r.cgroups[len(r.cgroups)-1].base,
		"cgroup_v2", mem.V2)
	return nil
}

// kernelHasMountAPI checks for the system calls that build a sandbox's root (mount.go):
// openat2 (Linux 5.6), open_tree and move_mount (5.2), mount_setattr (5.12). Each is called
// with a bad descriptor, which a kernel that has it answers with EBADF, not ENOSYS.
func kernelHasMountAPI() error {
	calls := map[string]func() error{
		"openat2":       func() error { _, err := unix.Openat2(-1, "x", &unix.OpenHow{}); return err },
		"open_tree":     func() error { _, err := unix.OpenTree(-1, "x", 0); return err },
		"move_mount":    func() error { return unix.MoveMount(-1, "x", -1, "x", 0) },
		"mount_setattr": func() error { return unix.MountSetattr(-1, "x", 0, &unix.MountAttr{}) },
	}
	for name, call := range calls {
		if err := call(); errors.Is(err, unix.ENOSYS) {
			return fmt.Errorf("the kernel lacks %s (isolation needs Linux 5.12 or later)", name)
		}
	}
	return nil
}

// probeInit runs this binary as an init in probe mode with the given clone flags and checks
// that it answers.
func probeInit(flags uintptr) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "/proc/self/exe", initArg, "-probe")
	cmd.Env = []string{}
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: flags}
	out, err := cmd.Output()
	if err != nil {
		return err
	}
	if !bytes.Contains(out, []byte(probeToken)) {
		return fmt.Errorf("probe printed %q", bytes.TrimSpace(out))
	}
	return nil
}

// cleanLeftovers stops what an earlier run with the same Dir left: inits still running
// (checked by their command line, so a reused pid is never killed), their cgroups, and their
// directories. Failures are logged; they never stop New.
func (r *Runtime) cleanLeftovers() {
	entries, _ := os.ReadDir(r.dir)
	for _, e := range entries {
		sbDir := filepath.Join(r.dir, e.Name())
		if _, err := os.Stat(filepath.Join(sbDir, markerFile)); err != nil {
			continue // not ours
		}
		if b, err := os.ReadFile(filepath.Join(sbDir, pidFile)); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && isOurInit(pid, sbDir) {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				killTree(ctx, pid, func() error { return syscall.Kill(pid, syscall.SIGKILL) },
					func() bool { return !isOurInit(pid, sbDir) })
				cancel()
			}
		}
		if err := os.RemoveAll(sbDir); err != nil {
			r.log.Warn("process runtime: cannot remove leftover sandbox dir", "dir", sbDir, "err", err)
			continue
		}
		r.log.Warn("process runtime: removed leftover sandbox of an earlier run", "id", e.Name())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, cg := range r.cgroups {
		removed, err := cg.cleanLeftovers(ctx)
		if len(removed) > 0 {
			r.log.Warn("process runtime: removed leftover sandbox cgroups", "base", cg.base, "ids", removed)
		}
		if err != nil {
			r.log.Error("process runtime: leftover cgroups remain", "err", err)
		}
	}
}

// Isolated reports whether sandboxes are isolated (see the package comment): false only for
// a runtime New allowed to be insecure.
func (r *Runtime) Isolated() bool { return r.isolated }

// Close stops every sandbox this runtime started and refuses new ones. It is used on agent
// shutdown and in test cleanup; calling it again is harmless.
func (r *Runtime) Close() error {
	first, err := r.sandboxes.Close(r.Stop)
	if first {
		_ = os.Remove(shortSockDir(r.dir)) // only if it exists and is empty
		r.spawner.Close()
		r.removeCgroupSets()
	}
	return err
}

// removeCgroupSets removes the runtime's cgroup base directories, which fails harmlessly
// while a sandbox cgroup (a leftover) remains in one.
func (r *Runtime) removeCgroupSets() {
	for _, cg := range r.cgroups {
		syscall.Rmdir(cg.base)
	}
}
