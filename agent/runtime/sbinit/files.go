package sbinit

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth"
)

// This file is the init's side of the files API (ISO-3): every path is resolved inside the
// sandbox's file root, never on the host, and content streams in both directions.

// resolveFlags keep a lookup inside the file root: ".." stops at it, absolute symlinks are
// taken relative to it, and /proc's magic links (which could name any open file) are refused.
const resolveFlags = unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS

// rel turns the sandbox path p into a path relative to the file root ("." for the root).
func (s *server) rel(p string) (string, error) {
	if !strings.HasPrefix(p, "/") || path.Clean(p) != p || strings.IndexByte(p, 0) >= 0 {
		return "", berth.Errorf(berth.EInvalidRequest, "path %q must be a clean absolute path", p)
	}
	prefix := s.cfg.Files.Prefix
	switch {
	case prefix == "":
		p = strings.TrimPrefix(p, "/")
	case p == prefix:
		p = ""
	case strings.HasPrefix(p, prefix+"/"):
		p = p[len(prefix)+1:]
	default:
		return "", berth.Errorf(berth.EForbidden, "path %q is outside the sandbox: without isolation the files API reaches only %s", p, prefix)
	}
	if p == "" {
		return ".", nil
	}
	return p, nil
}

// openIn opens rel inside the file root (resolveFlags). Where openat2 does not exist (gVisor)
// a confined root — whose "/" is the sandbox's own — is walked by openInRoot instead.
func (s *server) openIn(rel string, flags int, mode uint32) (int, error) {
	root, err := unix.Open(s.cfg.Files.Dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, &os.PathError{Op: "open", Path: s.cfg.Files.Dir, Err: err}
	}
	defer unix.Close(root)
	fd, err := unix.Openat2(root, rel, &unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC), Mode: uint64(mode), Resolve: resolveFlags})
	if errors.Is(err, unix.ENOSYS) && s.cfg.Files.Confined {
		fd, err = openInRoot(root, rel, flags, mode)
	}
	if err != nil {
		return -1, &os.PathError{Op: "open", Path: rel, Err: err}
	}
	return fd, nil
}

// maxLinks bounds the symlinks one lookup follows, as the kernel's ELOOP does.
const maxLinks = 40

// openInRoot opens rel inside the directory root (an O_PATH descriptor) the way openat2's
// RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS would, for kernels without openat2 (gVisor): one
// component at a time, every symlink read as text and resolved as a path — an absolute one
// from root, ".." never above root — and never opened itself. So a /proc magic link, whose
// text is "pipe:[3]" or "host:[4]" rather than a path, resolves to nothing: the files API
// cannot reach a file through another process's descriptors (the escape suite's attempt).
func openInRoot(root int, rel string, flags int, mode uint32) (int, error) {
	dir, err := unix.Dup(root)
	if err != nil {
		return -1, err
	}
	depth := 0 // directories below root that dir is, for ".."
	var stack []int
	closeAll := func() {
		unix.Close(dir)
		for _, fd := range stack {
			unix.Close(fd)
		}
	}
	parts := strings.Split(rel, "/")
	links := 0
	for len(parts) > 0 {
		name := parts[0]
		parts = parts[1:]
		switch name {
		case "", ".":
			continue
		case "..":
			if depth > 0 {
				unix.Close(dir)
				dir, stack = stack[len(stack)-1], stack[:len(stack)-1]
				depth--
			}
			continue
		}
		var st unix.Stat_t
		if err := unix.Fstatat(dir, name, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
			if links++; links > maxLinks {
				closeAll()
				return -1, unix.ELOOP
			}
			target, err := readlinkat(dir, name)
			if err != nil {
				closeAll()
				return -1, err
			}
			if strings.HasPrefix(target, "/") {
				closeAll()
				if dir, err = unix.Dup(root); err != nil {
					return -1, err
				}
				depth, stack = 0, nil
			}
			parts = append(strings.Split(target, "/"), parts...)
			continue
		} else if err != nil && !(len(parts) == 0 && errors.Is(err, unix.ENOENT) && flags&unix.O_CREAT != 0) {
			closeAll()
			return -1, err
		}
		if len(parts) == 0 || allEmpty(parts) {
			fd, err := unix.Openat(dir, name, flags|unix.O_NOFOLLOW|unix.O_CLOEXEC, mode)
			closeAll()
			return fd, err
		}
		next, err := unix.Openat(dir, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			closeAll()
			return -1, err
		}
		stack = append(stack, dir)
		dir, depth = next, depth+1
	}
	fd, err := unix.Openat(dir, ".", flags|unix.O_CLOEXEC, mode)
	closeAll()
	return fd, err
}

// allEmpty reports whether every element of parts is "" or "." (a trailing "/" or "/.").
func allEmpty(parts []string) bool {
	for _, p := range parts {
		if p != "" && p != "." {
			return false
		}
	}
	return true
}

// readlinkat returns the text of symlink name in dir.
func readlinkat(dir int, name string) (string, error) {
	buf := make([]byte, 4096)
	n, err := unix.Readlinkat(dir, name, buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}

// dir opens directory rel inside the file root, creating missing components (0755) one at a
// time: each mkdirat names one component under a directory already resolved inside the
// root, so no symlink can redirect the creation.
func (s *server) dir(rel string) (int, error) {
	fd, err := s.openIn(rel, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err == nil || !errors.Is(err, unix.ENOENT) {
		return fd, err
	}
	cur := "."
	for _, part := range strings.Split(rel, "/") {
		next := path.Join(cur, part)
		fd, err := s.openIn(next, unix.O_PATH|unix.O_DIRECTORY, 0)
		if errors.Is(err, unix.ENOENT) {
			parent, perr := s.openIn(cur, unix.O_PATH|unix.O_DIRECTORY, 0)
			if perr != nil {
				return -1, perr
			}
			merr := unix.Mkdirat(parent, part, 0o755)
			unix.Close(parent)
			if merr != nil && !errors.Is(merr, unix.EEXIST) {
				return -1, &os.PathError{Op: "mkdir", Path: next, Err: merr}
			}
			fd, err = s.openIn(next, unix.O_PATH|unix.O_DIRECTORY, 0)
		}
		if err != nil {
			return -1, err
		}
		unix.Close(fd)
		cur = next
	}
	return s.openIn(rel, unix.O_PATH|unix.O_DIRECTORY, 0)
}

// writeFile streams a framed upload into req.Path (see the protocol in wire.go): a
// temporary file beside the target, renamed over it only once the end frame came, so a
// reader never sees half a file and a cut upload changes nothing. Parent directories are
// created. An existing target that is a directory or another non-regular file (FIFO, device)
// is refused; a symlink is replaced, never followed.
func (s *server) writeFile(c net.Conn, br *bufio.Reader, req wireRequest) wireResponse {
	rel, err := s.rel(req.Path)
	if err != nil {
		return errResponse(err)
	}
	if rel == "." {
		return wireResponse{Code: berth.EInvalidRequest, Message: req.Path + " is a directory"}
	}
	dirRel, base := path.Split(rel)
	dirRel = strings.TrimSuffix(dirRel, "/")
	if dirRel == "" {
		dirRel = "."
	}
	dfd, err := s.dir(dirRel)
	if err != nil {
		return fileErr(req.Path, err)
	}
	defer unix.Close(dfd)
	var st unix.Stat_t
	if err := unix.Fstatat(dfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil {
		if m := st.Mode & unix.S_IFMT; m != unix.S_IFREG && m != unix.S_IFLNK {
			return notRegular(req.Path, m)
		}
	}
	tmp := ".berth-upload-" + randomHex()
	fd, err := unix.Openat(dfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return fileErr(req.Path, &os.PathError{Op: "create", Path: req.Path, Err: err})
	}
	f := os.NewFile(uintptr(fd), tmp)
	discard := func() { f.Close(); unix.Unlinkat(dfd, tmp, 0) }
	if err := writeResponse(c, wireResponse{}); err != nil {
		discard()
		return wireResponse{Code: berth.EInvalidRequest, Message: "upload cut"}
	}
	n, err := io.Copy(f, io.LimitReader(&frameReader{r: br}, MaxFileBytes+1))
	switch {
	case n > MaxFileBytes:
		discard()
		return wireResponse{Code: berth.ETooLarge, Message: fmt.Sprintf("file over %d bytes", MaxFileBytes)}
	case errors.Is(err, io.ErrUnexpectedEOF):
		discard()
		return wireResponse{Code: berth.EInvalidRequest, Message: "upload cut before its end: nothing was written"}
	case err != nil:
		discard()
		return fileErr(req.Path, err)
	}
	if err := f.Close(); err != nil {
		unix.Unlinkat(dfd, tmp, 0)
		return fileErr(req.Path, err)
	}
	if err := unix.Renameat(dfd, tmp, dfd, base); err != nil {
		unix.Unlinkat(dfd, tmp, 0)
		return fileErr(req.Path, &os.PathError{Op: "rename", Path: req.Path, Err: err})
	}
	return wireResponse{}
}

// readFile answers the size of req.Path and streams its content; it refuses directories,
// FIFOs, devices and files over MaxFileBytes.
func (s *server) readFile(c net.Conn, req wireRequest) {
	rel, err := s.rel(req.Path)
	if err != nil {
		writeResponse(c, errResponse(err))
		return
	}
	// O_NONBLOCK: a FIFO fails or answers at once instead of hanging the open.
	fd, err := s.openIn(rel, unix.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		writeResponse(c, fileErr(req.Path, err))
		return
	}
	f := os.NewFile(uintptr(fd), req.Path)
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		writeResponse(c, fileErr(req.Path, err))
		return
	}
	if !st.Mode().IsRegular() {
		var m uint32 = unix.S_IFIFO
		if st.IsDir() {
			m = unix.S_IFDIR
		}
		writeResponse(c, notRegular(req.Path, m))
		return
	}
	if st.Size() > MaxFileBytes {
		writeResponse(c, wireResponse{Code: berth.ETooLarge, Message: fmt.Sprintf("%s is over %d bytes", req.Path, MaxFileBytes)})
		return
	}
	if writeResponse(c, wireResponse{Size: st.Size()}) != nil {
		return
	}
	// A file that shrinks meanwhile ends the stream short; the client sees it.
	io.CopyN(c, f, st.Size())
}

// notRegular refuses anything but a regular file: a FIFO or device would hang or never end.
func notRegular(p string, mode uint32) wireResponse {
	if mode == unix.S_IFDIR {
		return wireResponse{Code: berth.EInvalidRequest, Message: p + " is a directory"}
	}
	return wireResponse{Code: berth.EInvalidRequest, Message: p + " is not a regular file"}
}

// fileErr maps a file-system error to a berth code: missing → not_found, wrong kind of path
// (or a name too long for the file system) → invalid_request, a lookup that would leave the sandbox (a /proc magic link) →
// invalid_request, denied → forbidden, anything else (I/O error, disk full, a /proc file that
// refuses) conflict: the state of the sandbox's file system, never a server bug (API-2).
func fileErr(p string, err error) wireResponse {
	code := berth.EConflict
	switch {
	case errors.Is(err, os.ErrNotExist):
		code = berth.ENotFound
	case errors.Is(err, unix.EISDIR), errors.Is(err, unix.ENOTDIR), errors.Is(err, unix.EROFS),
		errors.Is(err, unix.ELOOP), errors.Is(err, unix.EXDEV), errors.Is(err, unix.ENAMETOOLONG):
		code = berth.EInvalidRequest
	case errors.Is(err, os.ErrPermission):
		code = berth.EForbidden
	case errors.Is(err, unix.ENOSPC), errors.Is(err, unix.EDQUOT):
		return wireResponse{Code: berth.EConflict, Message: p + ": the sandbox's disk is full"}
	}
	msg := err.Error()
	var pe *os.PathError
	if errors.As(err, &pe) {
		msg = p + ": " + pe.Err.Error() // the sandbox's path, not the init's view of it
	}
	return wireResponse{Code: code, Message: msg}
}

func randomHex() string {
	b := make([]byte, 8)
	rand.Read(b)
	return hex.EncodeToString(b)
}
