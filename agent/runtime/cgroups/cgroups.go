// Package cgroups reads the cgroups of a sandbox (AGT-3, C24, C09, ISO-2): where a
// controller is mounted (cgroup v2 when a v2 hierarchy offers it, else v1), a cgroup's
// processes, its working set and how many processes the kernel OOM killer killed in it, and
// removes a cgroup with what is left in it. Both runtime drivers use it: the process runtime
// for the cgroups it makes, the gVisor runtime for the cgroup runsc makes for a sandbox's
// sentry and gofer.
package cgroups

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

// Mount is where a controller's hierarchy lives; V2 tells the file names apart.
type Mount struct {
	Path string
	V2   bool
}

// Find picks the hierarchy of controller ("memory", "pids") from the text of
// /proc/self/mountinfo. v2 wins when a cgroup2 mount lists the controller in its
// cgroup.controllers (read through controllers); otherwise the first v1 mount whose super
// options name it. ok is false when there is neither.
func Find(mountinfo, controller string, controllers func(mountPoint string) string) (m Mount, ok bool) {
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
			if hasWord(controllers(mountPoint), controller, " ") {
				return Mount{Path: mountPoint, V2: true}, true
			}
		case "cgroup":
			if v1 == "" && len(tail) >= 3 && hasWord(tail[2], controller, ",") {
				v1 = mountPoint
			}
		}
	}
	if v1 == "" {
		return Mount{}, false
	}
	return Mount{Path: v1}, true
}

// Host finds this host's hierarchy of controller (Find over /proc/self/mountinfo).
func Host(controller string) (Mount, bool) {
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return Mount{}, false
	}
	return Find(string(mi), controller, func(mp string) string {
		b, _ := os.ReadFile(filepath.Join(mp, "cgroup.controllers"))
		return string(b)
	})
}

// Mounts lists the mount points of every cgroup hierarchy (v1 and v2) in the text of
// /proc/self/mountinfo.
func Mounts(mountinfo string) []string {
	var out []string
	for _, line := range strings.Split(mountinfo, "\n") {
		pre, post, found := strings.Cut(line, " - ")
		fields, tail := strings.Fields(pre), strings.Fields(post)
		if found && len(fields) >= 5 && len(tail) >= 1 && (tail[0] == "cgroup" || tail[0] == "cgroup2") {
			out = append(out, fields[4])
		}
	}
	return out
}

// RemoveEmpty removes the directory rel (relative to each hierarchy's mount) in every
// cgroup hierarchy of this host where it exists and is empty; others are left as they are.
func RemoveEmpty(rel string) {
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return
	}
	for _, mp := range Mounts(string(mi)) {
		syscall.Rmdir(filepath.Join(mp, filepath.Clean("/"+rel)))
	}
}

func hasWord(s, word, sep string) bool {
	for _, w := range strings.Split(strings.TrimSpace(s), sep) {
		if w == word {
			return true
		}
	}
	return false
}

// Procs lists the pids (as the host sees them) in the cgroup at dir.
func Procs(dir string) ([]int, error) {
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

// Usage returns the cgroup's charged memory and its inactive file pages in bytes: v1
// memory.usage_in_bytes and total_inactive_file, v2 memory.current and inactive_file.
func Usage(dir string, v2 bool) (usage, inactiveFile int64, err error) {
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

// WorkingSetMiB is the kubelet's working set (C24): usage minus inactive file pages, floored
// at zero, in MiB rounded to the nearest.
func WorkingSetMiB(usage, inactiveFile int64) int64 {
	ws := max(usage-inactiveFile, 0)
	return (ws + 1<<19) >> 20
}

// OOMKills returns how many processes the kernel OOM killer killed in the cgroup: "oom_kill"
// of v1 memory.oom_control or v2 memory.events (C09). 0 when unreadable.
func OOMKills(dir string, v2 bool) int64 {
	file := "memory.oom_control"
	if v2 {
		file = "memory.events"
	}
	b, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}

// Remove kills whatever is still in the cgroup at dir and removes it, retrying until ctx
// ends. A missing cgroup is not an error. The pids killed are the cgroup's own, which only
// the caller creates: they are its sandbox's.
func Remove(ctx context.Context, dir string) error {
	for {
		pids, err := Procs(dir)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		for _, pid := range pids {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		if len(pids) == 0 {
			err := syscall.Rmdir(dir)
			if err == nil || errors.Is(err, syscall.ENOENT) {
				return nil
			}
			if !errors.Is(err, syscall.EBUSY) {
				return fmt.Errorf("cgroups: remove %s: %w", dir, err)
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cgroups: %s still holds %v: %w", dir, pids, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}
