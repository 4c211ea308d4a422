// Package rootfs prepares the root file system a sandbox sees (ISO-1): for the built-in
// templates, a read-only view of the host's /usr, /bin, /sbin and /lib* and a small generated
// /etc — never the whole host root, so no host configuration, key, socket or state directory
// is in view; or an unpacked root file system directory a template names. Both runtime
// drivers mount what it describes (the gVisor runtime as the OCI bundle's root and mounts,
// the process runtime inside the sandbox's mount namespace). It does no mounting itself.
package rootfs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Layout is a sandbox's root file system: Dir becomes its "/", read-only; each Bind mounts a
// host directory read-only onto Dir's mount point of the same name. MountPoints are the
// directories the runtimes mount over (present, empty, in Dir).
type Layout struct {
	Dir   string
	Binds []Bind
}

// Bind is a host directory (Source) seen read-only at Target inside the sandbox.
type Bind struct {
	Source string
	Target string
}

// MountPoints are the directories every sandbox root must hold: /tmp (its private writable
// scratch), /proc, /dev, and /.berth (the init's binary and socket).
var MountPoints = []string{"tmp", "proc", "dev", ".berth"}

// hostDirs are the host directories the built-in templates see read-only. On a merged-/usr
// host /bin, /sbin and /lib* are symlinks into /usr and are recreated as such.
var hostDirs = []string{"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"}

// Builtin prepares, under dir (created if missing; idempotent), the root of the built-in
// templates (python, shell): empty mount points, the merged-/usr symlinks the host has, and
// /etc with only what programs need to start — passwd and group (root and the sandbox user,
// uid/gid 1000 "sandbox"), hosts (localhost), nsswitch.conf, an empty resolv.conf, and copies
// of the host's ld.so.cache, os-release and the /etc/alternatives symlinks (no secrets: the
// library index and command choices). The host's /usr and its /lib* directories are the
// Binds. Errors: the directory cannot be written.
func Builtin(dir string) (Layout, error) {
	l := Layout{Dir: dir}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return l, fmt.Errorf("rootfs: %w", err)
	}
	if err := mountPoints(dir); err != nil {
		return l, err
	}
	for _, name := range hostDirs {
		host := "/" + name
		st, err := os.Lstat(host)
		if err != nil {
			continue // this host has no such directory
		}
		target := filepath.Join(dir, name)
		if st.Mode()&fs.ModeSymlink != 0 {
			link, err := os.Readlink(host)
			if err != nil {
				return l, fmt.Errorf("rootfs: %w", err)
			}
			if err := replaceSymlink(link, target); err != nil {
				return l, err
			}
			continue
		}
		if !st.IsDir() {
			continue
		}
		if err := os.MkdirAll(target, 0o755); err != nil {
			return l, fmt.Errorf("rootfs: %w", err)
		}
		l.Binds = append(l.Binds, Bind{Source: host, Target: "/" + name})
	}
	if err := writeEtc(filepath.Join(dir, "etc")); err != nil {
		return l, err
	}
	return l, nil
}

// Custom returns the layout of an unpacked root file system directory a template names: it
// is the root as it is, with no host directory bound in. The mount points are created when
// missing. Errors: dir is not an absolute existing directory, or a mount point cannot be made.
func Custom(dir string) (Layout, error) {
	if !filepath.IsAbs(dir) {
		return Layout{}, fmt.Errorf("rootfs: %q is not an absolute path", dir)
	}
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return Layout{}, fmt.Errorf("rootfs: %q is not a directory", dir)
	}
	if err := mountPoints(dir); err != nil {
		return Layout{}, err
	}
	return Layout{Dir: dir}, nil
}

func mountPoints(dir string) error {
	for _, mp := range MountPoints {
		if err := os.MkdirAll(filepath.Join(dir, mp), 0o755); err != nil {
			return fmt.Errorf("rootfs: mount point: %w", err)
		}
	}
	return nil
}

// replaceSymlink makes target a symlink to link, replacing whatever is there.
func replaceSymlink(link, target string) error {
	if cur, err := os.Readlink(target); err == nil && cur == link {
		return nil
	}
	if err := os.RemoveAll(target); err != nil {
		return fmt.Errorf("rootfs: %w", err)
	}
	if err := os.Symlink(link, target); err != nil {
		return fmt.Errorf("rootfs: %w", err)
	}
	return nil
}

// etcFiles are the generated files of the built-in /etc.
var etcFiles = map[string]string{
	"passwd":        "root:x:0:0:root:/tmp:/bin/sh\nsandbox:x:1000:1000:sandbox:/tmp:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
	"group":         "root:x:0:\nsandbox:x:1000:\nnogroup:x:65534:\n",
	"hosts":         "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n",
	"nsswitch.conf": "passwd: files\ngroup: files\nhosts: files\n",
	"resolv.conf":   "",
	"hostname":      "sandbox\n",
}

// etcCopies are host files copied as they are when the host has them.
var etcCopies = []string{"ld.so.cache", "os-release", "debian_version", "localtime", "mime.types"}

func writeEtc(etc string) error {
	if err := os.MkdirAll(etc, 0o755); err != nil {
		return fmt.Errorf("rootfs: %w", err)
	}
	for name, content := range etcFiles {
		if err := writeIfChanged(filepath.Join(etc, name), []byte(content)); err != nil {
			return err
		}
	}
	for _, name := range etcCopies {
		b, err := os.ReadFile(filepath.Join("/etc", name))
		if err != nil {
			continue
		}
		if err := writeIfChanged(filepath.Join(etc, name), b); err != nil {
			return err
		}
	}
	// /etc/alternatives holds only symlinks (Debian's command choices: awk → mawk); a
	// symlink to anything else is skipped.
	alt := filepath.Join(etc, "alternatives")
	if err := os.MkdirAll(alt, 0o755); err != nil {
		return fmt.Errorf("rootfs: %w", err)
	}
	entries, _ := os.ReadDir("/etc/alternatives")
	for _, e := range entries {
		if e.Type()&fs.ModeSymlink == 0 {
			continue
		}
		link, err := os.Readlink(filepath.Join("/etc/alternatives", e.Name()))
		if err != nil || strings.HasPrefix(link, "/etc/") {
			continue
		}
		if err := replaceSymlink(link, filepath.Join(alt, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// writeIfChanged writes b to path (0644) unless it already holds exactly b, so a root shared
// by running sandboxes is not rewritten under them.
func writeIfChanged(path string, b []byte) error {
	if cur, err := os.ReadFile(path); err == nil && string(cur) == string(b) {
		return nil
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("rootfs: %w", err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return fmt.Errorf("rootfs: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("rootfs: %w", err)
	}
	return nil
}
