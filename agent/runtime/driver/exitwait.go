package driver

import (
	"errors"
	"os"
	"os/exec"

	"golang.org/x/sys/unix"
)

// WaitExit waits for the process of a started cmd to exit and reaps it with cmd.Wait,
// returning Wait's error — like cmd.Wait, but without holding an OS thread while the process
// runs (issue 16, goal 7). cmd.Wait blocks in waitid(2), a system call that keeps its OS
// thread for as long as the process lives: one thread per sandbox, 1,940 threads for 1,928
// sandboxes. WaitExit first parks on a pidfd (pidfd_open(2), readable once the process has
// exited) through the Go netpoller, as a socket read does, so any number of sandboxes share
// the runtime's few threads; cmd.Wait then returns at once. Where the kernel has no pollable
// pidfd (before Linux 5.3) it falls back to cmd.Wait alone.
//
// The pid cannot name another process meanwhile: an exited child stays a zombie, its pid
// taken, until it is reaped, and only cmd.Wait here reaps it.
func WaitExit(cmd *exec.Cmd) error {
	if f := pidfd(cmd.Process.Pid); f != nil {
		awaitExit(f)
		f.Close()
	}
	return cmd.Wait()
}

// pidfd returns a non-blocking pidfd of pid registered with the netpoller, or nil.
func pidfd(pid int) *os.File {
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		return nil
	}
	return os.NewFile(uintptr(fd), "pidfd") // non-blocking: NewFile adds it to the netpoller
}

// awaitExit returns once the pidfd f is readable (its process exited), or at once when f
// cannot be waited on through the netpoller.
func awaitExit(f *os.File) {
	rc, err := f.SyscallConn()
	if err != nil {
		return
	}
	// Read calls the function, and while it returns false parks the goroutine until the
	// netpoller reports f readable; a file the netpoller does not hold fails at once.
	_ = rc.Read(func(fd uintptr) bool {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 0)
		return n > 0 || (err != nil && !errors.Is(err, unix.EINTR))
	})
}
