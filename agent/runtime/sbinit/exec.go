package sbinit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/berth-dev/berth"
)

// DefaultPath is the PATH of exec'd commands unless Config.Path says otherwise.
const DefaultPath = "/usr/local/bin:/usr/bin:/bin"

// defaultTimeoutS is the exec timeout when the request sets none, seconds.
const defaultTimeoutS = 60

// reaper is the init's only caller of wait4: as a subreaper (PID 1 with isolation) it inherits
// every orphan, so it waits for any child and hands the status to whoever registered the pid.
// exec.Cmd.Wait must not be used here: it would race this loop for the same children.
type reaper struct {
	mu      sync.Mutex
	waiters map[int]chan syscall.WaitStatus
	kick    chan struct{} // a child now exists: wait4 may stop returning ECHILD
}

func newReaper() *reaper {
	return &reaper{waiters: map[int]chan syscall.WaitStatus{}, kick: make(chan struct{}, 1)}
}

func (r *reaper) run() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, 0, nil)
		switch {
		case errors.Is(err, syscall.EINTR):
			continue
		case err != nil:
			// ECHILD: no children. New ones only come from start, which kicks.
			<-r.kick
			continue
		}
		// start holds mu from fork until the waiter is registered, so a child that exits at
		// once still finds its waiter here.
		r.mu.Lock()
		ch, ok := r.waiters[pid]
		delete(r.waiters, pid)
		r.mu.Unlock()
		if ok {
			ch <- ws
		}
	}
}

// start starts a process and returns a channel that receives its wait status.
func (r *reaper) start(argv0 string, argv []string, attr *os.ProcAttr) (int, <-chan syscall.WaitStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p, err := os.StartProcess(argv0, argv, attr)
	if err != nil {
		return 0, nil, err
	}
	pid := p.Pid // Release sets p.Pid to -1
	ch := make(chan syscall.WaitStatus, 1)
	r.waiters[pid] = ch
	p.Release() // the reaper waits, not os.Process
	select {
	case r.kick <- struct{}{}:
	default:
	}
	return pid, ch, nil
}

// exec runs req.Cmd and returns when the command itself exits (or its timeout or ctx kills its
// process group). Processes it left in the background keep running; exec does not wait for
// them, and their output after the command's exit is read and discarded so they never block
// or get SIGPIPE. Exit codes: the command's own; 128+signal when a signal killed it; 127 when
// the command is not found, 126 when it cannot be executed; -1 on timeout, with a note at the
// end of stderr.
func (s *server) exec(ctx context.Context, req wireRequest) wireResponse {
	if len(req.Cmd) == 0 || req.Cmd[0] == "" {
		return wireResponse{Code: berth.EInvalidRequest, Message: "empty cmd"}
	}
	timeout := time.Duration(req.TimeoutS) * time.Second
	if req.TimeoutS <= 0 {
		timeout = defaultTimeoutS * time.Second
	}
	argv0, err := lookPath(req.Cmd[0], s.cfg.Path, s.cfg.Cwd)
	if err != nil {
		return wireResponse{ExitCode: 127, Stderr: fmt.Sprintf("sandbox: %s: command not found\n", req.Cmd[0])}
	}

	stdin, feed, err := stdinFor(req.Stdin)
	if err != nil {
		return errResponse(fmt.Errorf("stdin pipe: %w", err))
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		stdin.Close()
		return errResponse(fmt.Errorf("stdout pipe: %w", err))
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		stdin.Close()
		outR.Close()
		outW.Close()
		return errResponse(fmt.Errorf("stderr pipe: %w", err))
	}
	pid, done, err := s.reaper.start(argv0, req.Cmd, &os.ProcAttr{
		Dir:   s.cfg.Cwd,
		Env:   s.env(),
		Files: []*os.File{stdin, outW, errW},
		// Its own process group, so a timeout kills everything it started in the foreground
		// and its background jobs alike.
		Sys: &syscall.SysProcAttr{Setpgid: true},
	})
	stdin.Close()
	outW.Close()
	errW.Close()
	if err != nil {
		outR.Close()
		errR.Close()
		if feed != nil {
			feed.Close()
		}
		code := 126
		if errors.Is(err, os.ErrNotExist) {
			code = 127
		}
		return wireResponse{ExitCode: code, Stderr: fmt.Sprintf("sandbox: %s: %v\n", req.Cmd[0], err)}
	}
	if feed != nil {
		go func() { io.WriteString(feed, req.Stdin); feed.Close() }()
	}
	stdout, stderr := newOutput(outR), newOutput(errR)
	go stdout.run()
	go stderr.run()

	timer := time.NewTimer(timeout)
	defer timer.Stop()
	var ws syscall.WaitStatus
	timedOut := false
	select {
	case ws = <-done:
	case <-timer.C:
		timedOut = true
		killGroup(pid)
		ws = <-done
	case <-ctx.Done():
		killGroup(pid)
		ws = <-done
	}
	if feed != nil {
		feed.SetWriteDeadline(time.Now()) // nobody may ever read the rest
	}
	resp := wireResponse{ExitCode: exitCode(ws)}
	resp.Stdout = string(stdout.finish())
	errText := stderr.finish()
	if stdout.dropped > 0 {
		errText = fmt.Appendf(errText, "\nsandbox: stdout truncated to %d bytes (%d dropped)\n", MaxOutputBytes, stdout.dropped)
	}
	if stderr.dropped > 0 {
		errText = fmt.Appendf(errText, "\nsandbox: stderr truncated to %d bytes (%d dropped)\n", MaxOutputBytes, stderr.dropped)
	}
	if timedOut {
		resp.ExitCode = -1
		errText = fmt.Appendf(errText, "\nsandbox: command timed out after %s and was killed\n", timeout)
	}
	resp.Stderr = string(errText)
	return resp
}

// env is the environment of exec'd commands and services: PATH, HOME (the working directory),
// LANG, then Config.Env.
func (s *server) env() []string {
	return append([]string{"PATH=" + s.cfg.Path, "HOME=" + s.cfg.Cwd, "LANG=C.UTF-8"}, s.cfg.Env...)
}

// killGroup kills the process group led by pid; it refuses pids that would address more
// than one group (kill(0) or kill(-1) semantics).
func killGroup(pid int) {
	if pid > 1 {
		syscall.Kill(-pid, syscall.SIGKILL)
	}
}

// stdinFor returns the command's stdin: /dev/null when there is none, else the read end of a
// pipe whose write end (feed) the caller fills.
func stdinFor(in string) (stdin, feed *os.File, err error) {
	if in == "" {
		f, err := os.Open(os.DevNull)
		return f, nil, err
	}
	return os.Pipe()
}

func exitCode(ws syscall.WaitStatus) int {
	if ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ws.ExitStatus()
}

// lookPath resolves name like a shell would: names with a slash are used as given (relative
// to cwd), others are searched in path.
func lookPath(name, path, cwd string) (string, error) {
	if strings.Contains(name, "/") {
		if !filepath.IsAbs(name) {
			name = filepath.Join(cwd, name)
		}
		return name, nil
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			continue
		}
		p := filepath.Join(dir, name)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", os.ErrNotExist
}

// output captures one pipe of a command, keeping at most MaxOutputBytes. When the command
// exits, finish stops the capture without waiting for EOF (a background process may hold the
// pipe forever): it interrupts the blocked read, takes what is already in the pipe with
// non-blocking reads, and leaves a goroutine discarding the rest until every writer is gone.
type output struct {
	f       *os.File
	buf     []byte
	dropped int64
	final   chan struct{} // closed once buf is complete
}

func newOutput(f *os.File) *output { return &output{f: f, final: make(chan struct{})} }

func (o *output) keep(p []byte) {
	room := MaxOutputBytes - len(o.buf)
	if len(p) > room {
		o.dropped += int64(len(p) - room)
		p = p[:room]
	}
	o.buf = append(o.buf, p...)
}

func (o *output) run() {
	defer o.f.Close()
	b := make([]byte, 32<<10)
	eof := false
	for {
		n, err := o.f.Read(b)
		o.keep(b[:n])
		if err == nil {
			continue
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			eof = o.drain(b)
		} else {
			eof = true
		}
		break
	}
	close(o.final)
	if !eof {
		io.Copy(io.Discard, o.f)
	}
}

// drain reads what is already in the pipe without blocking; it reports EOF.
func (o *output) drain(b []byte) (eof bool) { return drainPipe(o.f, b, o.keep) }

// drainPipe clears f's read deadline and hands what is already in the pipe to keep, without
// blocking; it reports EOF (every writer gone). Used once a command has exited, so a
// background process that still holds the pipe cannot hold up the capture.
func drainPipe(f *os.File, b []byte, keep func([]byte)) (eof bool) {
	f.SetReadDeadline(time.Time{})
	rc, err := f.SyscallConn()
	if err != nil {
		return false
	}
	// Bounded: a writer faster than us must not keep exec from returning.
	for range 2 * MaxOutputBytes / len(b) {
		var n int
		var rerr error
		rc.Read(func(fd uintptr) bool {
			n, rerr = syscall.Read(int(fd), b)
			return true // never wait for more
		})
		if n > 0 {
			keep(b[:n])
			continue
		}
		return n == 0 && rerr == nil
	}
	return false
}

// finish ends the capture (see output) and returns the kept bytes.
func (o *output) finish() []byte {
	o.f.SetReadDeadline(time.Now())
	<-o.final
	return o.buf
}
