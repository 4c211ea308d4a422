package sbinit

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/berth-dev/berth"
)

// This file is the init's side of app services (APP-1): one long-running command per sandbox,
// its status, and TCP connections to it from the host (the sandbox has its own network
// namespace, so the host cannot reach the app's port any other way).

// dialTimeout bounds the init's TCP connect to an app inside the sandbox. Refusals on the
// loopback come at once; this only matters for a listener whose backlog is full.
const dialTimeout = 10 * time.Second

// service is the sandbox's service slot. A new serve may start once the previous run exited.
type service struct {
	mu  sync.Mutex
	cur *serviceRun // nil before the first serve
}

// serviceRun is one start of the service. exited and exitCode are guarded by service.mu.
type serviceRun struct {
	out      *tail
	exited   bool
	exitCode int
}

// startService starts req.Cmd detached: its own process group, cwd and environment as exec
// (plus req.Env), stdin /dev/null, stdout and stderr into one tail of ServiceOutputTail
// bytes, reaped by the init's reaper. It answers at once. A command that is not found or
// cannot be executed is not an error: the run is recorded as exited with 127 or 126 and a
// note in its output, as exec reports it.
func (s *server) startService(req wireRequest) wireResponse {
	if len(req.Cmd) == 0 || req.Cmd[0] == "" {
		return wireResponse{Code: berth.EInvalidRequest, Message: "empty cmd"}
	}
	env, err := mergeEnv(s.env(), req.Env)
	if err != nil {
		return errResponse(err)
	}
	s.svc.mu.Lock()
	defer s.svc.mu.Unlock()
	if cur := s.svc.cur; cur != nil && !cur.exited {
		return wireResponse{Code: berth.EServiceRunning, Message: "the sandbox already runs its service"}
	}
	run := &serviceRun{out: &tail{}}
	argv0, err := lookPath(req.Cmd[0], s.cfg.Path, s.cfg.Cwd)
	if err != nil {
		fmt.Fprintf(run.out, "sandbox: %s: command not found\n", req.Cmd[0])
		run.exited, run.exitCode = true, 127
		s.svc.cur = run
		return wireResponse{}
	}
	devNull, err := os.Open(os.DevNull)
	if err != nil {
		return errResponse(fmt.Errorf("open %s: %w", os.DevNull, err))
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		devNull.Close()
		return errResponse(fmt.Errorf("output pipe: %w", err))
	}
	_, done, err := s.reaper.start(argv0, req.Cmd, &os.ProcAttr{
		Dir:   s.cfg.Cwd,
		Env:   env,
		Files: []*os.File{devNull, outW, outW},
		// Its own process group: exec timeouts, which kill their command's group, never hit it.
		Sys: &syscall.SysProcAttr{Setpgid: true},
	})
	devNull.Close()
	outW.Close()
	if err != nil {
		outR.Close()
		code := 126
		if errors.Is(err, os.ErrNotExist) {
			code = 127
		}
		fmt.Fprintf(run.out, "sandbox: %s: %v\n", req.Cmd[0], err)
		run.exited, run.exitCode = true, code
		s.svc.cur = run
		return wireResponse{}
	}
	capture := newCapture(outR, run.out)
	go capture.run()
	s.svc.cur = run
	go func() {
		ws := <-done
		// What the command wrote before it exited is in the pipe: take it before saying
		// "exited", so a status right after shows the reason (APP-2).
		capture.finish()
		s.svc.mu.Lock()
		run.exited, run.exitCode = true, exitCode(ws)
		s.svc.mu.Unlock()
		s.log.Info("service exited", "exit_code", exitCode(ws))
	}()
	return wireResponse{}
}

// serviceStatus answers the state of the latest run.
func (s *server) serviceStatus() wireResponse {
	s.svc.mu.Lock()
	defer s.svc.mu.Unlock()
	cur := s.svc.cur
	if cur == nil {
		return wireResponse{}
	}
	return wireResponse{Started: true, Exited: cur.exited, ExitCode: cur.exitCode, Output: cur.out.String()}
}

// dialApp connects to 127.0.0.1:req.Port inside the sandbox, answers, and on success carries
// bytes both ways between c (whose buffered reader is br) and the app until both directions
// are done. Refusal: service_exited (with exit code and output tail) when the service has
// exited, else app_unreachable.
func (s *server) dialApp(c net.Conn, br *bufio.Reader, req wireRequest) {
	if req.Port < 1 || req.Port > 65535 {
		writeResponse(c, wireResponse{Code: berth.EInvalidRequest, Message: fmt.Sprintf("port %d is not in 1..65535", req.Port)})
		return
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(req.Port))
	app, err := net.DialTimeout("tcp", addr, dialTimeout)
	if err != nil {
		writeResponse(c, s.unreachable(req.Port, err))
		return
	}
	defer app.Close()
	if err := writeResponse(c, wireResponse{}); err != nil {
		return
	}
	splice(c, br, app)
}

// unreachable explains a failed dial: the service's exit wins over the socket error.
func (s *server) unreachable(port int, err error) wireResponse {
	s.svc.mu.Lock()
	defer s.svc.mu.Unlock()
	cur := s.svc.cur
	switch {
	case cur != nil && cur.exited:
		return wireResponse{Code: berth.EServiceExited, ExitCode: cur.exitCode,
			Message: berth.ServiceExitedMessage(cur.exitCode, cur.out.String())}
	case cur == nil:
		return wireResponse{Code: berth.EUpstream,
			Message: fmt.Sprintf("nothing answers on port %d inside the sandbox and no service was started: %v", port, cause(err))}
	}
	return wireResponse{Code: berth.EUpstream,
		Message: fmt.Sprintf("nothing answers on port %d inside the sandbox: %v", port, cause(err))}
}

// cause drops the "dial tcp 127.0.0.1:N:" of a dial error: "connect: connection refused".
func cause(err error) error {
	if u := errors.Unwrap(err); u != nil {
		return u
	}
	return err
}

// splice copies a→b and b→a (reading a through ar). When one direction reaches EOF it
// half-closes its destination (CloseWrite), so an HTTP/1.x client that ends its request with a
// half-close still gets the answer; a failed direction closes both connections, which ends
// the other. It returns when both directions are done.
func splice(a net.Conn, ar io.Reader, b net.Conn) {
	var wg sync.WaitGroup
	pipe := func(dst net.Conn, src io.Reader) {
		if _, err := io.Copy(dst, src); err != nil {
			a.Close()
			b.Close()
			return
		}
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			if cw.CloseWrite() == nil {
				return
			}
		}
		a.Close()
		b.Close()
	}
	wg.Go(func() { pipe(b, ar) })
	wg.Go(func() { pipe(a, b) })
	wg.Wait()
}

// mergeEnv returns base with extra added (extra wins for a name in both), sorted by name for
// a stable environment. Names must be non-empty and hold no '=' or NUL; values no NUL.
func mergeEnv(base []string, extra map[string]string) ([]string, error) {
	m := make(map[string]string, len(base)+len(extra))
	for _, kv := range base {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	for k, v := range extra {
		if err := validEnv(k, v); err != nil {
			return nil, err
		}
		m[k] = v
	}
	env := make([]string, 0, len(m))
	for k, v := range m {
		env = append(env, k+"="+v)
	}
	sort.Strings(env)
	return env, nil
}

func validEnv(k, v string) error {
	if k == "" || strings.ContainsAny(k, "=\x00") || strings.Contains(v, "\x00") {
		return berth.Errorf(berth.EInvalidRequest, "bad environment variable %q: names must be non-empty without '=' or NUL, values without NUL", k)
	}
	return nil
}

// tail keeps the last berth.ServiceOutputTail bytes written to it. Safe for concurrent use.
type tail struct {
	mu  sync.Mutex
	buf []byte
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := len(p)
	if len(p) >= berth.ServiceOutputTail {
		t.buf = append(t.buf[:0], p[len(p)-berth.ServiceOutputTail:]...)
		return n, nil
	}
	if over := len(t.buf) + len(p) - berth.ServiceOutputTail; over > 0 {
		t.buf = t.buf[:copy(t.buf, t.buf[over:])]
	}
	t.buf = append(t.buf, p...)
	return n, nil
}

// String returns the kept bytes; a multi-byte character cut at the start is dropped.
func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.ToValidUTF8(string(t.buf), "")
}

// capture copies a service's output pipe into its tail until EOF. finish, called once the
// service has exited, takes what is already in the pipe without waiting for EOF (a process
// the service left in the background may hold the pipe) and then discards the rest.
type capture struct {
	f     *os.File
	out   *tail
	final chan struct{} // closed once the run's output is complete
}

func newCapture(f *os.File, out *tail) *capture {
	return &capture{f: f, out: out, final: make(chan struct{})}
}

func (c *capture) run() {
	defer c.f.Close()
	b := make([]byte, 32<<10)
	keep := func(p []byte) { c.out.Write(p) }
	for {
		n, err := c.f.Read(b)
		keep(b[:n])
		if err == nil {
			continue
		}
		eof := true
		if errors.Is(err, os.ErrDeadlineExceeded) {
			eof = drainPipe(c.f, b, keep)
		}
		close(c.final)
		if !eof {
			io.Copy(io.Discard, c.f)
		}
		return
	}
}

func (c *capture) finish() {
	c.f.SetReadDeadline(time.Now())
	<-c.final
}
