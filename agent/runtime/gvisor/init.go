package gvisor

import (
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/agent/runtime/sbinit"
)

// argv[1] of this binary when it runs inside a gVisor sandbox.
const (
	initArg  = "__berth-gvisor-init" // the sandbox's init (its container process)
	relayArg = "__berth-gvisor-relay"
)

// probeToken is what the init prints in probe mode, proving a sandbox ran it.
const probeToken = "berth-gvisor-init-ok"

// Paths inside every sandbox.
const (
	berthDir = "/.berth"                   // the init directory, read-only
	runDir   = "/.berth/run"               // a small tmpfs for the init's socket
	initSock = "/.berth/run/init.sock"     // the init's socket, reached through relays
	initPath = berthDir + "/berth"         // the init binary
	libDir   = berthDir + "/lib"           // its dynamic loader and libraries, when it has any
	loader   = berthDir + "/lib/loader.so" // the dynamic loader, renamed
)

// MaybeRunInit must be the first call in main() and in TestMain of any package that starts
// gVisor sandboxes: when os.Args say this process is a sandbox's init or a relay, it runs it
// and exits the process; otherwise it returns at once.
func MaybeRunInit() {
	if len(os.Args) < 2 {
		return
	}
	switch os.Args[1] {
	case initArg:
		os.Exit(runInit(os.Args[2:]))
	case relayArg:
		if len(os.Args) != 3 {
			fmt.Fprintln(os.Stderr, "berth relay: want one socket path")
			os.Exit(2)
		}
		os.Exit(sbinit.Relay(os.Args[2]))
	}
}

// runInit is the container's process: it binds the init socket, says "ok" on stdout (the
// runtime waits for that line) and serves until the sandbox ends. Commands run in /tmp.
func runInit(args []string) int {
	fl := flag.NewFlagSet(initArg, flag.ContinueOnError)
	probe := fl.Bool("probe", false, "print the probe token and exit")
	if err := fl.Parse(args); err != nil {
		return 2
	}
	if *probe {
		fmt.Println(probeToken)
		return 0
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	// Not dumpable: the guest's processes (the same uid) cannot ptrace the init or open its
	// descriptors through /proc/1/fd. The commands it starts are dumpable again (execve).
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		fmt.Printf("error: not dumpable: %v\n", err)
		return 1
	}
	os.Remove(initSock)
	l, err := net.Listen("unix", initSock)
	if err != nil {
		fmt.Printf("error: listen on %s: %v\n", initSock, err)
		return 1
	}
	fmt.Println("ok")
	err = sbinit.Serve(l, sbinit.Config{
		Cwd:   "/tmp",
		Path:  sbinit.DefaultPath,
		Files: sbinit.FileRoot{Dir: "/", Confined: true},
		Log:   log,
	})
	log.Error("sandbox init stopped serving", "err", err)
	return 1
}

// initBinary is the init as staged under <Dir>/init (seen as /.berth in every sandbox):
// argv is how a sandbox runs it (through its own copy of the dynamic loader when the binary
// is dynamically linked, so it starts in any root file system); sum is its SHA-256, in hex.
type initBinary struct {
	dir  string
	argv []string
	sum  string
}

// stageInit copies the init binary (default: this executable) into dir with its dynamic
// loader and the shared libraries it needs, and makes the mount point of the socket tmpfs.
// A fresh copy each time: a binary replaced on disk while sandboxes run does not change
// theirs. Errors: the binary cannot be read or a library not found.
func stageInit(bin, dir string) (initBinary, error) {
	if bin == "" {
		exe, err := os.Executable()
		if err != nil {
			return initBinary{}, fmt.Errorf("gvisor: find this executable: %w", err)
		}
		bin = exe
	}
	ib := initBinary{dir: dir, argv: []string{initPath}}
	if err := os.RemoveAll(dir); err != nil {
		return ib, fmt.Errorf("gvisor: %w", err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "run"), 0o755); err != nil {
		return ib, fmt.Errorf("gvisor: %w", err)
	}
	sum, err := copyFile(bin, filepath.Join(dir, "berth"), 0o755)
	if err != nil {
		return ib, err
	}
	ib.sum = sum[:16]
	interp, libs, err := dynamicDeps(bin)
	if err != nil {
		return ib, err
	}
	if interp == "" {
		return ib, nil
	}
	if err := os.MkdirAll(filepath.Join(dir, "lib"), 0o755); err != nil {
		return ib, fmt.Errorf("gvisor: %w", err)
	}
	if _, err := copyFile(interp, filepath.Join(dir, "lib", "loader.so"), 0o755); err != nil {
		return ib, err
	}
	for name, path := range libs {
		if _, err := copyFile(path, filepath.Join(dir, "lib", name), 0o644); err != nil {
			return ib, err
		}
	}
	ib.argv = []string{loader, "--library-path", libDir, initPath}
	return ib, nil
}

// libDirs are searched for shared libraries, in order.
var libDirs = []string{"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib/aarch64-linux-gnu",
	"/usr/lib/aarch64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib"}

// dynamicDeps returns a binary's ELF interpreter ("" for a static binary) and the shared
// libraries it needs, transitively, by name → host path.
func dynamicDeps(bin string) (string, map[string]string, error) {
	f, err := elf.Open(bin)
	if err != nil {
		return "", nil, fmt.Errorf("gvisor: read %s: %w", bin, err)
	}
	defer f.Close()
	interp := ""
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			b, err := io.ReadAll(p.Open())
			if err != nil {
				return "", nil, fmt.Errorf("gvisor: interpreter of %s: %w", bin, err)
			}
			interp = string(b[:len(b)-1]) // NUL-terminated
		}
	}
	if interp == "" {
		return "", nil, nil
	}
	libs := map[string]string{}
	queue, err := f.ImportedLibraries()
	if err != nil {
		return "", nil, fmt.Errorf("gvisor: libraries of %s: %w", bin, err)
	}
	for len(queue) > 0 && len(libs) < 64 {
		name := queue[0]
		queue = queue[1:]
		if _, seen := libs[name]; seen {
			continue
		}
		path := ""
		for _, d := range libDirs {
			if _, err := os.Stat(filepath.Join(d, name)); err == nil {
				path = filepath.Join(d, name)
				break
			}
		}
		if path == "" {
			return "", nil, berth.Errorf(berth.EUnavailable, "gvisor: %s needs %s, which is not in %v", bin, name, libDirs)
		}
		libs[name] = path
		if lf, err := elf.Open(path); err == nil {
			more, _ := lf.ImportedLibraries()
			lf.Close()
			queue = append(queue, more...)
		}
	}
	return interp, libs, nil
}

// copyFile copies src (following symlinks) to dst with mode and returns its SHA-256 in hex.
func copyFile(src, dst string, mode os.FileMode) (string, error) {
	in, err := os.Open(src)
	if err != nil {
		return "", fmt.Errorf("gvisor: %w", err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return "", fmt.Errorf("gvisor: %w", err)
	}
	h := sha256.New()
	if _, err := io.Copy(io.MultiWriter(out, h), in); err != nil {
		out.Close()
		return "", fmt.Errorf("gvisor: copy %s: %w", src, err)
	}
	if err := out.Close(); err != nil {
		return "", fmt.Errorf("gvisor: %w", err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
