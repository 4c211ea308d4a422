// Package gvisor is the gVisor runtime driver (ISO-1, ISO-4): every sandbox is an OCI
// container run by runsc, whose application kernel (the sentry) answers the guest's system
// calls in user space, itself confined by seccomp, namespaces and a host user with no
// privileges. The guest never talks to the host kernel directly, so a kernel bug reachable
// from a system call is not an escape path, unlike with the process runtime.
//
// A sandbox sees (bundle.go): a read-only root of its template (package rootfs: the host's
// /usr, /bin, /lib* and a minimal /etc, never the host's root), a private /tmp of bounded size
// held in the sentry's memory (charged to the sandbox's memory cgroup, never on the store's
// file system), no network but its own loopback (runsc --network=none), a memory limit of
// its configured size and a pids limit, and runs as uid 1000 with no capabilities. Its
// processes run under Berth's init (package sbinit), reached through a relay process that
// `runsc exec` starts for each call (ops.go): exec, files, app services and port dials all
// work as on the process runtime.
//
// Checkpoint and Restore (checkpoint.go) save and restore a running guest — processes,
// memory, its /tmp — with `runsc checkpoint` and `runsc restore`, for pause and resume
// (PAUSE-1) and evacuation (SPOT-3, PAUSE-2).
//
// The binary that runs inside a sandbox as its init and relay is this very binary: main()
// and TestMain of any package that starts gVisor sandboxes must call MaybeRunInit first.
//
// Platform (Config.Platform): systrap where the installed runsc has it, else ptrace; KVM is
// never chosen by default (these hosts are themselves VMs). CPU: Spec.VCPUs is accepted and
// ignored for now, as on the process runtime.
package gvisor

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/agent/runtime/cgroups"
	"github.com/berth-dev/berth/agent/runtime/driver"
	"github.com/berth-dev/berth/agent/runtime/rootfs"
	"github.com/berth-dev/berth/agent/runtime/sbinit"
)

// Config configures a Runtime. Zero fields take the defaults documented on them.
type Config struct {
	// Dir holds the runtime's state: runsc's state root, one OCI bundle per sandbox, the
	// built-in root file system and the init binary. Required; created if missing. Leftovers
	// of an earlier run with the same Dir are stopped and removed by New.
	Dir string
	// Runsc is the runsc binary (default: "runsc" on PATH).
	Runsc string
	// Platform is runsc's platform: "" picks systrap when the installed runsc lists it,
	// else ptrace.
	Platform string
	// TmpMiB bounds each sandbox's /tmp in MiB; 0 means half its memory size, at least 16.
	TmpMiB int64
	// PidsLimit bounds the processes inside a sandbox (RLIMIT_NPROC of the guest; default
	// 512). The host pids cgroup of the sandbox is set well above it as a backstop: on the
	// ptrace platform each guest process costs several host tasks of the sentry.
	PidsLimit int
	// Rootfs maps a template name to an unpacked root file system directory on this host;
	// templates not named here get the built-in root (rootfs.Builtin).
	Rootfs map[string]string
	// CgroupParent names the cgroup under which runsc makes each sandbox's (default
	// "berth-gvisor"); sandboxes live at <parent>/<instance>/<id>, instance derived from Dir.
	CgroupParent string
	// InitBinary is the binary that serves as init and relay inside sandboxes (default: this
	// executable). It must call MaybeRunInit first in main.
	InitBinary string
	// Logger receives the runtime's logs; nil means slog.Default().
	Logger *slog.Logger
}

// Runtime runs sandboxes as gVisor containers. It is safe for concurrent use.
type Runtime struct {
	cfg      Config
	dir      string
	runsc    string
	platform string
	version  string // runsc's version line
	builtin  rootfs.Layout
	init     initBinary
	cgroup   string // <parent>/<instance>, relative to the cgroup mount
	memory   cgroups.Mount
	log      *slog.Logger
	spawner  *driver.Spawner
	tag      string // what an image depends on besides its files (ImageTag)

	sandboxes *driver.Registry[*sandbox]
	// Ops are the sandbox calls (exec, files, service, dials, ping) over relays (ops.go).
	sbinit.Ops
}

// New checks that runsc is installed and starts a sandbox here (a probe that runs this
// binary as a sandbox's init and reads its answer), prepares the built-in root file system
// and the init binary, and stops what an earlier run with the same Dir left behind. Errors:
// invalid_request for a bad config; unsupported without root; unavailable when runsc is
// missing or cannot start a sandbox on this host (the message says why).
func New(cfg Config) (*Runtime, error) {
	if cfg.Dir == "" {
		return nil, berth.Errorf(berth.EInvalidRequest, "gvisor runtime needs a Dir")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.PidsLimit <= 0 {
		cfg.PidsLimit = 512
	}
	if cfg.CgroupParent == "" {
		cfg.CgroupParent = "berth-gvisor"
	}
	for name, dir := range cfg.Rootfs {
		if _, err := rootfs.Custom(dir); err != nil {
			return nil, berth.Errorf(berth.EInvalidRequest, "template %s: %v", name, err)
		}
	}
	runsc, err := Find(cfg.Runsc)
	if err != nil {
		return nil, err
	}
	if os.Geteuid() != 0 {
		return nil, berth.Errorf(berth.EUnsupported, "gvisor: the gVisor runtime needs root (runsc makes each sandbox's cgroups and namespaces): "+
			"run berth as root, or pass --runtime process --insecure for unisolated development sandboxes")
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("gvisor: %w", err)
	}
	for _, d := range []string{dir, filepath.Join(dir, stateDir), filepath.Join(dir, bundlesDir)} {
		if err := os.MkdirAll(d, 0o711); err != nil {
			return nil, fmt.Errorf("gvisor: create %s: %w", d, err)
		}
	}
	r := &Runtime{cfg: cfg, dir: dir, runsc: runsc, log: cfg.Logger, sandboxes: driver.NewRegistry[*sandbox]("gvisor")}
	r.Ops = sbinit.Ops{Client: r.clientFor}
	if r.version, err = runscVersion(runsc); err != nil {
		return nil, err
	}
	if r.platform, err = pickPlatform(runsc, cfg.Platform); err != nil {
		return nil, err
	}
	mem, ok := cgroups.Host("memory")
	if !ok {
		return nil, berth.Errorf(berth.EUnavailable, "gvisor: no cgroup hierarchy with the memory controller")
	}
	r.memory = mem
	sum := sha256.Sum256([]byte(dir))
	r.cgroup = filepath.Join("/", cfg.CgroupParent, "rt-"+hex.EncodeToString(sum[:6]))
	if r.builtin, err = rootfs.Builtin(filepath.Join(dir, "rootfs", "builtin")); err != nil {
		return nil, err
	}
	if r.init, err = stageInit(cfg.InitBinary, filepath.Join(dir, initDir)); err != nil {
		return nil, err
	}
	r.tag = fmt.Sprintf("runsc %s, platform %s, init %s", r.version, r.platform, r.init.sum)
	r.spawner = driver.NewSpawner()
	r.cleanLeftovers()
	if err := r.probe(); err != nil {
		r.Close()
		return nil, err
	}
	r.log.Info("gvisor runtime ready", "runsc", runsc, "version", r.version, "platform", r.platform, "dir", dir)
	return r, nil
}

// Files and directories under Dir.
const (
	stateDir   = "state"   // runsc --root
	bundlesDir = "bundles" // one OCI bundle per sandbox
	initDir    = "init"    // the init binary (and its loader and libraries), seen as /.berth
)

// Find returns the runsc binary to use: path when set, else "runsc" on PATH. Errors:
// unavailable when there is none (the message says how to install it).
func Find(path string) (string, error) {
	if path == "" {
		path = "runsc"
	}
	p, err := exec.LookPath(path)
	if err != nil {
		return "", berth.Errorf(berth.EUnavailable, "gvisor: runsc not found (%v): install it (Debian: apt-get install runsc)", err)
	}
	return p, nil
}

// Platform returns the platform sandboxes run on ("systrap" or "ptrace").
func (r *Runtime) Platform() string { return r.platform }

// Version returns the installed runsc's version.
func (r *Runtime) Version() string { return r.version }

// ImageTag names what a checkpoint image depends on besides its files: runsc's version, the
// platform and the init binary's hash. An image restores only on a runtime with the same tag.
func (r *Runtime) ImageTag() string { return r.tag }

func runscVersion(runsc string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, runsc, "--version").CombinedOutput()
	if err != nil {
		return "", berth.Errorf(berth.EUnavailable, "gvisor: %s --version: %v: %s", runsc, err, bytes.TrimSpace(out))
	}
	line, _, _ := strings.Cut(string(out), "\n")
	return strings.TrimSpace(strings.TrimPrefix(line, "runsc version ")), nil
}

// pickPlatform returns want when set, else systrap when runsc lists it, else ptrace.
func pickPlatform(runsc, want string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, _ := exec.CommandContext(ctx, runsc, "help", "platforms").CombinedOutput()
	listed := map[string]bool{}
	for _, f := range strings.Fields(string(out)) {
		listed[f] = true
	}
	switch {
	case want != "" && !listed[want] && len(listed) > 0:
		return "", berth.Errorf(berth.EInvalidRequest, "gvisor: this runsc has no platform %q (it has: %s)", want, strings.TrimSpace(string(out)))
	case want != "":
		return want, nil
	case listed["systrap"]:
		return "systrap", nil
	}
	return "ptrace", nil
}

// globalArgs are runsc's flags for every command of this runtime.
func (r *Runtime) globalArgs() []string {
	return []string{"--root", filepath.Join(r.dir, stateDir), "--platform", r.platform, "--network", "none"}
}

// runscCmd returns a runsc command with the runtime's global flags.
func (r *Runtime) runscCmd(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, r.runsc, append(r.globalArgs(), args...)...)
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	return cmd
}

// cleanLeftovers stops and deletes the containers an earlier run with the same Dir left
// (an agent killed without a stop) and removes their bundles. Failures are logged.
func (r *Runtime) cleanLeftovers() {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	entries, _ := os.ReadDir(filepath.Join(r.dir, bundlesDir))
	for _, e := range entries {
		id := e.Name()
		r.runscCmd(ctx, "kill", id, "KILL").Run()
		r.runscCmd(ctx, "delete", "--force", id).Run()
		if err := os.RemoveAll(filepath.Join(r.dir, bundlesDir, id)); err != nil {
			r.log.Warn("gvisor: cannot remove a leftover bundle", "id", id, "err", err)
			continue
		}
		r.log.Warn("gvisor: removed a leftover sandbox of an earlier run", "id", id)
	}
}

// Close stops every sandbox this runtime started and refuses new ones; calling it again is
// harmless.
func (r *Runtime) Close() error {
	first, err := r.sandboxes.Close(r.Stop)
	if first && r.spawner != nil {
		r.spawner.Close()
		// runsc removes each sandbox's cgroup but not the runtime's level above them.
		cgroups.RemoveEmpty(r.cgroup)
	}
	return err
}
