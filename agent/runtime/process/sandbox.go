package process

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/agent/runtime/driver"
)

// Files in <Dir>/<id> (with mntDir, mount.go).
const (
	markerFile = "berth-sandbox" // marks the directory as the runtime's, for leftover cleanup
	pidFile    = "init.pid"      // the init's host pid
	logFile    = "init.log"      // the init's own stdout and stderr
	sockFile   = "init.sock"
	rootDir    = "root" // without isolation: the sandbox's working directory, its /tmp
)

// shortSockDir is where sockets go when <Dir>/<id>/init.sock would be too long: a directory
// named after a hash of the runtime's Dir, so runtimes never share it.
func shortSockDir(dir string) string {
	sum := sha256.Sum256([]byte(dir))
	return filepath.Join(os.TempDir(), "berth-"+hex.EncodeToString(sum[:6]))
}

// maxSockPath is the longest unix socket path Linux accepts (sun_path minus the NUL).
const maxSockPath = 107

// Spec describes a sandbox to start. MemoryMiB is its memory limit in MiB (> 0); VCPUs is
// accepted and ignored for now (see the package comment).
type Spec struct {
	ID        string
	MemoryMiB int64
	VCPUs     int
	// Template picks an isolated sandbox's root: Config.Rootfs[Template] when named there,
	// else the built-in root. Ignored without isolation.
	Template string
	// VolumeDir, when set, is an existing absolute host directory (a durable volume, POOL-2)
	// that the sandbox sees at /tmp/volume. It outlives the sandbox: Stop never touches it.
	// With isolation Start makes the directory itself volumeOwner's (uid and gid 1000), and
	// the sandbox sees that owner's files as its own (an idmapped mount), so the directory's
	// file system must support idmapped mounts (ext4, xfs, btrfs, tmpfs...). Without
	// isolation it is a link "volume" in the working directory, which commands follow and
	// the files API, confined to that directory, does not.
	VolumeDir string
}

// sandbox is the runtime's record of one sandbox, in its registry from Start until its Stop
// is done.
type sandbox struct {
	driver.Life
	id      string
	dir     string // <Dir>/<id>
	sock    string
	path    string   // PATH of its commands
	cgroup  string   // its memory cgroup; "" without isolation
	cgroups []string // all its cgroups (memory, pids)
	uid     *uidLease

	proc   *os.Process
	exited chan struct{} // closed once the init has been reaped
}

func (sb *sandbox) hasExited() bool {
	select {
	case <-sb.exited:
		return true
	default:
		return false
	}
}

// Start starts the sandbox s.ID and returns once its init is ready to serve (AGT-3); with
// isolation it runs as a uid of its own in a root of its own (see the package comment).
// Errors: EInvalidRequest for a bad id, size or volume; EConflict when the id is already
// held; EUnavailable after Close or when every sandbox uid is leased; runtime failures
// (the init's own error or the end of its log) are wrapped. A failed start leaves nothing
// behind.
func (r *Runtime) Start(ctx context.Context, s Spec) error {
	if err := driver.ValidID(s.ID); err != nil {
		return err
	}
	if s.MemoryMiB <= 0 {
		return berth.Errorf(berth.EInvalidRequest, "memory must be positive, not %d MiB", s.MemoryMiB)
	}
	if s.VolumeDir != "" {
		if st, err := os.Stat(s.VolumeDir); err != nil || !st.IsDir() || !filepath.IsAbs(s.VolumeDir) {
			return berth.Errorf(berth.EInvalidRequest, "volume %q must be an existing absolute directory", s.VolumeDir)
		}
	}
	sb := &sandbox{Life: driver.NewLife(), id: s.ID, dir: filepath.Join(r.dir, s.ID), exited: make(chan struct{})}
	sb.sock = filepath.Join(sb.dir, sockFile)
	if len(sb.sock) > maxSockPath {
		// A deep Dir would push the path past the kernel's limit: keep the socket in a short
		// per-runtime directory under the system temp dir instead (outside the sandbox's
		// view once isolated: its /tmp is private).
		sb.sock = filepath.Join(shortSockDir(r.dir), s.ID+".sock")
		if len(sb.sock) > maxSockPath {
			return berth.Errorf(berth.EInvalidRequest, "socket path %s is over %d bytes: use a shorter id", sb.sock, maxSockPath)
		}
		if err := os.MkdirAll(filepath.Dir(sb.sock), 0o700); err != nil {
			return fmt.Errorf("process: socket dir: %w", err)
		}
	}
	if err := r.sandboxes.Admit(s.ID, sb); err != nil {
		return err
	}
	return r.sandboxes.Started(s.ID, sb, r.start(ctx, sb, s), func() { r.teardown(sb) })
}

func (r *Runtime) start(ctx context.Context, sb *sandbox, s Spec) error {
	os.RemoveAll(sb.dir) // a leftover of a start that failed half-way
	if err := os.MkdirAll(sb.dir, 0o755); err != nil {
		return fmt.Errorf("process: create %s: %w", sb.dir, err)
	}
	if err := os.WriteFile(filepath.Join(sb.dir, markerFile), nil, 0o644); err != nil {
		return fmt.Errorf("process: %w", err)
	}
	ic := initConfig{id: sb.id, dir: sb.dir, isolated: r.isolated, volume: s.VolumeDir, sock: sb.sock}
	var extra []*os.File
	if r.isolated {
		if err := r.prepareIsolated(sb, s, &ic); err != nil {
			return err
		}
		extra = []*os.File{sb.uid.file} // lockFD
	} else {
		// The working directory, shared with nobody: 1777 as a /tmp.
		if err := os.Mkdir(filepath.Join(sb.dir, rootDir), 0o755); err != nil {
			return fmt.Errorf("process: %w", err)
		}
		if err := os.Chmod(filepath.Join(sb.dir, rootDir), 0o1777); err != nil {
			return fmt.Errorf("process: %w", err)
		}
		ic.path = commandPath()
	}
	sb.path = ic.path
	logf, err := os.OpenFile(filepath.Join(sb.dir, logFile), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("process: %w", err)
	}
	defer logf.Close()
	goR, goW, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("process: %w", err)
	}
	defer goW.Close()
	readyR, readyW, err := os.Pipe()
	if err != nil {
		goR.Close()
		return fmt.Errorf("process: %w", err)
	}
	defer readyR.Close()

	cmd := &exec.Cmd{
		Path:       "/proc/self/exe",
		Args:       append([]string{"berth-sandbox"}, ic.args()...), // argv[0] shows in ps
		Env:        []string{},                                      // the agent's environment (tokens) stays out of the sandbox
		Stdout:     logf,
		Stderr:     logf,
		ExtraFiles: append([]*os.File{goR, readyW}, extra...), // fds 3, 4 (goFD, readyFD) and 5 (lockFD)
		// Its own session (and so its own process group) with no controlling terminal: a
		// signal to the agent's group does not hit sandboxes, and no sandbox can reach the
		// terminal berth runs in (TIOCSTI would type commands into the operator's shell).
		SysProcAttr: &syscall.SysProcAttr{Cloneflags: r.cloneflags, Setsid: true},
	}
	err = r.spawner.Start(cmd)
	goR.Close()
	readyW.Close()
	if err != nil {
		return fmt.Errorf("process: start init of %s: %w", sb.id, err)
	}
	sb.proc = cmd.Process
	go func() { driver.WaitExit(cmd); close(sb.exited) }() // no OS thread held while it runs
	if err := os.WriteFile(filepath.Join(sb.dir, pidFile), []byte(strconv.Itoa(cmd.Process.Pid)), 0o644); err != nil {
		return fmt.Errorf("process: %w", err)
	}
	// Before the init runs anything: everything it and its commands touch is charged and
	// counted here, and they cannot leave (no cgroup file system in view).
	for _, cg := range sb.cgroups {
		if err := addProc(cg, cmd.Process.Pid); err != nil {
			return err
		}
	}
	if _, err := goW.Write([]byte{'g'}); err != nil {
		return fmt.Errorf("process: release init of %s: %w", sb.id, err)
	}
	goW.Close()
	return waitReady(ctx, readyR, sb.id, filepath.Join(sb.dir, logFile))
}

// prepareIsolated does the host's part of an isolated start: a uid lease, the cgroups with
// their limits, the root's mount point, the volume's owner, and the init's arguments.
func (r *Runtime) prepareIsolated(sb *sandbox, s Spec, ic *initConfig) error {
	lease, err := leaseUID()
	if err != nil {
		return err
	}
	sb.uid = lease
	lim := cgroupLimits{memoryMiB: s.MemoryMiB, pids: r.pidsLimit}
	for _, set := range r.cgroups {
		cg, err := set.create(sb.id, lim)
		if err != nil {
			return err
		}
		sb.cgroups = append(sb.cgroups, cg)
		if set == r.memory {
			sb.cgroup = cg
		}
	}
	if err := os.Mkdir(filepath.Join(sb.dir, mntDir), 0o755); err != nil {
		return fmt.Errorf("process: %w", err)
	}
	if s.VolumeDir != "" {
		// Only the directory itself: what is inside was written through the idmapped mount
		// and is volumeOwner's already.
		if err := os.Lchown(s.VolumeDir, volumeOwner, volumeOwner); err != nil {
			return fmt.Errorf("process: volume %s: %w", s.VolumeDir, err)
		}
	}
	layout := r.layout(s.Template)
	b, err := json.Marshal(layout)
	if err != nil {
		return fmt.Errorf("process: %w", err)
	}
	tmp := r.tmpMiB
	if tmp == 0 {
		tmp = max(s.MemoryMiB/2, minTmpMiB)
	}
	ic.rootfs, ic.uid, ic.tmpMiB, ic.shmMiB = string(b), lease.uid, tmp, min(tmp, maxShmMiB)
	ic.path = sandboxPath(layout)
	return nil
}

// waitReady reads the init's one-line verdict: "ok", or "error: …", or EOF if it died (the
// error then quotes the end of its log).
func waitReady(ctx context.Context, readyR *os.File, id, logPath string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	stop := context.AfterFunc(ctx, func() { readyR.SetReadDeadline(time.Now()) })
	defer stop()
	line, err := bufio.NewReader(readyR).ReadString('\n')
	line = strings.TrimSpace(line)
	switch {
	case line == "ok":
		return nil
	case strings.HasPrefix(line, "error: "):
		return fmt.Errorf("process: init of %s: %s", id, strings.TrimPrefix(line, "error: "))
	case ctx.Err() != nil:
		return fmt.Errorf("process: waiting for init of %s: %w", id, ctx.Err())
	case errors.Is(err, io.EOF):
		return fmt.Errorf("process: init of %s exited before it was ready: %s", id, logTail(logPath))
	default:
		return fmt.Errorf("process: waiting for init of %s: %w", id, err)
	}
}

// logTail returns the last lines of the init's log, for error messages.
func logTail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "no log: " + err.Error()
	}
	const keep = 1024
	if len(b) > keep {
		b = b[len(b)-keep:]
	}
	return strings.TrimSpace(string(b))
}
