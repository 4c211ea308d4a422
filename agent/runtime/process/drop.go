package process

import (
	"bufio"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/agent/runtime/sbinit"
)

// This file is where an isolated init gives up root for good (ISO-1): stage 1, its sandbox
// built, becomes the sandbox's uid and gid with no supplementary groups, no capability in any
// set (bounding set included), no_new_privs and no core dumps, and execs stage 2, which only
// serves. Everything stage 2 starts — commands, the app service — and everything the files
// API touches therefore runs as that uid with nothing to gain: a setuid binary stays
// unprivileged (no_new_privs, and every mount is nosuid).
//
// Why an exec: no_new_privs and the capability bounding set belong to a thread, and a Go
// process has several, any of which may fork a command. execve leaves one thread, with the
// caller's, and every thread the Go runtime makes afterwards copies it. (The uid and gid
// change itself applies to every thread: Go's Setresuid does that.)

// dropAndExec ends stage 1. lfd is the bound socket, exe this binary. It returns only on
// failure.
func dropAndExec(c initConfig, exe *os.File, lfd int) error {
	runtime.LockOSThread() // never unlocked: the exec replaces the process
	// No core dumps: a core_pattern pipe would hand a sandbox process's memory to a helper
	// running as root on the host.
	if err := unix.Setrlimit(unix.RLIMIT_CORE, &unix.Rlimit{}); err != nil {
		return fmt.Errorf("rlimit core: %w", err)
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("no_new_privs: %w", err)
	}
	if err := dropBoundingSet(); err != nil {
		return err
	}
	if err := syscall.Setgroups(nil); err != nil {
		return fmt.Errorf("setgroups: %w", err)
	}
	if err := syscall.Setresgid(c.uid, c.uid, c.uid); err != nil {
		return fmt.Errorf("setresgid %d: %w", c.uid, err)
	}
	if err := syscall.Setresuid(c.uid, c.uid, c.uid); err != nil {
		return fmt.Errorf("setresuid %d: %w", c.uid, err)
	}
	// Effective and permitted capabilities went with uid 0; clear the inheritable set too.
	var caps [2]unix.CapUserData
	if err := unix.Capset(&unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}, &caps[0]); err != nil {
		return fmt.Errorf("capset: %w", err)
	}
	// Stage 2 inherits the ready pipe, the uid lease and the socket; nothing else.
	for _, fd := range []int{readyFD, lockFD, lfd} {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, 0); err != nil {
			return fmt.Errorf("pass descriptor %d to stage 2: %w", fd, err)
		}
	}
	argv := []string{"berth-sandbox", initArg, "-id=" + c.id, "-dir=" + c.dir, "-path=" + c.path,
		"-isolated=true", fmt.Sprintf("-uid=%d", c.uid), fmt.Sprintf("-listen-fd=%d", lfd)}
	// The binary lies outside the new root: exec it through its descriptor. Its ELF
	// interpreter, if any, is looked up in the new root (New checks that it is there).
	err := syscall.Exec(fdPath(int(exe.Fd())), argv, []string{})
	return fmt.Errorf("exec stage 2: %w", err)
}

// dropBoundingSet drops every capability this kernel knows from the calling thread's
// bounding set.
func dropBoundingSet() error {
	for c := 0; ; c++ {
		err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0)
		switch {
		case errors.Is(err, unix.EINVAL) && c > 0:
			return nil // past the last capability
		case err != nil:
			return fmt.Errorf("drop capability %d from the bounding set: %w", c, err)
		}
	}
}

// serveIsolated is stage 2: the sandbox's unprivileged init. It serves until its socket fails.
func serveIsolated(c initConfig, log *slog.Logger) int {
	// The credential change cleared the parent-death signal: set it again. Should the agent
	// have died before, writing "ok" below fails (the pipe has no reader left) and we exit.
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(unix.SIGKILL), 0, 0, 0); err != nil {
		log.Error("set parent death signal", "err", err)
		return 1
	}
	// The sandbox's processes run as our uid: not dumpable, we cannot be ptraced by them nor
	// have our /proc files (descriptors, memory) opened.
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		log.Error("set not dumpable", "err", err)
		return 1
	}
	// No descriptor of ours (the socket, the uid lease, the ready pipe) may reach a command.
	closeOnExecFrom(3)
	ready := os.NewFile(readyFD, "ready")
	if err := checkUnprivileged(c.uid); err != nil {
		fmt.Fprintf(ready, "error: %v\n", err)
		return 1
	}
	f := os.NewFile(uintptr(c.listenFD), "init.sock")
	l, err := net.FileListener(f)
	f.Close()
	if err != nil {
		fmt.Fprintf(ready, "error: socket: %v\n", err)
		return 1
	}
	reserveThreads(reservedThreads)
	cfg := sbinit.Config{Cwd: "/tmp", Path: c.path, Log: log,
		Files: sbinit.FileRoot{Dir: "/", Confined: true}} // ISO-3: the sandbox's own root
	if _, err := fmt.Fprintln(ready, "ok"); err != nil {
		log.Error("the runtime is gone", "err", err)
		return 1
	}
	ready.Close()
	log.Info("sandbox init serving", "isolated", true, "uid", c.uid)
	err = sbinit.Serve(l, cfg)
	log.Error("sandbox init stopped serving", "err", err)
	return 1
}

// reservedThreads is how many OS threads the init makes at start beyond what it needs then.
const reservedThreads = 16

// reserveThreads makes the Go runtime start n more OS threads now. The init shares its
// sandbox's pids limit, and when the Go runtime cannot make a thread it needs, it aborts: a
// process bomb inside the sandbox would take the init down with it. The runtime never ends an
// idle thread, so threads made now are there when the init is busy under a full limit. Each
// of n goroutines locks itself to a thread and blocks, so each holds a distinct one; they
// unlock before they return, which leaves the threads idle rather than ending them.
func reserveThreads(n int) {
	release := make(chan struct{})
	var locked, done sync.WaitGroup
	for range n {
		locked.Add(1)
		done.Go(func() {
			runtime.LockOSThread()
			locked.Done()
			<-release
			runtime.UnlockOSThread()
		})
	}
	locked.Wait()
	close(release)
	done.Wait()
}

// closeOnExecFrom marks every open descriptor from min up close-on-exec.
func closeOnExecFrom(min int) {
	entries, _ := os.ReadDir("/proc/self/fd")
	for _, e := range entries {
		if fd, err := strconv.Atoi(e.Name()); err == nil && fd >= min {
			unix.CloseOnExec(fd)
		}
	}
}

// checkUnprivileged fails unless /proc/self/status shows uid and gid all uid, no
// supplementary group, no capability in any set and no_new_privs: the drop is verified,
// not assumed.
func checkUnprivileged(uid int) error {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return fmt.Errorf("check privileges: %w", err)
	}
	defer f.Close()
	id := strconv.Itoa(uid)
	want := map[string]string{
		"Uid": strings.Repeat(id+" ", 4), "Gid": strings.Repeat(id+" ", 4), "Groups": "",
		"CapInh": "0000000000000000", "CapPrm": "0000000000000000", "CapEff": "0000000000000000",
		"CapBnd": "0000000000000000", "CapAmb": "0000000000000000", "NoNewPrivs": "1",
	}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), ":")
		w, ok := want[k]
		if !ok {
			continue
		}
		if got := strings.Join(strings.Fields(v), " "); got != strings.TrimSpace(w) {
			return fmt.Errorf("privileges not dropped: %s is %q, want %q", k, got, strings.TrimSpace(w))
		}
		delete(want, k)
	}
	if len(want) > 0 {
		return fmt.Errorf("check privileges: /proc/self/status lacks %v", want)
	}
	return sc.Err()
}
