package process

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/agent/runtime/rootfs"
)

// This file is stage 1 of an isolated init (ISO-1, ISO-2). Root inside fresh PID, mount, UTS,
// IPC and network namespaces, it builds the sandbox's root in <dir>/mnt and pivots into it:
//
//	/            the layout's Dir, read-only, nosuid, nodev
//	<bind>       each of the layout's Binds (the host's /usr, /lib*), read-only, nosuid, nodev
//	/proc        a proc of the sandbox's PID namespace
//	/dev         a read-only tmpfs: null, zero, full, random, urandom bound from the
//	             host, the fd and std* links, and a tmpfs /dev/shm
//	/tmp         a tmpfs of tmpMiB, owned by the sandbox's uid (charged to its memory cgroup,
//	             never on the host's disk)
//	/tmp/volume  the volume, if any, idmapped so its files (owned by volumeOwner on disk)
//	             are the sandbox uid's
//
// No /sys: no cgroup file system or host device is in view. Once the host's root is detached
// nothing of it is reachable — not its /tmp, /root, /var, the runtime's Dir nor any other
// sandbox's socket. Mount targets are opened inside the new root without following any
// symlink, so a custom root cannot aim a mount at the host. Binds use the new mount API
// (open_tree, mount_setattr, move_mount: Linux 5.12 or later, which New checks).

// mntDir is the mount point of the sandbox's root inside <Dir>/<id>; the mounts exist only in
// the sandbox's mount namespace, so on the host it stays an empty directory.
const mntDir = "mnt"

// devNodes are the host devices a sandbox's /dev holds.
var devNodes = []string{"null", "zero", "full", "random", "urandom"} // no tty: the host's terminals stay out

// roAttrs are the attributes of every read-only bind: no setuid binary nor device file on
// them works.
const roAttrs = unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV

// setupIsolated is stage 1 of an isolated init. It returns only on failure: on success stage
// 2 has replaced the process (drop.go).
func setupIsolated(c initConfig) error {
	var layout rootfs.Layout
	if err := json.Unmarshal([]byte(c.rootfs), &layout); err != nil || layout.Dir == "" {
		return fmt.Errorf("bad root file system layout %q", c.rootfs)
	}
	if c.uid < uidBase || c.uid >= uidBase+uidSlots {
		return fmt.Errorf("uid %d is not a sandbox uid", c.uid)
	}
	// Nothing inherited reaches a child of stage 1 (the volume's helper); dropAndExec hands
	// stage 2 exactly what it needs.
	closeOnExecFrom(3)
	// Propagation first: nothing mounted below may reach the host's mount namespace.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	// A /proc of this PID namespace, in this mount namespace only: /proc/<pid> must name our
	// pids (the volume's user namespace is set up through it), and /proc/self/fd/N is how
	// mounts are aimed at the descriptors of their targets.
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount /proc: %w", err)
	}
	host := c.id
	if len(host) > 64 {
		host = host[:64]
	}
	if err := unix.Sethostname([]byte(host)); err != nil {
		return fmt.Errorf("set hostname: %w", err)
	}
	if err := loopbackUp(); err != nil {
		return fmt.Errorf("bring up lo: %w", err)
	}
	// Apps may listen on port 80 with no capability. The setting is the network namespace's:
	// the sandbox's own, never the host's (New requires a network namespace).
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_unprivileged_port_start", []byte("0"), 0o644); err != nil {
		return fmt.Errorf("allow low ports: %w", err)
	}
	// The socket is bound at its host path now; its descriptor outlives the pivot and the
	// exec into stage 2.
	lfd, err := bindSocket(c.socket())
	if err != nil {
		return err
	}
	// This binary, to exec stage 2 from once the host's root is gone.
	exe, err := os.Open("/proc/self/exe")
	if err != nil {
		return fmt.Errorf("open own binary: %w", err)
	}
	defer exe.Close()
	mnt := filepath.Join(c.dir, mntDir)
	if err := buildRoot(c, layout, mnt); err != nil {
		return err
	}
	if err := pivotInto(mnt); err != nil {
		return err
	}
	return dropAndExec(c, exe, lfd)
}

// bindSocket makes the init's listening socket at path.
func bindSocket(path string) (int, error) {
	os.Remove(path)
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("bind %s: %w", path, err)
	}
	if err := unix.Listen(fd, 1024); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("listen on %s: %w", path, err)
	}
	return fd, nil
}

// buildRoot mounts the sandbox's root at mnt (see the file comment).
func buildRoot(c initConfig, layout rootfs.Layout, mnt string) error {
	target, err := unix.Open(mnt, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("root mount point: %w", err)
	}
	err = bindAt(layout.Dir, target, roAttrs, -1)
	unix.Close(target)
	if err != nil {
		return err
	}
	root, err := unix.Open(mnt, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0) // the bind now
	if err != nil {
		return fmt.Errorf("open the sandbox's root: %w", err)
	}
	defer unix.Close(root)
	for _, b := range layout.Binds {
		if err := bindIn(root, b.Target, b.Source, roAttrs, -1); err != nil {
			return err
		}
	}
	if err := mountIn(root, "proc", "proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return err
	}
	if err := setupDev(root, c.shmMiB); err != nil {
		return err
	}
	tmp := fmt.Sprintf("size=%dm,mode=1777,uid=%d,gid=%d", c.tmpMiB, c.uid, c.uid)
	if err := mountIn(root, "tmp", "tmpfs", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, tmp); err != nil {
		return err
	}
	if c.volume != "" {
		return mountVolume(root, c)
	}
	return nil
}

// openIn opens rel inside root as a path descriptor, refusing any symlink on the way.
func openIn(root int, rel string, flags int) (int, error) {
	rel = strings.TrimPrefix(rel, "/")
	fd, err := unix.Openat2(root, rel, &unix.OpenHow{
		Flags:   uint64(flags | unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC),
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return -1, fmt.Errorf("mount point /%s: %w", rel, err)
	}
	return fd, nil
}

func fdPath(fd int) string { return fmt.Sprintf("/proc/self/fd/%d", fd) }

// mountIn mounts a new file system (proc, tmpfs) on directory rel of root.
func mountIn(root int, rel, source, fstype string, flags uintptr, data string) error {
	fd, err := openIn(root, rel, unix.O_DIRECTORY)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Mount(source, fdPath(fd), fstype, flags, data); err != nil {
		return fmt.Errorf("mount %s on /%s: %w", fstype, strings.TrimPrefix(rel, "/"), err)
	}
	return nil
}

// bindIn binds the host's source onto rel of root.
func bindIn(root int, rel, source string, attr uint64, userns int) error {
	fd, err := openIn(root, rel, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return bindAt(source, fd, attr, userns)
}

// bindAt binds the host's source onto the target descriptor with attr, idmapped through the
// user namespace userns unless it is -1. The bind is made detached, given its attributes and
// then attached, so it is never visible writable or with setuid allowed, not even briefly.
func bindAt(source string, target int, attr uint64, userns int) error {
	tree, err := unix.OpenTree(unix.AT_FDCWD, source, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return fmt.Errorf("bind %s: %w", source, err)
	}
	defer unix.Close(tree)
	ma := unix.MountAttr{Attr_set: attr, Propagation: unix.MS_PRIVATE}
	if userns >= 0 {
		ma.Attr_set |= unix.MOUNT_ATTR_IDMAP
		ma.Userns_fd = uint64(userns)
	}
	if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH, &ma); err != nil {
		return fmt.Errorf("bind %s: set attributes: %w", source, err)
	}
	if err := unix.MoveMount(tree, "", target, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH); err != nil {
		return fmt.Errorf("bind %s: attach: %w", source, err)
	}
	return nil
}

// setupDev mounts the sandbox's /dev: a small tmpfs holding the host's harmless devices and
// /dev/shm, then made read-only.
func setupDev(root int, shmMiB int64) error {
	if err := mountIn(root, "dev", "tmpfs", "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, "mode=0755,size=64k"); err != nil {
		return err
	}
	dev, err := openIn(root, "dev", unix.O_DIRECTORY) // the tmpfs now
	if err != nil {
		return err
	}
	defer unix.Close(dev)
	for _, name := range devNodes {
		host := "/dev/" + name
		if st, err := os.Stat(host); err != nil || st.Mode()&os.ModeDevice == 0 {
			continue // this host lacks it
		}
		fd, err := unix.Openat(dev, name, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o666)
		if err != nil {
			return fmt.Errorf("/dev/%s: %w", name, err)
		}
		unix.Close(fd)
		// The bind of a device keeps its own mount flags (nodev unset), unlike the tmpfs.
		if err := bindIn(root, "dev/"+name, host, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NOEXEC, -1); err != nil {
			return err
		}
	}
	for name, target := range map[string]string{"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0",
		"stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2"} {
		if err := unix.Symlinkat(target, dev, name); err != nil {
			return fmt.Errorf("/dev/%s: %w", name, err)
		}
	}
	if err := unix.Mkdirat(dev, "shm", 0o755); err != nil {
		return fmt.Errorf("/dev/shm: %w", err)
	}
	shm := fmt.Sprintf("mode=1777,size=%dm", shmMiB)
	if err := mountIn(root, "dev/shm", "shm", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, shm); err != nil {
		return err
	}
	ro := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NODEV}
	if err := unix.MountSetattr(dev, "", unix.AT_EMPTY_PATH, &ro); err != nil {
		return fmt.Errorf("make /dev read-only: %w", err)
	}
	return nil
}

// mountVolume binds the volume at /tmp/volume, idmapped: files volumeOwner owns on disk are
// the sandbox uid's inside, and what the sandbox creates lands on disk as volumeOwner's, so
// the next sandbox on the volume (another uid) owns them too.
func mountVolume(root int, c initConfig) error {
	tmp, err := openIn(root, "tmp", unix.O_DIRECTORY) // the tmpfs now
	if err != nil {
		return err
	}
	err = unix.Mkdirat(tmp, volumeName, 0o755)
	unix.Close(tmp)
	if err != nil {
		return fmt.Errorf("volume mount point: %w", err)
	}
	userns, err := volumeUserns(c.uid)
	if err != nil {
		return err
	}
	defer unix.Close(userns)
	if err := bindIn(root, "tmp/"+volumeName, c.volume, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV, userns); err != nil {
		return fmt.Errorf("volume (its file system must support idmapped mounts): %w", err)
	}
	return nil
}

// volumeUserns returns a user namespace mapping volumeOwner inside to uid outside (both uid
// and gid), the idmapping of the volume's mount. A namespace needs a process: a helper (this
// binary, "-hold") lives in it until its descriptor is open.
func volumeUserns(uid int) (int, error) {
	cmd := exec.Command("/proc/self/exe", initArg, "-hold")
	cmd.Args[0] = "berth-sandbox"
	cmd.Env = []string{}
	idmap := []syscall.SysProcIDMap{{ContainerID: volumeOwner, HostID: uid, Size: 1}}
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER, UidMappings: idmap, GidMappings: idmap}
	in, err := cmd.StdinPipe()
	if err != nil {
		return -1, fmt.Errorf("volume user namespace: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return -1, fmt.Errorf("volume user namespace: %w", err)
	}
	fd, err := unix.Open(fmt.Sprintf("/proc/%d/ns/user", cmd.Process.Pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	in.Close()
	cmd.Wait()
	if err != nil {
		return -1, fmt.Errorf("volume user namespace: %w", err)
	}
	return fd, nil
}

// pivotInto makes mnt the root and detaches the host's: pivot_root(".", ".") stacks the old
// root on the new one, and a lazy unmount of "." drops it with every host mount below it.
func pivotInto(mnt string) error {
	fd, err := unix.Open(mnt, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open new root: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Fchdir(fd); err != nil {
		return fmt.Errorf("enter new root: %w", err)
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach the host's root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return fmt.Errorf("chdir /: %w", err)
	}
	if _, err := os.Stat("/proc/self"); errors.Is(err, os.ErrNotExist) {
		return errors.New("no /proc in the new root")
	}
	return nil
}
