package process

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/berth-dev/berth"
)

// Files in <Dir>/<id>.
const (
	markerFile = "berth-sandbox" // marks the directory as the runtime's, for leftover cleanup
	pidFile    = "init.pid"      // the init's host pid
	logFile    = "init.log"      // the init's own stdout and stderr
	sockFile   = "init.sock"
	rootDir    = "root" // the sandbox's /tmp
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
	// VolumeDir, when set, is an existing host directory (a durable volume, POOL-2) that
	// the sandbox sees at /tmp/volume. It outlives the sandbox: Stop never touches it.
	VolumeDir string
}

// sandbox is the runtime's record of one sandbox. ready is closed once Start finished; if it
// failed, startErr is set and the record is already gone from the map.
type sandbox struct {
	id     string
	dir    string // <Dir>/<id>
	sock   string
	cgroup string // "" without isolation

	ready    chan struct{}
	startErr error
	proc     *os.Process
	exited   chan struct{} // closed once the init has been reaped

	stopping chan struct{} // closed by the first Stop
	stopped  chan struct{} // closed when that Stop is done
	stopErr  error
}

func (sb *sandbox) hasExited() bool {
	select {
	case <-sb.exited:
		return true
	default:
		return false
	}
}

// validID accepts ids that are safe as a path element and a cgroup name.
func validID(id string) error {
	if id == "" || id == "." || id == ".." || len(id) > 128 {
		return berth.Errorf(berth.EInvalidRequest, "bad sandbox id %q", id)
	}
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return berth.Errorf(berth.EInvalidRequest, "bad sandbox id %q: only letters, digits, '-', '_' and '.'", id)
		}
	}
	return nil
}

// Start starts the sandbox s.ID and returns once its init is ready to serve (AGT-3). Errors:
// EInvalidRequest for a bad id or size, EConflict when the id is already held, EUnavailable
// after Close; runtime failures are wrapped. A failed start leaves nothing behind.
func (r *Runtime) Start(ctx context.Context, s Spec) error {
	if err := validID(s.ID); err != nil {
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
	sb := &sandbox{
		id:       s.ID,
		dir:      filepath.Join(r.dir, s.ID),
		ready:    make(chan struct{}),
		exited:   make(chan struct{}),
		stopping: make(chan struct{}),
		stopped:  make(chan struct{}),
	}
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
	r.mu.Lock()
	switch {
	case r.closed:
		r.mu.Unlock()
		return berth.Errorf(berth.EUnavailable, "process runtime is closed")
	case r.sandboxes[s.ID] != nil:
		r.mu.Unlock()
		return berth.Errorf(berth.EConflict, "sandbox %s already exists", s.ID)
	}
	r.sandboxes[s.ID] = sb
	r.mu.Unlock()

	err := r.start(ctx, sb, s)
	if err != nil {
		r.teardown(sb)
		r.mu.Lock()
		delete(r.sandboxes, s.ID)
		r.mu.Unlock()
		sb.startErr = err
	}
	close(sb.ready)
	return err
}

func (r *Runtime) start(ctx context.Context, sb *sandbox, s Spec) error {
	os.RemoveAll(sb.dir) // a leftover of a start that failed half-way
	if err := os.MkdirAll(filepath.Join(sb.dir, rootDir), 0o755); err != nil {
		return fmt.Errorf("process: create %s: %w", sb.dir, err)
	}
	if err := os.Chmod(filepath.Join(sb.dir, rootDir), 0o1777); err != nil {
		return fmt.Errorf("process: %w", err)
	}
	if err := os.WriteFile(filepath.Join(sb.dir, markerFile), nil, 0o644); err != nil {
		return fmt.Errorf("process: %w", err)
	}
	if r.cg != nil {
		cg, err := r.cg.create(sb.id, s.MemoryMiB)
		if err != nil {
			return err
		}
		sb.cgroup = cg
	}
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

	ic := initConfig{id: sb.id, dir: sb.dir, hide: r.dir, path: commandPath(), isolated: r.isolated, volume: s.VolumeDir, sock: sb.sock}
	cmd := &exec.Cmd{
		Path:       "/proc/self/exe",
		Args:       append([]string{"berth-sandbox"}, ic.args()...), // argv[0] shows in ps
		Env:        []string{},                                      // the agent's environment (tokens) stays out of the sandbox
		Stdout:     logf,
		Stderr:     logf,
		ExtraFiles: []*os.File{goR, readyW}, // fds 3 and 4 (goFD, readyFD)
		// Its own process group: a signal to the agent's group does not hit sandboxes.
		SysProcAttr: &syscall.SysProcAttr{Cloneflags: r.cloneflags, Setpgid: true},
	}
	done := make(chan error, 1)
	select {
	case r.spawn <- spawnReq{cmd: cmd, done: done}:
		err = <-done
	case <-r.quit:
		err = berth.Errorf(berth.EUnavailable, "process runtime is closed")
	}
	goR.Close()
	readyW.Close()
	if err != nil {
		return fmt.Errorf("process: start init of %s: %w", sb.id, err)
	}
	sb.proc = cmd.Process
	go func() { cmd.Wait(); close(sb.exited) }()
	if err := os.WriteFile(filepath.Join(sb.dir, pidFile), []byte(strconv.Itoa(cmd.Process.Pid)), 0o644); err != nil {
		return fmt.Errorf("process: %w", err)
	}
	if sb.cgroup != "" {
		// Before the init runs anything: everything it and its commands touch is charged here.
		if err := addProc(sb.cgroup, cmd.Process.Pid); err != nil {
			return err
		}
	}
	if _, err := goW.Write([]byte{'g'}); err != nil {
		return fmt.Errorf("process: release init of %s: %w", sb.id, err)
	}
	goW.Close()
	return waitReady(ctx, readyR, sb.id, filepath.Join(sb.dir, logFile))
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

// commandPath is the PATH of exec'd commands: the standard directories, then the agent's.
func commandPath() string {
	dirs := filepath.SplitList(defaultPath)
	seen := map[string]bool{}
	for _, d := range dirs {
		seen[d] = true
	}
	for _, d := range filepath.SplitList(os.Getenv("PATH")) {
		if d != "" && filepath.IsAbs(d) && !seen[d] {
			seen[d] = true
			dirs = append(dirs, d)
		}
	}
	return strings.Join(dirs, string(filepath.ListSeparator))
}

// Stop stops the sandbox (AGT-7): it kills the whole process tree (with isolation, killing
// the init ends its PID namespace and everything in it), waits for it, removes the cgroup and
// the sandbox's directory. Stop is idempotent: an unknown or already stopped id is not an
// error. Concurrent Stops of one id all wait for the same teardown.
func (r *Runtime) Stop(ctx context.Context, id string) error {
	r.mu.Lock()
	sb := r.sandboxes[id]
	r.mu.Unlock()
	if sb == nil {
		return nil
	}
	select {
	case <-sb.ready:
	case <-ctx.Done():
		return fmt.Errorf("process: stop %s while it starts: %w", id, ctx.Err())
	}
	if sb.startErr != nil {
		return nil // Start cleaned up already
	}
	first := false
	r.mu.Lock()
	select {
	case <-sb.stopping:
	default:
		close(sb.stopping)
		first = true
	}
	r.mu.Unlock()
	if first {
		sb.stopErr = r.teardown(sb)
		r.mu.Lock()
		delete(r.sandboxes, id)
		r.mu.Unlock()
		close(sb.stopped)
	}
	select {
	case <-sb.stopped:
		return sb.stopErr
	case <-ctx.Done():
		return fmt.Errorf("process: stop %s: %w", id, ctx.Err())
	}
}

// teardown kills and removes whatever of sb exists. Its waits are bounded on their own so a
// stuck cgroup cannot hang the agent; what remains is cleaned by the next New.
func (r *Runtime) teardown(sb *sandbox) error {
	var errs []error
	if sb.proc != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		kill := func() error {
			if err := sb.proc.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
				return fmt.Errorf("process: kill init of %s: %w", sb.id, err)
			}
			return nil
		}
		if r.isolated || sb.hasExited() { // once reaped, the pid may belong to a stranger
			errs = append(errs, kill())
		} else {
			errs = append(errs, killTree(ctx, sb.proc.Pid, kill, sb.hasExited))
		}
		select {
		case <-sb.exited:
		case <-ctx.Done():
			errs = append(errs, fmt.Errorf("process: init of %s did not exit: %w", sb.id, ctx.Err()))
		}
		cancel()
	}
	if sb.cgroup != "" {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		errs = append(errs, removeCgroup(ctx, sb.cgroup))
		cancel()
	}
	if err := os.RemoveAll(sb.dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, fmt.Errorf("process: remove %s: %w", sb.dir, err))
	}
	if !strings.HasPrefix(sb.sock, sb.dir+string(filepath.Separator)) {
		_ = os.Remove(sb.sock) // a socket kept in the short directory
	}
	return errors.Join(errs...)
}
