// Package process is the process runtime driver (SPEC AGT-3): every sandbox is a real process
// tree under a small init, in its own PID, mount, UTS, IPC and network namespaces and its own
// memory cgroup (limit = the configured size). Exec and file I/O go through the init over a
// unix socket (protocol in wire.go). Resident memory is the cgroup's working set (usage minus
// inactive file pages, C24). Without root (or with Isolate "off") sandboxes are plain process
// trees measured from /proc, and New says so in the log.
//
// The init is this very binary, re-executed with a magic argv[1]: main() (and TestMain of any
// package that starts sandboxes) must call MaybeRunInit first.
//
// A sandbox idles until exec'd; a process it starts in the background keeps running, and is
// measured, until the sandbox is stopped (SPEC §13).
//
// Hosted apps (APP-1, app.go and service.go): a sandbox runs at most one long-lived service
// at a time (Serve, ServiceStatus), and Dial reaches a TCP port on the sandbox's own loopback
// through the init, since the host cannot enter its network namespace.
//
// CPU: Spec.VCPUs is accepted and ignored for now. Memory is the resource that refuses; CPU
// only degrades, so no cpu cgroup is set up yet.
//
// Not a security boundary: there is no user namespace, commands run as the agent's user (root
// with isolation) and see the host's file system except /tmp, which is private per sandbox,
// and the runtime's Dir, which is hidden.
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
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/berth-dev/berth"
)

// Isolation modes of Config.Isolate.
const (
	IsolateAuto = "auto" // namespaces + cgroup when root and available, else plain processes
	IsolateOn   = "on"   // New fails when isolation is impossible
	IsolateOff  = "off"  // plain processes
)

// Config configures a Runtime.
type Config struct {
	// Dir holds one directory per sandbox (<Dir>/<id>, with the init's socket, its log and
	// root/, the sandbox's /tmp). Required; created if missing. Leftovers from an earlier run
	// with the same Dir are cleaned by New.
	Dir string
	// CgroupParent names the parent memory cgroup, relative to the hierarchy's mount (default
	// "berth"). Sandbox cgroups live at <mount>/<CgroupParent>/<instance>/<id>, where instance
	// is derived from Dir.
	CgroupParent string
	// Isolate is IsolateAuto (default), IsolateOn or IsolateOff.
	Isolate string
	// Logger receives the runtime's logs; nil means slog.Default().
	Logger *slog.Logger
}

// Runtime runs sandboxes as process trees (AGT-3). It is safe for concurrent use.
type Runtime struct {
	dir        string
	log        *slog.Logger
	isolated   bool
	cloneflags uintptr
	cg         *cgroupSet // nil without isolation
	spawn      chan spawnReq
	quit       chan struct{} // closed by Close: the spawner ends

	mu        sync.Mutex
	sandboxes map[string]*sandbox
	closed    bool
}

// New prepares a runtime: it checks that this binary serves as a sandbox init (MaybeRunInit),
// decides isolation (probing the namespaces for real), finds the memory cgroup hierarchy (v2
// when one offers the memory controller, else v1) and cleans up sandboxes an earlier run with
// the same Dir left behind.
func New(cfg Config) (*Runtime, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.CgroupParent == "" {
		cfg.CgroupParent = "berth"
	}
	switch cfg.Isolate {
	case "":
		cfg.Isolate = IsolateAuto
	case IsolateAuto, IsolateOn, IsolateOff:
	default:
		return nil, berth.Errorf(berth.EInvalidRequest, "isolate must be auto, on or off, not %q", cfg.Isolate)
	}
	if cfg.Dir == "" {
		return nil, berth.Errorf(berth.EInvalidRequest, "process runtime needs a Dir")
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("process: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("process: create %s: %w", dir, err)
	}
	r := &Runtime{dir: dir, log: cfg.Logger, sandboxes: map[string]*sandbox{}}
	if err := probeInit(0); err != nil {
		return nil, fmt.Errorf("process: this binary cannot serve as a sandbox init (is MaybeRunInit the first call in main?): %w", err)
	}
	if cfg.Isolate != IsolateOff {
		if err := r.setupIsolation(cfg.CgroupParent); err != nil {
			if cfg.Isolate == IsolateOn {
				return nil, fmt.Errorf("process: isolation required but unavailable: %w", err)
			}
			r.log.Warn("process runtime: isolation unavailable", "err", err)
		}
	}
	if !r.isolated {
		r.log.Warn("process runtime: isolation is off: sandboxes are plain processes (no namespaces, no memory limit, measured from /proc)",
			"dir", dir)
	}
	r.cleanLeftovers()
	r.spawn, r.quit = make(chan spawnReq), make(chan struct{})
	go spawner(r.spawn, r.quit)
	return r, nil
}

// setupIsolation needs root, a memory cgroup hierarchy and namespaces that really clone.
func (r *Runtime) setupIsolation(parent string) error {
	if os.Geteuid() != 0 {
		return errors.New("not root")
	}
	mountinfo, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	m, ok := findMemoryMount(string(mountinfo), func(mp string) string {
		b, _ := os.ReadFile(filepath.Join(mp, "cgroup.controllers"))
		return string(b)
	})
	if !ok {
		return errors.New("no cgroup hierarchy with the memory controller")
	}
	flags := uintptr(syscall.CLONE_NEWPID | syscall.CLONE_NEWNS | syscall.CLONE_NEWUTS | syscall.CLONE_NEWIPC | syscall.CLONE_NEWNET)
	if err := probeInit(flags); err != nil {
		if !errors.Is(err, syscall.EPERM) && !errors.Is(err, syscall.EINVAL) {
			return fmt.Errorf("namespaces: %w", err)
		}
		r.log.Warn("process runtime: no network namespace for sandboxes", "err", err)
		flags &^= syscall.CLONE_NEWNET
		if err := probeInit(flags); err != nil {
			return fmt.Errorf("namespaces: %w", err)
		}
	}
	sum := sha256.Sum256([]byte(r.dir))
	cg, err := newCgroupSet(m, parent, "rt-"+hex.EncodeToString(sum[:6]))
	if err != nil {
		return err
	}
	r.isolated, r.cloneflags, r.cg = true, flags, cg
	r.log.Info("process runtime: isolation on", "cgroup", cg.base, "cgroup_v2", cg.v2,
		"netns", flags&syscall.CLONE_NEWNET != 0)
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
	if r.cg == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	removed, err := r.cg.cleanLeftovers(ctx)
	if len(removed) > 0 {
		r.log.Warn("process runtime: removed leftover sandbox cgroups", "ids", removed)
	}
	if err != nil {
		r.log.Error("process runtime: leftover cgroups remain", "err", err)
	}
}

// Isolated reports whether sandboxes get namespaces and a memory cgroup.
func (r *Runtime) Isolated() bool { return r.isolated }

// Close stops every sandbox this runtime started and refuses new ones. It is used on agent
// shutdown and in test cleanup; calling it again is harmless.
func (r *Runtime) Close() error {
	r.mu.Lock()
	first := !r.closed
	r.closed = true
	ids := make([]string, 0, len(r.sandboxes))
	for id := range r.sandboxes {
		ids = append(ids, id)
	}
	r.mu.Unlock()
	errs := make([]error, len(ids))
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			errs[i] = r.Stop(ctx, id)
		})
	}
	wg.Wait()
	if first {
		_ = os.Remove(shortSockDir(r.dir)) // only if it exists and is empty
		close(r.quit)
		if r.cg != nil {
			syscall.Rmdir(r.cg.base) // fails harmlessly when a leftover remains
		}
	}
	return errors.Join(errs...)
}

// spawnReq asks the spawner to start an init.
type spawnReq struct {
	cmd  *exec.Cmd
	done chan error
}

// spawner starts inits from one goroutine locked to its OS thread for the runtime's life. An
// init asks for SIGKILL on parent death (PR_SET_PDEATHSIG), which Linux sends when the
// *thread* that forked it exits; a thread that never exits makes it mean "when the agent
// dies". The goroutine returns without unlocking, so the thread ends with the runtime, after
// Close stopped every init.
func spawner(reqs <-chan spawnReq, quit <-chan struct{}) {
	runtime.LockOSThread()
	for {
		select {
		case req := <-reqs:
			req.done <- req.cmd.Start()
		case <-quit:
			return
		}
	}
}
