package process

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth"
)

// initArg is argv[1] of a process that must become a sandbox's init.
const initArg = "__berth-sandbox-init"

// probeToken is what "init -probe" prints, proving the binary calls MaybeRunInit.
const probeToken = "berth-sandbox-init-ok"

// The init inherits two pipes from the runtime: it blocks on goFD until the runtime has put it
// in its cgroup, and reports "ok" (or "error: …") on readyFD once it serves.
const (
	goFD    = 3
	readyFD = 4
)

// MaybeRunInit must be the first call in main() and in TestMain of any package that starts
// sandboxes: when os.Args say this process is a sandbox init, it runs the init and exits the
// process; otherwise it returns at once.
func MaybeRunInit() {
	if len(os.Args) < 2 || os.Args[1] != initArg {
		return
	}
	os.Exit(runInit(os.Args[2:]))
}

// volumeName is where a sandbox finds its volume: /tmp/volume with isolation, the link
// "volume" in its working directory without.
const volumeName = "volume"

// initConfig is the init's command line (built by Runtime.Start).
type initConfig struct {
	id       string // sandbox id, also the hostname
	dir      string // <Dir>/<id>: holds init.sock and root/
	hide     string // the runtime's Dir, covered by an empty tmpfs inside the sandbox
	path     string // PATH for exec'd commands
	isolated bool
	probe    bool
	volume   string // host directory of a volume, seen at /tmp/volume (POOL-2); "" for none
	sock     string // the socket to serve on ("" = <dir>/init.sock)
}

func (c initConfig) args() []string {
	return []string{initArg, "-id=" + c.id, "-dir=" + c.dir, "-hide=" + c.hide, "-path=" + c.path,
		fmt.Sprintf("-isolated=%t", c.isolated), "-volume=" + c.volume, "-sock=" + c.sock}
}

func runInit(args []string) int {
	var c initConfig
	fl := flag.NewFlagSet(initArg, flag.ContinueOnError)
	fl.StringVar(&c.id, "id", "", "sandbox id")
	fl.StringVar(&c.dir, "dir", "", "sandbox directory")
	fl.StringVar(&c.hide, "hide", "", "directory to hide inside the sandbox")
	fl.StringVar(&c.path, "path", defaultPath, "PATH of commands")
	fl.BoolVar(&c.isolated, "isolated", false, "set up namespaces")
	fl.BoolVar(&c.probe, "probe", false, "print the probe token and exit")
	fl.StringVar(&c.volume, "volume", "", "host directory of the sandbox's volume")
	fl.StringVar(&c.sock, "sock", "", "socket to serve on")
	if err := fl.Parse(args); err != nil {
		return 2
	}
	if c.probe {
		fmt.Println(probeToken)
		return 0
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("sandbox", c.id)
	// Die with the agent: the sandbox cannot outlive the runtime that would stop it. Set here,
	// not through SysProcAttr.Pdeathsig, whose parent check misfires in a new PID namespace
	// (getppid is 0 there). Should the agent already be gone, the read below sees EOF.
	// With isolation SIGKILL suffices (PID 1's death empties its namespace); without, the
	// init takes SIGTERM and kills its tree first, or the tree would be orphaned.
	deathSig := unix.SIGKILL
	if !c.isolated {
		deathSig = unix.SIGTERM
		term := make(chan os.Signal, 1)
		signal.Notify(term, unix.SIGTERM)
		go func() {
			<-term
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			killTree(ctx, os.Getpid(), func() error { os.Exit(1); return nil }, func() bool { return false })
		}()
	}
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(deathSig), 0, 0, 0); err != nil {
		log.Error("set parent death signal", "err", err)
		return 1
	}
	goPipe, ready := os.NewFile(goFD, "go"), os.NewFile(readyFD, "ready")
	var b [1]byte
	if n, _ := goPipe.Read(b[:]); n != 1 {
		log.Error("runtime gave up before the init started")
		return 1
	}
	goPipe.Close()

	l, cwd, err := setupInit(c, log)
	if err != nil {
		fmt.Fprintf(ready, "error: %v\n", err)
		return 1
	}
	s := &server{
		cwd:      cwd,
		path:     c.path,
		isolated: c.isolated,
		log:      log,
		reaper:   newReaper(),
	}
	go s.reaper.run()
	fmt.Fprintln(ready, "ok")
	ready.Close()
	log.Info("sandbox init serving", "isolated", c.isolated, "pid", os.Getpid())
	err = s.serve(l)
	log.Error("sandbox init stopped serving", "err", err)
	return 1
}

// setupInit prepares the sandbox from inside and returns the bound socket and the directory
// commands run in. With isolation (we are PID 1 of fresh PID, mount, UTS, IPC and maybe
// network namespaces) it makes every mount private before mounting anything, so nothing leaks
// to the host; mounts a fresh /proc; sets the hostname to the id; brings up lo; binds the
// socket; covers the runtime's Dir with an empty tmpfs (no sandbox can reach another's socket
// or files); and bind-mounts <dir>/root over /tmp. Either way it becomes a child subreaper, so
// orphans of exec'd commands are reaped here (and, without a PID namespace, stay in its tree
// where Measure and Stop find them).
func setupInit(c initConfig, log *slog.Logger) (net.Listener, string, error) {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return nil, "", fmt.Errorf("set child subreaper: %w", err)
	}
	root := filepath.Join(c.dir, "root")
	sock := c.sock
	if sock == "" {
		sock = filepath.Join(c.dir, "init.sock")
	}
	if !c.isolated {
		// Without a mount namespace the volume is a link in the sandbox's directory.
		if c.volume != "" {
			if err := os.Symlink(c.volume, filepath.Join(root, volumeName)); err != nil && !errors.Is(err, os.ErrExist) {
				return nil, "", fmt.Errorf("link volume: %w", err)
			}
		}
		l, err := listen(sock)
		return l, root, err
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return nil, "", fmt.Errorf("make mounts private: %w", err)
	}
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return nil, "", fmt.Errorf("mount /proc: %w", err)
	}
	host := c.id
	if len(host) > 64 {
		host = host[:64]
	}
	if err := unix.Sethostname([]byte(host)); err != nil {
		return nil, "", fmt.Errorf("set hostname: %w", err)
	}
	if err := loopbackUp(); err != nil {
		log.Warn("cannot bring up lo inside the sandbox", "err", err)
	}
	l, err := listen(sock)
	if err != nil {
		return nil, "", err
	}
	// Hold root by descriptor: the tmpfs below may cover its path (when Dir is under /tmp the
	// bind-mount hides it anyway).
	rootFD, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, "", fmt.Errorf("open %s: %w", root, err)
	}
	defer unix.Close(rootFD)
	volFD := -1
	if c.volume != "" {
		// Held by descriptor too: the volume may live under a path the tmpfs below hides.
		if volFD, err = unix.Open(c.volume, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err != nil {
			return nil, "", fmt.Errorf("open volume %s: %w", c.volume, err)
		}
		defer unix.Close(volFD)
	}
	if c.hide != "" && c.hide != "/" {
		if err := unix.Mount("tmpfs", c.hide, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=64k,mode=0755"); err != nil {
			return nil, "", fmt.Errorf("hide %s: %w", c.hide, err)
		}
	}
	if err := unix.Mount(fmt.Sprintf("/proc/self/fd/%d", rootFD), "/tmp", "", unix.MS_BIND, ""); err != nil {
		return nil, "", fmt.Errorf("bind %s on /tmp: %w", root, err)
	}
	if volFD >= 0 {
		// The mount point is made inside the sandbox's own /tmp, never on the host's root;
		// the bind exists only in this mount namespace, so removing the sandbox's directory
		// later cannot reach the volume's data.
		mnt := "/tmp/" + volumeName
		if err := os.MkdirAll(mnt, 0o755); err != nil {
			return nil, "", fmt.Errorf("volume mount point: %w", err)
		}
		if err := unix.Mount(fmt.Sprintf("/proc/self/fd/%d", volFD), mnt, "", unix.MS_BIND, ""); err != nil {
			return nil, "", fmt.Errorf("bind volume on %s: %w", mnt, err)
		}
	}
	return l, "/tmp", nil
}

func listen(sock string) (net.Listener, error) {
	os.Remove(sock)
	l, err := net.Listen("unix", sock)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", sock, err)
	}
	return l, nil
}

// loopbackUp sets IFF_UP on lo of the sandbox's network namespace.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return err
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	return unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr)
}

// server is the init's request loop (see the wire protocol in wire.go).
type server struct {
	cwd      string // where commands run: /tmp with isolation, <dir>/root without
	path     string // PATH of commands
	isolated bool
	log      *slog.Logger
	reaper   *reaper
	svc      service // the sandbox's app service (APP-1)
}

func (s *server) serve(l net.Listener) error {
	for {
		c, err := l.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return err
		}
		go s.handle(c)
	}
}

func (s *server) handle(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	line, err := readLine(br, maxHeaderBytes)
	if err != nil {
		return
	}
	var req wireRequest
	if err := json.Unmarshal(line, &req); err != nil {
		writeResponse(c, wireResponse{Code: berth.EInvalidRequest, Message: "bad request header"}, nil)
		return
	}
	var resp wireResponse
	var payload []byte
	switch req.Op {
	case opPing:
	case opExec:
		ctx, cancel := context.WithCancel(context.Background())
		// The runtime sends nothing after the header; EOF means it gave up.
		go func() { br.ReadByte(); cancel() }()
		resp = s.exec(ctx, req)
		cancel()
	case opWrite:
		resp = s.writeFile(req, br)
	case opRead:
		resp, payload = s.readFile(req)
	case opServe:
		resp = s.startService(req)
	case opStatus:
		resp = s.serviceStatus()
	case opDial:
		s.dialApp(c, br, req) // answers itself, then carries the app's bytes
		return
	default:
		resp = wireResponse{Code: berth.EInvalidRequest, Message: "unknown op " + req.Op}
	}
	writeResponse(c, resp, payload)
}

// writeFile writes exactly req.Size bytes from body to req.Path, creating parent directories.
func (s *server) writeFile(req wireRequest, body io.Reader) wireResponse {
	if req.Size < 0 || req.Size > maxFileBytes {
		return wireResponse{Code: berth.ETooLarge, Message: fmt.Sprintf("file over %d bytes", maxFileBytes)}
	}
	data := make([]byte, req.Size)
	if _, err := io.ReadFull(body, data); err != nil {
		return wireResponse{Code: berth.EInvalidRequest, Message: "short body: " + err.Error()}
	}
	if err := os.MkdirAll(filepath.Dir(req.Path), 0o755); err != nil {
		return fileErr(req.Path, err)
	}
	if st, err := os.Stat(req.Path); err == nil && !st.Mode().IsRegular() {
		return notRegular(req.Path, st)
	}
	// O_NONBLOCK: a FIFO swapped in after the check fails the open instead of hanging it.
	f, err := os.OpenFile(req.Path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|unix.O_NONBLOCK, 0o644)
	if err != nil {
		return fileErr(req.Path, err)
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil {
		return fileErr(req.Path, err)
	} else if !st.Mode().IsRegular() {
		return notRegular(req.Path, st)
	}
	if _, err := f.Write(data); err != nil {
		return fileErr(req.Path, err)
	}
	if err := f.Close(); err != nil {
		return fileErr(req.Path, err)
	}
	return wireResponse{}
}

// notRegular refuses anything but a regular file: a FIFO or device would hang or never end.
func notRegular(path string, st os.FileInfo) wireResponse {
	if st.IsDir() {
		return wireResponse{Code: berth.EInvalidRequest, Message: path + " is a directory"}
	}
	return wireResponse{Code: berth.EInvalidRequest, Message: fmt.Sprintf("%s is not a regular file (%s)", path, st.Mode().Type())}
}

// readFile returns the content of req.Path, refusing directories and files over the cap.
func (s *server) readFile(req wireRequest) (wireResponse, []byte) {
	if st, err := os.Stat(req.Path); err != nil {
		return fileErr(req.Path, err), nil
	} else if !st.Mode().IsRegular() {
		return notRegular(req.Path, st), nil
	}
	// O_NONBLOCK: a FIFO swapped in after the check fails instead of hanging the open.
	f, err := os.OpenFile(req.Path, os.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		return fileErr(req.Path, err), nil
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil {
		return fileErr(req.Path, err), nil
	} else if !st.Mode().IsRegular() {
		return notRegular(req.Path, st), nil
	}
	data, err := io.ReadAll(io.LimitReader(f, maxFileBytes+1))
	if err != nil {
		return fileErr(req.Path, err), nil
	}
	if len(data) > maxFileBytes {
		return wireResponse{Code: berth.ETooLarge, Message: fmt.Sprintf("%s is over %d bytes", req.Path, maxFileBytes)}, nil
	}
	return wireResponse{Size: int64(len(data))}, data
}

// fileErr maps a file-system error to a berth code: missing → not_found, wrong kind of path →
// invalid_request, denied → forbidden, anything else (I/O error, disk full, a /proc file that
// refuses) conflict: the state of the sandbox's file system, never a server bug (API-2).
func fileErr(path string, err error) wireResponse {
	code := berth.EConflict
	switch {
	case errors.Is(err, os.ErrNotExist):
		code = berth.ENotFound
	case errors.Is(err, unix.EISDIR), errors.Is(err, unix.ENOTDIR), errors.Is(err, unix.EROFS):
		code = berth.EInvalidRequest
	case errors.Is(err, os.ErrPermission):
		code = berth.EForbidden
	}
	return wireResponse{Code: code, Message: err.Error()}
}
