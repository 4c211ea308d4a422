package pgtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// errNoBinaries means no PostgreSQL server binaries were found on this machine.
var errNoBinaries = errors.New("no PostgreSQL server binaries (initdb, postgres) in $PATH or /usr/lib/postgresql/*/bin; " +
	"install them (Debian/Ubuntu: apt-get install -y postgresql) or set " + EnvURL + " to a server the tests may create databases on")

// errPortBusy means the postmaster could not bind its port (another process took it).
var errPortBusy = errors.New("port already in use")

// dirPrefix starts the name of every temporary cluster directory, so stale ones can be found.
const dirPrefix = "berth-pgtest-"

// Timeouts of the server's life cycle. They bound waits on a sick machine; no test asserts them.
const (
	readyTimeout = 60 * time.Second // postmaster start until it accepts connections
	stopTimeout  = 60 * time.Second // fast shutdown until the postmaster exits
)

// server is one throwaway PostgreSQL cluster in a temporary directory: its postmaster runs as a
// child of the test process (so its PID is ours, and the kernel sends it SIGQUIT if the test
// process dies first: Pdeathsig).
type server struct {
	bin     string              // directory holding initdb and postgres
	dir     string              // temporary root, removed by remove
	data    string              // data directory (dir/data)
	sock    string              // unix socket directory (dir/sock)
	logPath string              // postmaster stderr (dir/postgres.log)
	port    int                 // TCP port on 127.0.0.1, kept across restarts
	cred    *syscall.Credential // the postgres OS user when the test runs as root, else nil

	cmd  *exec.Cmd     // running postmaster, nil while stopped
	done chan struct{} // closed when cmd has exited
}

// findBin returns the directory of the PostgreSQL server binaries: the one of initdb in $PATH
// if it also holds postgres, else the newest /usr/lib/postgresql/<version>/bin.
func findBin() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real // e.g. /usr/local/bin/initdb → /usr/lib/postgresql/15/bin/initdb
		}
		dir := filepath.Dir(p)
		if isFile(filepath.Join(dir, "postgres")) {
			return dir, nil
		}
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	version := func(p string) int {
		v, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(p))))
		return v
	}
	slices.SortFunc(matches, func(a, b string) int { return version(b) - version(a) })
	for _, m := range matches {
		if dir := filepath.Dir(m); isFile(filepath.Join(dir, "postgres")) {
			return dir, nil
		}
	}
	return "", errNoBinaries
}

func isFile(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular()
}

// newServer creates a temporary directory, runs initdb in it and starts the postmaster on a free
// port of 127.0.0.1. initdb refuses to run as root, so as root every server process runs as the
// postgres OS user, which then owns the directory.
func newServer() (*server, error) {
	bin, err := findBin()
	if err != nil {
		return nil, err
	}
	sweepStale()
	dir, err := os.MkdirTemp("", dirPrefix)
	if err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	s := &server{
		bin: bin, dir: dir, data: filepath.Join(dir, "data"), sock: filepath.Join(dir, "sock"),
		logPath: filepath.Join(dir, "postgres.log"),
	}
	if err := s.prepare(); err != nil {
		s.remove()
		return nil, err
	}
	for attempt := 0; ; attempt++ {
		if s.port, err = freePort(); err != nil {
			s.remove()
			return nil, err
		}
		err = s.start()
		if err == nil {
			return s, nil
		}
		if !errors.Is(err, errPortBusy) || attempt == 4 {
			s.remove()
			return nil, err
		}
	}
}

// prepare writes the owner file, sets up ownership for a root test and runs initdb.
func (s *server) prepare() error {
	if err := os.WriteFile(filepath.Join(s.dir, "owner"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	if err := os.Mkdir(s.sock, 0o700); err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return fmt.Errorf("pgtest: running as root needs the postgres OS user to run the server: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		s.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}
		for _, p := range []string{s.dir, s.sock} {
			if err := os.Chown(p, uid, gid); err != nil {
				return fmt.Errorf("pgtest: %w", err)
			}
		}
	}
	// A linguistic default collation (ICU en-US, as most production databases have) makes the
	// store tests prove that ordering and prefix filters do not depend on it. Fall back to the
	// plain C locale where the server lacks ICU.
	base := []string{"-D", s.data, "-U", "postgres", "--auth=trust", "--encoding=UTF8", "--locale=C", "--no-sync"}
	out, err := s.run("initdb", append(base, "--locale-provider=icu", "--icu-locale=en-US")...)
	if err != nil {
		_ = os.RemoveAll(s.data)
		if out2, err2 := s.run("initdb", base...); err2 != nil {
			return fmt.Errorf("pgtest: initdb: %w\n%s\n(with ICU: %s)", err2, out2, out)
		}
	}
	return nil
}

// run runs one of the server binaries to completion and returns its combined output.
func (s *server) run(name string, args ...string) ([]byte, error) {
	cmd := exec.Command(filepath.Join(s.bin, name), args...)
	cmd.Dir = s.dir
	cmd.Env = append(os.Environ(), "HOME="+s.dir, "LC_ALL=C")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred, Pdeathsig: syscall.SIGKILL}
	return cmd.CombinedOutput()
}

// start launches the postmaster on s.port and waits until it accepts connections.
func (s *server) start() error {
	logf, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	defer logf.Close()
	logStart, _ := logf.Seek(0, 2)
	cmd := exec.Command(filepath.Join(s.bin, "postgres"), "-D", s.data, "-p", strconv.Itoa(s.port),
		"-c", "listen_addresses=127.0.0.1",
		"-c", "unix_socket_directories="+s.sock,
		"-c", "max_connections=200",
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
		"-c", "shared_buffers=32MB",
	)
	cmd.Dir = s.dir
	cmd.Env = append(os.Environ(), "HOME="+s.dir, "LC_ALL=C")
	cmd.Stdout, cmd.Stderr = logf, logf
	// Setpgid keeps a terminal's Ctrl-C away from the postmaster: the test process stops it.
	// Pdeathsig (SIGQUIT: immediate shutdown) stops it if the test process dies first.
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred, Setpgid: true, Pdeathsig: syscall.SIGQUIT}
	started := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		// Pdeathsig fires when the thread that forked the child ends, not the process: keep
		// this goroutine on its own thread for as long as the postmaster lives.
		runtime.LockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		_ = cmd.Wait()
		close(done)
	}()
	if err := <-started; err != nil {
		return fmt.Errorf("pgtest: start postgres: %w", err)
	}
	s.cmd, s.done = cmd, done
	if err := s.waitReady(); err != nil {
		s.stop()
		tail := s.logSince(logStart)
		if strings.Contains(tail, "could not bind") || strings.Contains(tail, "already in use") {
			return fmt.Errorf("pgtest: port %d: %w\n%s", s.port, errPortBusy, tail)
		}
		return fmt.Errorf("pgtest: postgres did not become ready: %w\n%s", err, tail)
	}
	return nil
}

// waitReady polls until the postmaster accepts a connection, exits or readyTimeout passes.
func (s *server) waitReady() error {
	deadline := time.Now().Add(readyTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		conn, err := pgx.Connect(ctx, s.url("postgres"))
		if err == nil {
			err = conn.Ping(ctx)
			conn.Close(ctx)
		}
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-s.done:
			return errors.New("postgres exited")
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %v: %w", readyTimeout, err)
		}
	}
}

// stop shuts the postmaster down (fast shutdown: SIGINT to the PID we started, then SIGQUIT and
// SIGKILL if it lingers) and waits for it to exit. Stopping a stopped server does nothing.
func (s *server) stop() error {
	if s.cmd == nil {
		return nil
	}
	defer func() { s.cmd, s.done = nil, nil }()
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGQUIT, syscall.SIGKILL} {
		_ = s.cmd.Process.Signal(sig)
		select {
		case <-s.done:
			return nil
		case <-time.After(stopTimeout / 3):
		}
	}
	return fmt.Errorf("pgtest: postgres pid %d did not exit", s.cmd.Process.Pid)
}

// remove stops the server and deletes its directory.
func (s *server) remove() error {
	err := s.stop()
	if rmErr := os.RemoveAll(s.dir); rmErr != nil && err == nil {
		err = fmt.Errorf("pgtest: %w", rmErr)
	}
	return err
}

// url returns the connection URL of database db as the superuser.
func (s *server) url(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", s.port, db)
}

// logSince returns the postmaster log written after offset.
func (s *server) logSince(offset int64) string {
	b, err := os.ReadFile(s.logPath)
	if err != nil || int64(len(b)) < offset {
		return ""
	}
	return string(bytes.TrimSpace(b[offset:]))
}

// freePort returns a TCP port of 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgtest: free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// sweepStale removes cluster directories left by test processes that died before cleaning up
// (their postmaster got SIGQUIT through Pdeathsig). A directory is removed only when the test
// process that made it and the postmaster recorded in it are both gone.
func sweepStale() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), dirPrefix+"*"))
	for _, d := range dirs {
		owner := readPID(filepath.Join(d, "owner")) // 0 while being created, or not ours
		if owner == 0 || alive(owner) || alive(readPID(filepath.Join(d, "data", "postmaster.pid"))) {
			continue
		}
		_ = os.RemoveAll(d)
	}
}

// readPID returns the number on the first line of path, or 0.
func readPID(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, _ := strconv.Atoi(strings.TrimSpace(line))
	return pid
}

// alive reports whether process pid exists.
func alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
