package process

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/agent/runtime/sbinit"
)

// initArg is argv[1] of a process that must become a sandbox's init.
const initArg = "__berth-sandbox-init"

// probeToken is what "init -probe" prints, proving the binary calls MaybeRunInit.
const probeToken = "berth-sandbox-init-ok"

// The init inherits two pipes from the runtime: it blocks on goFD until the runtime has put it
// in its cgroups, and reports "ok" (or "error: …") on readyFD once it serves. An isolated init
// also inherits lockFD, its uid lease's locked file (uid.go), so the lease lasts as long as
// the sandbox does.
const (
	goFD    = 3
	readyFD = 4
	lockFD  = 5
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

// initConfig is the init's command line (built by Runtime.Start). An isolated init runs in
// two stages: stage 1, root inside fresh namespaces, builds the sandbox and drops privileges
// for good by exec'ing stage 2 (listenFD set), which only serves.
type initConfig struct {
	id       string // sandbox id, also the hostname
	dir      string // <Dir>/<id>: holds init.sock, mnt/ (isolated) or root/ (insecure)
	path     string // PATH for exec'd commands
	isolated bool
	probe    bool   // print probeToken and exit
	hold     bool   // block until stdin ends (the volume's user namespace, mount.go)
	volume   string // host directory of a volume, seen at /tmp/volume (POOL-2); "" for none
	sock     string // the socket to serve on ("" = <dir>/init.sock)

	// Isolation only.
	rootfs   string // JSON of the rootfs.Layout to build the sandbox's root from
	uid      int    // the sandbox's uid and gid
	tmpMiB   int64  // size of /tmp
	shmMiB   int64  // size of /dev/shm
	listenFD int    // stage 2: the socket stage 1 bound; -1 in stage 1
}

func (c initConfig) args() []string {
	return []string{initArg, "-id=" + c.id, "-dir=" + c.dir, "-path=" + c.path,
		fmt.Sprintf("-isolated=%t", c.isolated), "-volume=" + c.volume, "-sock=" + c.sock,
		"-rootfs=" + c.rootfs, fmt.Sprintf("-uid=%d", c.uid), fmt.Sprintf("-tmp-mib=%d", c.tmpMiB),
		fmt.Sprintf("-shm-mib=%d", c.shmMiB)}
}

func parseInitArgs(args []string) (initConfig, error) {
	var c initConfig
	fl := flag.NewFlagSet(initArg, flag.ContinueOnError)
	fl.StringVar(&c.id, "id", "", "sandbox id")
	fl.StringVar(&c.dir, "dir", "", "sandbox directory")
	fl.StringVar(&c.path, "path", sbinit.DefaultPath, "PATH of commands")
	fl.BoolVar(&c.isolated, "isolated", false, "set up namespaces")
	fl.BoolVar(&c.probe, "probe", false, "print the probe token and exit")
	fl.BoolVar(&c.hold, "hold", false, "wait until stdin ends")
	fl.StringVar(&c.volume, "volume", "", "host directory of the sandbox's volume")
	fl.StringVar(&c.sock, "sock", "", "socket to serve on")
	fl.StringVar(&c.rootfs, "rootfs", "", "root file system layout (JSON)")
	fl.IntVar(&c.uid, "uid", -1, "the sandbox's uid and gid")
	fl.Int64Var(&c.tmpMiB, "tmp-mib", 16, "size of /tmp in MiB")
	fl.Int64Var(&c.shmMiB, "shm-mib", 16, "size of /dev/shm in MiB")
	fl.IntVar(&c.listenFD, "listen-fd", -1, "stage 2: the bound socket")
	return c, fl.Parse(args)
}

func runInit(args []string) int {
	c, err := parseInitArgs(args)
	if err != nil {
		return 2
	}
	switch {
	case c.probe:
		fmt.Println(probeToken)
		return 0
	case c.hold:
		io.Copy(io.Discard, os.Stdin)
		return 0
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("sandbox", c.id)
	if c.listenFD >= 0 {
		return serveIsolated(c, log)
	}
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
	// A session keyring of its own: the agent's (the operator's login session's, under a
	// shell) would let the sandbox read and change the operator's kernel keys, whatever uid
	// it drops to (ISO-1; the escape suite's "operator's session keyring"). A keyring, like
	// every credential, belongs to a thread: the join and stage 1's execve (dropAndExec) must
	// run on one thread, or the exec'd stage 2 keeps the keyring of the thread that exec'd —
	// the operator's. Without the lock the goroutine could move to another thread when a
	// syscall blocked under load; the escape suite then found the operator's key (once, in a
	// full test run on a busy machine). The lock is never undone: the exec ends this process.
	runtime.LockOSThread()
	if err := joinAnonymousKeyring(); err != nil {
		fmt.Fprintf(ready, "error: own session keyring: %v\n", err)
		return 1
	}

	if c.isolated {
		// On success this never returns: stage 2 replaces the process and reports ready.
		err := setupIsolated(c)
		fmt.Fprintf(ready, "error: %v\n", err)
		return 1
	}
	l, cwd, err := setupInsecure(c)
	if err != nil {
		fmt.Fprintf(ready, "error: %v\n", err)
		return 1
	}
	cfg := sbinit.Config{Cwd: cwd, Path: c.path, Log: log,
		// Without a root of its own, the files API reaches the sandbox's /tmp only: its
		// private directory, mapped onto /tmp (ISO-3 holds for that directory alone).
		Files: sbinit.FileRoot{Dir: cwd, Prefix: "/tmp"},
		Env:   []string{"TMPDIR=" + cwd}, // /tmp is the host's
	}
	fmt.Fprintln(ready, "ok")
	ready.Close()
	log.Info("sandbox init serving", "isolated", false, "pid", os.Getpid())
	err = sbinit.Serve(l, cfg)
	log.Error("sandbox init stopped serving", "err", err)
	return 1
}

// setupInsecure prepares an unisolated sandbox: a plain process tree whose working directory
// is <dir>/root. The init becomes a child subreaper, so orphans of exec'd commands are reaped
// here and stay in its tree, where Measure and Stop find them. The volume is a link in the
// working directory.
func setupInsecure(c initConfig) (net.Listener, string, error) {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return nil, "", fmt.Errorf("set child subreaper: %w", err)
	}
	root := filepath.Join(c.dir, rootDir)
	if c.volume != "" {
		if err := os.Symlink(c.volume, filepath.Join(root, volumeName)); err != nil && !errors.Is(err, os.ErrExist) {
			return nil, "", fmt.Errorf("link volume: %w", err)
		}
	}
	l, err := listen(c.socket())
	return l, root, err
}

// socket is the path the init serves on.
func (c initConfig) socket() string {
	if c.sock != "" {
		return c.sock
	}
	return filepath.Join(c.dir, sockFile)
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

// joinAnonymousKeyring replaces the process's session keyring with a new anonymous one
// (keyctl KEYCTL_JOIN_SESSION_KEYRING with a NULL name), as container runtimes do.
func joinAnonymousKeyring() error {
	_, _, errno := unix.Syscall(unix.SYS_KEYCTL, unix.KEYCTL_JOIN_SESSION_KEYRING, 0, 0)
	if errno != 0 {
		return errno
	}
	return nil
}
