package workspace

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// Flags for opening entries of an untrusted tree. O_NOFOLLOW makes a symlink
// in the last component fail with ELOOP instead of being followed; every
// earlier component is opened the same way by openChain, so no component is
// ever followed. O_NONBLOCK keeps a FIFO swapped in after our fstatat from
// blocking the open; O_NOCTTY keeps a tty from becoming ours.
const (
	dirFlags  = unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC
	fileFlags = unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_NONBLOCK | unix.O_NOCTTY | unix.O_CLOEXEC
)

// Linux bounds: NAME_MAX and PATH_MAX. A longer name from an untrusted list
// cannot exist on disk, so it is rejected before any system call.
const (
	maxName = 255
	maxPath = 4096
)

// maxLinkHops bounds symlink resolution in CopyIn, like the kernel's
// MAXSYMLINKS (40).
const maxLinkHops = 40

func openat(dirfd int, name string, flags int) (int, error) {
	for {
		fd, err := unix.Openat(dirfd, name, flags, 0)
		if err != unix.EINTR {
			return fd, err
		}
	}
}

func lstatat(dirfd int, name string) (unix.Stat_t, error) {
	var st unix.Stat_t
	for {
		err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW)
		if err != unix.EINTR {
			return st, err
		}
	}
}

func fstat(fd int) (unix.Stat_t, error) {
	var st unix.Stat_t
	for {
		err := unix.Fstat(fd, &st)
		if err != unix.EINTR {
			return st, err
		}
	}
}

// readlinkat reads a symlink's target, refusing targets that do not fit in
// PATH_MAX (the kernel never creates one, so a full buffer means trouble).
func readlinkat(dirfd int, name string) (string, error) {
	buf := make([]byte, maxPath)
	n, err := unix.Readlinkat(dirfd, name, buf)
	if err != nil {
		return "", err
	}
	if n >= len(buf) {
		return "", fmt.Errorf("symlink target longer than %d bytes", maxPath-1)
	}
	return string(buf[:n]), nil
}

// openTop opens a directory given as a host path (the workspace, which may be
// a /proc/self/fd/N magic link to a detached mount, so the path itself is
// followed) and returns its fd and stat.
func openTop(path string) (int, unix.Stat_t, error) {
	fd, err := openat(unix.AT_FDCWD, path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC)
	if err != nil {
		return -1, unix.Stat_t{}, &os.PathError{Op: "open", Path: path, Err: err}
	}
	st, err := fstat(fd)
	if err != nil {
		unix.Close(fd)
		return -1, unix.Stat_t{}, &os.PathError{Op: "fstat", Path: path, Err: err}
	}
	return fd, st, nil
}

func fileType(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFREG:
		return "file"
	case unix.S_IFDIR:
		return "dir"
	case unix.S_IFLNK:
		return "symlink"
	default:
		return "other"
	}
}

// describeType names a non-regular type for error messages.
func describeType(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFIFO:
		return "FIFO"
	case unix.S_IFSOCK:
		return "socket"
	case unix.S_IFCHR:
		return "character device"
	case unix.S_IFBLK:
		return "block device"
	default:
		return fileType(mode)
	}
}

// splitRel validates a slash-separated path relative to a root, as it comes
// from an untrusted list (a diff, a guest agent), and returns its
// components. It accepts only paths that name an entry strictly beneath the
// root: no absolute paths, no ".", "..", or empty components, no NUL.
func splitRel(p string) ([]string, error) {
	switch {
	case p == "":
		return nil, errors.New("empty path")
	case len(p) >= maxPath:
		return nil, fmt.Errorf("path longer than %d bytes", maxPath-1)
	case strings.IndexByte(p, 0) >= 0:
		return nil, errors.New("path contains a NUL byte")
	case p[0] == '/':
		return nil, errors.New("path is absolute")
	}
	comps := strings.Split(p, "/")
	for _, c := range comps {
		switch {
		case c == "" || c == "." || c == "..":
			return nil, fmt.Errorf("path component %q is not allowed", c)
		case len(c) > maxName:
			return nil, fmt.Errorf("path component longer than %d bytes", maxName)
		}
	}
	return comps, nil
}

// chainError says which component of a chain could not be opened as a
// directory, and why in plain words.
type chainError struct {
	Path string // the components up to the failing one, slash-joined
	Err  error
}

func (e *chainError) Error() string {
	switch {
	case errors.Is(e.Err, unix.ELOOP), errors.Is(e.Err, unix.ENOTDIR):
		return fmt.Sprintf("%q is not a directory (a symlink or another type; it may have been swapped after the diff): not followed", e.Path)
	case errors.Is(e.Err, unix.ENOENT):
		return fmt.Sprintf("%q no longer exists", e.Path)
	case errors.Is(e.Err, errCrossMount):
		return fmt.Sprintf("%q is on another filesystem than the workspace: not entered", e.Path)
	}
	return fmt.Sprintf("open %q: %v", e.Path, e.Err)
}

func (e *chainError) Unwrap() error { return e.Err }

var errCrossMount = errors.New("crosses a mount point")

// openChain opens the directory named by comps beneath rootfd, one component
// at a time with O_NOFOLLOW|O_DIRECTORY, and checks each one is a directory
// on device dev (a mount inside the workspace is never entered). It returns
// an fd the caller closes (a dup of rootfd when comps is empty) and the stat
// of every opened component.
func openChain(rootfd int, dev uint64, comps []string) (int, []unix.Stat_t, error) {
	cur, err := unix.FcntlInt(uintptr(rootfd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return -1, nil, err
	}
	sts := make([]unix.Stat_t, 0, len(comps))
	for i, c := range comps {
		next, err := openat(cur, c, dirFlags)
		unix.Close(cur)
		if err != nil {
			return -1, nil, &chainError{Path: strings.Join(comps[:i+1], "/"), Err: err}
		}
		cur = next
		st, err := fstat(cur)
		if err == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR {
			err = unix.ENOTDIR
		}
		if err == nil && st.Dev != dev {
			err = errCrossMount
		}
		if err != nil {
			unix.Close(cur)
			return -1, nil, &chainError{Path: strings.Join(comps[:i+1], "/"), Err: err}
		}
		sts = append(sts, st)
	}
	return cur, sts, nil
}

// openRegular opens name beneath dirfd as a regular file without following a
// symlink, and checks it is the same inode as want (from an earlier
// fstatat), so an entry swapped between the two calls is refused.
func openRegular(dirfd int, name string, want *unix.Stat_t) (*os.File, unix.Stat_t, error) {
	fd, err := openat(dirfd, name, fileFlags)
	if err == unix.ELOOP {
		return nil, unix.Stat_t{}, errors.New("is now a symlink (swapped while being opened?): not followed")
	}
	if err != nil {
		return nil, unix.Stat_t{}, err
	}
	st, err := fstat(fd)
	if err != nil {
		unix.Close(fd)
		return nil, unix.Stat_t{}, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return nil, unix.Stat_t{}, fmt.Errorf("is a %s, not a regular file", describeType(st.Mode))
	}
	if want != nil && (st.Dev != want.Dev || st.Ino != want.Ino) {
		unix.Close(fd)
		return nil, unix.Stat_t{}, errors.New("was replaced while being opened")
	}
	return os.NewFile(uintptr(fd), name), st, nil
}
