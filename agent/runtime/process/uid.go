package process

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth"
)

// Every isolated sandbox runs as a host uid and gid of its own (ISO-1), leased from the range
// [uidBase, uidBase+uidSlots). Distinct uids keep what the kernel accounts per user — user
// keyrings, inotify instances, RLIMIT_NPROC — from being shared between sandboxes, and make
// every file a sandbox creates traceable to it.
const (
	uidBase  = 200000
	uidSlots = 65536
)

// volumeOwner is the uid and gid that own a volume's files on disk: 1000, the "sandbox" user
// of the built-in /etc/passwd and the uid gVisor sandboxes run as, so a volume's files keep
// one owner whichever runtime or sandbox wrote them. A sandbox sees them as its own through an
// idmapped mount (mount.go).
const volumeOwner = 1000

// uidLockFile is where leases are held: a lease of slot n is an exclusive open-file-
// description lock on byte n. So it is host-wide — several runtimes, in one process or many
// (parallel test binaries, several agents), never hand out the same uid — and it ends by
// itself once every holder of its descriptor is gone: the runtime that leased it and the
// sandbox's init, which inherits it, so a uid is not reused while a process of its sandbox
// may live.
var uidLockFile = "/run/berth/uids.lock"

// uidLease is one leased uid (also the sandbox's gid).
type uidLease struct {
	uid  int
	file *os.File // holds the lock; passed to the init
}

// uidCursor is where the next search for a free slot starts in this process: slots are handed
// out round-robin, so a uid is reused as late as possible (per-uid kernel state such as the
// user keyring may outlive a sandbox's processes).
var uidCursor struct {
	sync.Mutex
	next int
}

// leaseUID leases a free sandbox uid. Errors: EUnavailable when every slot is leased; the lock
// file's directory cannot be made or is not root's alone (checkUIDLockDir).
func leaseUID() (*uidLease, error) {
	if err := checkUIDLockDir(); err != nil {
		return nil, err
	}
	uidCursor.Lock()
	defer uidCursor.Unlock()
	for i := range uidSlots {
		slot := (uidCursor.next + i) % uidSlots
		// A descriptor of its own per attempt: locks of one open file description never
		// conflict with each other.
		f, err := os.OpenFile(uidLockFile, os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW, 0o600)
		if err != nil {
			return nil, fmt.Errorf("process: uid lock: %w", err)
		}
		lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: io.SeekStart, Start: int64(slot), Len: 1}
		if err := unix.FcntlFlock(f.Fd(), unix.F_OFD_SETLK, &lk); err != nil {
			f.Close()
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EACCES) {
				continue // leased by a live sandbox
			}
			return nil, fmt.Errorf("process: uid lock %d: %w", uidBase+slot, err)
		}
		uidCursor.next = slot + 1
		return &uidLease{uid: uidBase + slot, file: f}, nil
	}
	return nil, berth.Errorf(berth.EUnavailable, "every sandbox uid in %d..%d is leased", uidBase, uidBase+uidSlots-1)
}

// checkUIDLockDir makes the lock file's directory if missing and checks that it is a
// directory only root can write: anyone else could take or fake leases.
func checkUIDLockDir() error {
	dir := filepath.Dir(uidLockFile)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("process: uid lock dir: %w", err)
	}
	st, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("process: uid lock dir: %w", err)
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); !st.IsDir() || !ok || sys.Uid != 0 || st.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("process: uid lock dir %s must be a directory of root's that only root can write", dir)
	}
	return nil
}

// release drops the runtime's hold on the lease; the lock ends once the init's copy is gone
// too. A nil lease is fine.
func (l *uidLease) release() {
	if l != nil {
		l.file.Close()
	}
}
