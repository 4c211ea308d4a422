// Package cpustat reads CPU time from Linux's /proc for the benchmarks that report where a
// machine's cores went (docs/PERFORMANCE.md): this process's, and a process tree's — a
// PostgreSQL postmaster with its backends. It imports only the standard library.
package cpustat

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// userHZ is the unit of /proc/<pid>/stat's CPU fields: 100 ticks per second on Linux.
const userHZ = 100

// Self is this process's user+system CPU time (getrusage RUSAGE_SELF).
func Self() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// proc is one /proc/<pid>/stat: its parent, command name and CPU ticks — its own (utime +
// stime) and those of children it reaped (cutime + cstime).
type proc struct {
	ppid        int
	comm        string
	own, reaped int64
}

// procs reads every process's stat; processes that end while it reads are skipped.
func procs() (map[int]proc, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	out := make(map[int]proc, len(ents))
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		p, ok := readStat(pid)
		if ok {
			out[pid] = p
		}
	}
	return out, nil
}

func readStat(pid int) (proc, bool) {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return proc{}, false
	}
	s := string(raw)
	open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || end < open || end+2 > len(s) {
		return proc{}, false
	}
	f := strings.Fields(s[end+2:]) // f[0] is field 3 (state), f[11..14] fields 14..17
	if len(f) < 15 {
		return proc{}, false
	}
	n := func(i int) int64 { v, _ := strconv.ParseInt(f[i], 10, 64); return v }
	return proc{ppid: int(n(1)), comm: s[open+1 : end], own: n(11) + n(12), reaped: n(13) + n(14)}, true
}

// Parent is pid's parent process id and its command name. Errors: pid is not running (or not
// visible from this process's /proc).
func Parent(pid int) (int, string, error) {
	p, ok := readStat(pid)
	if !ok {
		return 0, "", fmt.Errorf("no process %d", pid)
	}
	q, ok := readStat(p.ppid)
	if !ok {
		return 0, "", fmt.Errorf("no parent %d of process %d", p.ppid, pid)
	}
	return p.ppid, q.comm, nil
}

// Tree is the CPU time of root and of every live descendant, plus what each of them reaped
// from children that already ended (a PostgreSQL backend that exits is counted in its
// postmaster's reaped time). Errors: root is not running.
func Tree(root int) (time.Duration, error) {
	all, err := procs()
	if err != nil {
		return 0, err
	}
	if _, ok := all[root]; !ok {
		return 0, fmt.Errorf("no process %d", root)
	}
	var ticks int64
	for pid, p := range all {
		if descends(all, pid, root) {
			ticks += p.own + p.reaped
		}
	}
	return time.Duration(ticks) * time.Second / userHZ, nil
}

// Children lists the live children of pid whose command name is comm.
func Children(pid int, comm string) ([]int, error) {
	all, err := procs()
	if err != nil {
		return nil, err
	}
	var out []int
	for c, p := range all {
		if p.ppid == pid && p.comm == comm {
			out = append(out, c)
		}
	}
	return out, nil
}

// descends reports whether pid is root or below it (a bounded walk: /proc's parent links
// always end at pid 0, but a race could make one loop).
func descends(all map[int]proc, pid, root int) bool {
	for range 64 {
		if pid == root {
			return true
		}
		p, ok := all[pid]
		if !ok || pid == 0 {
			return false
		}
		pid = p.ppid
	}
	return false
}
