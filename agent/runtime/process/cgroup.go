package process

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/berth-dev/berth/agent/runtime/cgroups"
)

// Controllers a sandbox is limited by (ISO-2).
const (
	ctrlMemory = "memory"
	ctrlPids   = "pids"
)

// cgroupSet is the directory that holds one cgroup per sandbox of one runtime in one
// hierarchy: <mount>/<CgroupParent>/<instance>. The instance level is derived from the
// runtime's Dir so that several runtimes on one host (berth dev runs several agents in one
// process; parallel test binaries) never collide on sandbox ids nor clean up each other's
// sandboxes. On cgroup v1 a runtime has one set per controller (memory, pids); on v2 one set
// holds both.
type cgroupSet struct {
	base        string
	v2          bool
	controllers []string
}

// cgroupLimits are what a sandbox's cgroups enforce: memory in MiB and tasks (processes and
// threads).
type cgroupLimits struct {
	memoryMiB int64
	pids      int
}

// newCgroupSet creates the base directory (and, on v2, enables the controllers on every
// level above the sandbox cgroups).
func newCgroupSet(m cgroups.Mount, controllers []string, parent, instance string) (*cgroupSet, error) {
	rel := filepath.Join(filepath.Clean("/"+parent), instance)
	base := filepath.Join(m.Path, rel)
	if err := os.MkdirAll(base, 0o755); err != nil {
		return nil, fmt.Errorf("process: create cgroup %s: %w", base, err)
	}
	if m.V2 {
		// Every level from the mount root to base must delegate the controllers to its
		// children.
		enable := "+" + strings.Join(controllers, " +")
		dir := m.Path
		for _, part := range append([]string{""}, strings.Split(strings.Trim(rel, "/"), "/")...) {
			dir = filepath.Join(dir, part)
			if err := os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte(enable), 0o644); err != nil {
				return nil, fmt.Errorf("process: enable %s in %s: %w", enable, dir, err)
			}
		}
	}
	return &cgroupSet{base: base, v2: m.V2, controllers: controllers}, nil
}

func (c *cgroupSet) path(id string) string { return filepath.Join(c.base, id) }

func (c *cgroupSet) has(controller string) bool { return slices.Contains(c.controllers, controller) }

// create makes the cgroup of one sandbox and sets the limits of the set's controllers
// (AGT-3, ISO-2): memory.limit_in_bytes (v1) or memory.max (v2), and pids.max. Swap is left
// alone. An empty leftover of the same name is removed first.
func (c *cgroupSet) create(id string, lim cgroupLimits) (string, error) {
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
	files := map[string]string{}
	if c.has(ctrlMemory) {
		file := "memory.limit_in_bytes"
		if c.v2 {
			file = "memory.max"
		}
		files[file] = strconv.FormatInt(lim.memoryMiB<<20, 10)
	}
	if c.has(ctrlPids) {
		files["pids.max"] = strconv.Itoa(lim.pids)
	}
	for file, v := range files {
		if err := os.WriteFile(filepath.Join(dir, file), []byte(v), 0o644); err != nil {
			syscall.Rmdir(dir)
			return "", fmt.Errorf("process: set %s of %s: %w", file, dir, err)
		}
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
		if err := cgroups.Remove(ctx, filepath.Join(c.base, e.Name())); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, e.Name())
	}
	return removed, errors.Join(errs...)
}
