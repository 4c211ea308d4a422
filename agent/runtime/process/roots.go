package process

import (
	"debug/elf"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/agent/runtime/rootfs"
	"github.com/berth-dev/berth/agent/runtime/sbinit"
)

// This file picks what an isolated sandbox's root holds (ISO-1): the built-in root or a
// template's, and the PATH its commands get there.

// prepareRoots makes the built-in root under <Dir>/rootfs/builtin and checks Config.Rootfs.
// Errors: EInvalidRequest for a template root that is not an absolute directory or lacks
// this binary's ELF interpreter.
func (r *Runtime) prepareRoots(custom map[string]string) error {
	l, err := rootfs.Builtin(filepath.Join(r.dir, "rootfs", "builtin"))
	if err != nil {
		return fmt.Errorf("process: %w", err)
	}
	r.builtin, r.custom = l, map[string]rootfs.Layout{}
	interp, err := ownInterpreter()
	if err != nil {
		return fmt.Errorf("process: %w", err)
	}
	for name, dir := range custom {
		l, err := rootfs.Custom(dir)
		if err != nil {
			return berth.Errorf(berth.EInvalidRequest, "process runtime: root of template %s: %v", name, err)
		}
		if interp != "" && !existsInRoot(dir, interp) {
			return berth.Errorf(berth.EInvalidRequest, "process runtime: root of template %s lacks %s, the ELF interpreter of this binary, which runs inside it as the init: build berth with CGO_ENABLED=0", name, interp)
		}
		r.custom[name] = l
	}
	return nil
}

// ownInterpreter returns this binary's ELF interpreter, "" when it is static.
func ownInterpreter() (string, error) {
	f, err := elf.Open("/proc/self/exe")
	if err != nil {
		return "", err
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			b, err := io.ReadAll(p.Open())
			if err != nil {
				return "", err
			}
			return strings.TrimRight(string(b), "\x00"), nil
		}
	}
	return "", nil
}

// existsInRoot reports whether path exists inside root, symlinks resolved within it.
func existsInRoot(root, path string) bool {
	dfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(dfd)
	rel := strings.TrimPrefix(path, "/")
	if rel == "" {
		rel = "."
	}
	fd, err := unix.Openat2(dfd, rel, &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_IN_ROOT})
	if err != nil {
		return false
	}
	unix.Close(fd)
	return true
}

// layout returns the root an isolated sandbox of template gets.
func (r *Runtime) layout(template string) rootfs.Layout {
	if l, ok := r.custom[template]; ok {
		return l
	}
	return r.builtin
}

// commandPath is the PATH of an unisolated sandbox's commands: the standard directories, then
// the agent's.
func commandPath() string { return standardPathAnd(func(string) bool { return true }) }

// sandboxPath is the PATH of an isolated sandbox's commands: the standard directories, then
// those of the agent's PATH that exist inside its root (in the layout's Dir or one of its
// binds), so no directory only the host has is named.
func sandboxPath(l rootfs.Layout) string {
	return standardPathAnd(func(d string) bool { return inLayout(l, filepath.Clean(d)) })
}

// standardPathAnd is sbinit.DefaultPath followed by the absolute directories of the agent's
// PATH that keep accepts, each once.
func standardPathAnd(keep func(dir string) bool) string {
	dirs := filepath.SplitList(sbinit.DefaultPath)
	seen := map[string]bool{}
	for _, d := range dirs {
		seen[d] = true
	}
	for _, d := range filepath.SplitList(os.Getenv("PATH")) {
		if d != "" && filepath.IsAbs(d) && !seen[d] && keep(d) {
			dirs = append(dirs, d)
		}
		seen[d] = true
	}
	return strings.Join(dirs, string(filepath.ListSeparator))
}

// inLayout reports whether the sandbox path d exists in the root l describes.
func inLayout(l rootfs.Layout, d string) bool {
	for _, b := range l.Binds {
		if rest, ok := strings.CutPrefix(d, b.Target); ok && (rest == "" || rest[0] == '/') {
			return existsInRoot(b.Source, rest)
		}
	}
	return existsInRoot(l.Dir, d)
}
