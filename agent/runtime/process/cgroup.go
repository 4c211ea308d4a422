package process

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// memoryMount is where the memory controller lives: a cgroup v2 hierarchy that offers the
// memory controller, else a cgroup v1 hierarchy mounted with it.
type memoryMount struct {
	path string
	v2   bool
}

// findMemoryMount picks the memory hierarchy from the text of /proc/self/mountinfo. v2 wins
// when a cgroup2 mount lists "memory" in its cgroup.controllers (read through controllers);
// otherwise the first v1 mount whose super options name "memory". ok is false when there is
// neither.
func findMemoryMount(mountinfo string, controllers func(mountPoint string) string) (m memoryMount, ok bool) {
	var v1 string
	for _, line := range strings.Split(mountinfo, "\n") {
		pre, post, found := strings.Cut(line, " - ")
		if !found {
			continue
		}
		fields, tail := strings.Fields(pre), strings.Fields(post)
		if len(fields) < 5 || len(tail) < 1 {
			continue
		}
		mountPoint := fields[4]
		switch tail[0] {
		case "cgroup2":
			if hasWord(controllers(mountPoint), "memory", " ") {
				return memoryMount{path: mountPoint, v2: true}, true
			}
		case "cgroup":
			if v1 == "" && len(tail) >= 3 && hasWord(tail[2], "memory", ",") {
				v1 = mountPoint
			}
		}
	}
	if v1 == "" {
		return memoryMount{}, false
	}
	return memoryMount{path: v1}, true
}

func hasWord(s, word, sep string) bool {
	for _, w := range strings.Split(strings.TrimSpace(s), sep) {
		if w == word {
			return true
		}
	}
	return false
}

// cgroupSet is the directory that holds one memory cgroup per sandbox of one runtime:
// <mount>/<CgroupParent>/<instance>. The instance level is derived from the runtime's Dir so
// that several runtimes on one host (berth dev runs several agents in one process; parallel
// test binaries) never collide on sandbox ids nor clean up each other's sandboxes.
type cgroupSet struct {
	base string
	v2   bool
}

// newCgroupSet creates the base directory (and, on v2, enables the memory controller on every
// level above the sandbox cgroups).
func newCgroupSet(m memoryMount, parent, instance string) (*cgroupSet, error) {
	rel := filepath.Join(filepath.Clean("/"+parent), instance)
	base := filepath.Join(m.path, rel)
	if err := os.MkdirAll(base, 0o755); err != nil {
		return nil, fmt.Errorf("process: create cgroup %s: %w", base, err)
	}
	if m.v2 {
		// Every level from the mount root to base must delegate memory to its children.
		dir := m.path
		for _, part := range append([]string{""}, strings.Split(strings.Trim(rel, "/"), "/")...) {
			dir = filepath.Join(dir, part)
			if err := os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte("+memory"), 0o644); err != nil {
				return nil, fmt.Errorf("process: enable memory controller in %s: %w", dir, err)
			}
		}
	}
	return &cgroupSet{base: base, v2: m.v2}, nil
}

func (c *cgroupSet) path(id string) string { return filepath.Join(c.base, id) }

// create makes the cgroup of one sandbox with a memory limit in MiB (AGT-3). Swap is left
// alone. An empty leftover of the same name is removed first.
func (c *cgroupSet) create(id string, memoryMiB int64) (string, error) {
	dir := c.path(id)
	if err := os.Mkdir(dir, 0o755); errors.Is(err, fs.ErrExist) {
		if err := syscall.Rmdir(dir); err != nil {
			return "", fmt.Errorf("process: leftover cgroup %s: %w", dir, err)
		}
		err = os.Mkdir(dir, 0o755)
		if err != nil {
			return "", fmt.Errorf("process: create cgroup %s: %w", dir, err)
		}
	} else if err != nil {
		return "", fmt.Errorf("process: create cgroup %s: %w", dir, err)
	}
	file := "memory.limit_in_bytes"
	if c.v2 {
		file = "memory.max"
	}
	limit := strconv.FormatInt(memoryMiB<<20, 10)
	if err := os.WriteFile(filepath.Join(dir, file), []byte(limit), 0o644); err != nil {
		syscall.Rmdir(dir)
		return "", fmt.Errorf("process: set %s of %s: %w", file, dir, err)
	}
	return dir, nil
}

// addProc moves pid into the cgroup at dir.
func addProc(dir string, pid int) error {
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
		return fmt.Errorf("process: move pid %d into %s: %w", pid, dir, err)
	}
	return nil
}

// cgroupProcs lists the pids (as the host sees them) in the cgroup at dir.
func cgroupProcs(dir string) ([]int, error) {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// cgroupUsage returns the cgroup's charged memory and its inactive file pages in bytes:
// v1 memory.usage_in_bytes and total_inactive_file, v2 memory.current and inactive_file.
func cgroupUsage(dir string, v2 bool) (usage, inactiveFile int64, err error) {
	usageFile, statKey := "memory.usage_in_bytes", "total_inactive_file"
	if v2 {
		usageFile, statKey = "memory.current", "inactive_file"
	}
	b, err := os.ReadFile(filepath.Join(dir, usageFile))
	if err != nil {
		return 0, 0, err
	}
	usage, err = strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("parse %s: %w", usageFile, err)
	}
	f, err := os.Open(filepath.Join(dir, "memory.stat"))
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), " ")
		if k == statKey {
			inactiveFile, err = strconv.ParseInt(v, 10, 64)
			return usage, inactiveFile, err
		}
	}
	return usage, 0, sc.Err()
}

// workingSetMiB is the kubelet's working set (C24): usage minus inactive file pages, floored
// at zero, in MiB rounded to the nearest.
func workingSetMiB(usage, inactiveFile int64) int64 {
	ws := max(usage-inactiveFile, 0)
	return (ws + 1<<19) >> 20
}

// removeCgroup kills whatever is still in the cgroup at dir and removes it, retrying until ctx
// ends. A missing cgroup is not an error.
func removeCgroup(ctx context.Context, dir string) error {
	for {
		pids, err := cgroupProcs(dir)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		for _, pid := range pids {
			// These pids are in a cgroup only this runtime creates, so they are ours.
			syscall.Kill(pid, syscall.SIGKILL)
		}
		if len(pids) == 0 {
			err := syscall.Rmdir(dir)
			if err == nil || errors.Is(err, syscall.ENOENT) {
				return nil
			}
			if !errors.Is(err, syscall.EBUSY) {
				return fmt.Errorf("process: remove cgroup %s: %w", dir, err)
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("process: cgroup %s still holds %v: %w", dir, pids, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// cleanLeftovers removes every sandbox cgroup under the set: they belong to an earlier run of
// a runtime with the same Dir that did not stop them (a crash), and their processes are killed.
func (c *cgroupSet) cleanLeftovers(ctx context.Context) ([]string, error) {
	entries, err := os.ReadDir(c.base)
	if err != nil {
		return nil, fmt.Errorf("process: list %s: %w", c.base, err)
	}
	var removed []string
	var errs []error
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		if err := removeCgroup(ctx, filepath.Join(c.base, e.Name())); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, e.Name())
	}
	return removed, errors.Join(errs...)
}
