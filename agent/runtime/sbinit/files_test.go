package sbinit

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestISO3_OpenInRootStaysInside: the walk used where openat2 does not exist (gVisor)
// resolves absolute symlinks from the sandbox's root, clamps ".." at it, refuses loops and
// never opens a symlink's target by its magic: a link whose text is not a path ("pipe:[3]",
// as /proc/<pid>/fd links read) leads nowhere (ISO-3).
func TestISO3_OpenInRootStaysInside(t *testing.T) {
	root := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(root, "etc"), 0o755))
	must(os.MkdirAll(filepath.Join(root, "tmp", "deep"), 0o755))
	must(os.WriteFile(filepath.Join(root, "etc", "hostname"), []byte("inside"), 0o644))
	for link, target := range map[string]string{
		"tmp/abs":     "/etc",            // absolute: the root's /etc, not the host's
		"tmp/up":      "../../../../etc", // climbs past the root: clamped at it
		"tmp/loop":    "loop",
		"tmp/magic":   "pipe:[3]", // what /proc/<pid>/fd/N reads as
		"tmp/host":    "/var/lib", // exists on the host, not in the root
		"tmp/deep/up": "..",
	} {
		must(os.Symlink(target, filepath.Join(root, link)))
	}
	rootFD, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY, 0)
	must(err)
	defer unix.Close(rootFD)
	read := func(rel string) (string, error) {
		fd, err := openInRoot(rootFD, rel, unix.O_RDONLY, 0)
		if err != nil {
			return "", err
		}
		f := os.NewFile(uintptr(fd), rel)
		defer f.Close()
		b := make([]byte, 64)
		n, _ := f.Read(b)
		return string(b[:n]), nil
	}
	for _, rel := range []string{"etc/hostname", "tmp/abs/hostname", "tmp/up/hostname", "../../etc/hostname",
		"tmp/deep/up/../etc/hostname", "tmp/./abs/../etc/hostname"} {
		if got, err := read(rel); err != nil || got != "inside" {
			t.Errorf("%s = %q, %v; want the root's own etc/hostname", rel, got, err)
		}
	}
	for rel, want := range map[string]error{
		"tmp/loop":       unix.ELOOP,
		"tmp/magic":      unix.ENOENT,
		"tmp/host":       unix.ENOENT,
		"tmp/host/dpkg":  unix.ENOENT,
		"tmp/magic/file": unix.ENOENT,
	} {
		if _, err := read(rel); !errors.Is(err, want) {
			t.Errorf("%s: %v, want %v", rel, err, want)
		}
	}
}
