package cgroup

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// maxFileSize bounds every read of a cgroup interface file. The largest one
// we read is cgroup.procs; 1 MiB holds ~140k pids, far above any pids.max we set.
const maxFileSize = 1 << 20

// fsOps is the directory side of cgroupfs. On a real cgroupfs mkdir makes
// the interface files and rmdir removes a directory that still "contains"
// them; a plain directory in t.TempDir() does neither, so tests substitute
// these operations to exercise everything else (file writes, reads, parent
// selection) against a fake tree. writable is here because root passes
// every access check, so a test cannot make a directory unwritable to it.
type fsOps struct {
	mkdir    func(path string) error
	rmdir    func(path string) error
	writable func(dir string) bool
	// delegated says whether a service manager delegated the cgroup dir
	// to this process (systemd's Delegate=yes); see isDelegated.
	delegated func(dir string) bool
}

var realFS = fsOps{
	mkdir: func(path string) error { return unix.Mkdir(path, 0o755) },
	rmdir: unix.Rmdir,
	writable: func(dir string) bool {
		// AT_EACCESS: judge by the effective ids, which are what mkdir uses.
		return unix.Faccessat(unix.AT_FDCWD, dir, unix.W_OK, unix.AT_EACCESS) == nil
	},
	delegated: isDelegated,
}

// delegateXattrs mark a cgroup that systemd delegated (Delegate=yes): it
// sets trusted.delegate=1 (systemd 251 on; only root can read trusted.*)
// and user.delegate=1 (252 on, for unprivileged managers). See
// https://systemd.io/CGROUP_DELEGATION/.
var delegateXattrs = []string{"trusted.delegate", "user.delegate"}

// isDelegated reports whether dir carries one of delegateXattrs with the
// value "1". Any error (no such attribute, a filesystem without xattrs,
// an old kernel) means no: moat then keeps its usual choice of parent.
func isDelegated(dir string) bool {
	for _, name := range delegateXattrs {
		buf := make([]byte, 16)
		n, err := unix.Getxattr(dir, name, buf)
		if err == nil && string(buf[:n]) == "1" {
			return true
		}
	}
	return false
}

// writeFile writes s to an existing cgroup interface file in one write(2),
// which is how cgroupfs expects values to arrive. It never creates a file:
// cgroupfs refuses that anyway, and on a fake tree a missing file must show
// up as ENOENT just as it would on a kernel without the feature.
func writeFile(path, s string) error {
	fd, err := openRetry(path, unix.O_WRONLY|unix.O_TRUNC|unix.O_CLOEXEC)
	if err != nil {
		return &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	for {
		_, err = unix.Write(fd, []byte(s))
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("write %q to %s: %w", s, path, err)
	}
	return nil
}

// readFile reads a cgroup interface file, bounded by maxFileSize.
func readFile(path string) ([]byte, error) {
	fd, err := openRetry(path, unix.O_RDONLY|unix.O_CLOEXEC)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	buf := make([]byte, 0, 512)
	for {
		if len(buf) == cap(buf) {
			if cap(buf) >= maxFileSize {
				return nil, fmt.Errorf("read %s: larger than %d bytes", path, maxFileSize)
			}
			buf = append(buf, make([]byte, cap(buf))...)[:len(buf)]
		}
		n, err := unix.Read(fd, buf[len(buf):cap(buf)])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, &os.PathError{Op: "read", Path: path, Err: err}
		}
		if n == 0 {
			return buf, nil
		}
		buf = buf[:len(buf)+n]
	}
}

func openRetry(path string, flags int) (int, error) {
	for {
		fd, err := unix.Open(path, flags, 0)
		if err != unix.EINTR {
			return fd, err
		}
	}
}

// exists reports whether path exists (any error other than ENOENT counts as
// existing, so that a permission problem surfaces at the following write).
func exists(path string) bool {
	var st unix.Stat_t
	return !errors.Is(unix.Stat(path, &st), unix.ENOENT)
}
