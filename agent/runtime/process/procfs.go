package process

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// procStat is what this package needs from /proc/<pid>/stat.
type procStat struct {
	pid, ppid int
	state     byte
}

// parseStat parses the text of /proc/<pid>/stat. The command name may hold spaces and
// parentheses, so fields are counted after its last ')'.
func parseStat(s string) (procStat, error) {
	open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || end < open {
		return procStat{}, fmt.Errorf("malformed stat %q", s)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(s[:open]))
	if err != nil {
		return procStat{}, fmt.Errorf("malformed stat pid: %w", err)
	}
	f := strings.Fields(s[end+1:])
	if len(f) < 2 || len(f[0]) != 1 {
		return procStat{}, fmt.Errorf("malformed stat %q", s)
	}
	ppid, err := strconv.Atoi(f[1])
	if err != nil {
		return procStat{}, fmt.Errorf("malformed stat ppid: %w", err)
	}
	return procStat{pid: pid, ppid: ppid, state: f[0][0]}, nil
}

// processTree returns root and its live (non-zombie) descendants, found by walking the ppid
// links of every process in procDir (normally /proc). root comes first; an absent root gives
// nil.
func processTree(procDir string, root int) []int {
	entries, err := os.ReadDir(procDir)
	if err != nil {
		return nil
	}
	children := map[int][]int{}
	rootAlive := false
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(procDir, e.Name(), "stat"))
		if err != nil {
			continue // exited meanwhile
		}
		st, err := parseStat(string(b))
		if err != nil || st.state == 'Z' || st.state == 'X' {
			continue
		}
		if pid == root {
			rootAlive = true
		}
		children[st.ppid] = append(children[st.ppid], pid)
	}
	if !rootAlive {
		return nil
	}
	tree := []int{root}
	for i := 0; i < len(tree); i++ {
		tree = append(tree, children[tree[i]]...)
	}
	return tree
}

// residentBytes returns the resident set of pid from /proc/<pid>/statm, in bytes; 0 when the
// process is gone. Pages shared between processes of a tree are counted once per process.
func residentBytes(procDir string, pid int) int64 {
	b, err := os.ReadFile(filepath.Join(procDir, strconv.Itoa(pid), "statm"))
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0
	}
	pages, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return 0
	}
	return pages * int64(os.Getpagesize())
}

// killTree kills every descendant of root, repeating until none is left alive (a process may
// fork while we kill; its child is re-parented to root, a subreaper, and caught next round),
// then root itself through kill, and waits until gone reports root dead. gone must not trust
// the pid alone: once root is reaped its pid may be reused. It gives up when ctx ends.
func killTree(ctx context.Context, root int, kill func() error, gone func() bool) error {
	killed := false
	for !gone() {
		tree := processTree("/proc", root)
		switch {
		case len(tree) == 0:
			return nil
		case len(tree) == 1 && !killed:
			if err := kill(); err != nil {
				return err
			}
			killed = true
		default:
			for _, pid := range tree[1:] {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		select {
		case <-ctx.Done():
			kill()
			return fmt.Errorf("process: tree of %d survives: %w", root, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
	return nil
}

// isOurInit reports whether pid is a live sandbox init serving dir (so a pid read back from an
// old init.pid file is not a stranger that reused the number; a zombie has no command line).
func isOurInit(pid int, dir string) bool {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	if err != nil {
		return false
	}
	args := bytes.Split(bytes.TrimRight(b, "\x00"), []byte{0})
	if len(args) < 2 || string(args[1]) != initArg {
		return false
	}
	for _, a := range args[2:] {
		if string(a) == "-dir="+dir {
			return true
		}
	}
	return false
}
