package nsinit

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/guest/nsinit/nswire"
	"github.com/moat-sandbox/moat/internal/rootfs"
)

// forwardTo, in OCI mode, is the program's pid once it runs: init then
// passes the signals it receives (the runtime's `kill`, which signals the
// container's init pid as runc's callers expect) to the program's process
// group. 0: absorb them (a Moat run, whose host signals with frames).
var forwardTo atomic.Int64

// ociWaiting is set while an OCI container's init waits for `start`: a
// terminating signal then ends the container, as it would end runc's
// init blocked on its FIFO.
var ociWaiting atomic.Bool

// handleSignal is what init does with a signal it caught.
func handleSignal(sig os.Signal) {
	s, ok := sig.(unix.Signal)
	if !ok {
		return
	}
	if p := forwardTo.Load(); p > 0 {
		unix.Kill(-int(p), s)
		return
	}
	if ociWaiting.Load() {
		switch s {
		case unix.SIGTERM, unix.SIGINT, unix.SIGHUP, unix.SIGQUIT:
			os.Exit(128 + int(s))
		}
	}
}

// receiveTrees reads the detached mounts the host sends on OCIFDSocket:
// the root tree first, then one per bind mount.
func receiveTrees(want int) ([]int, error) {
	oob := make([]byte, unix.CmsgSpace(4*want))
	buf := make([]byte, 16)
	_, oobn, _, _, err := unix.Recvmsg(nswire.OCIFDSocket, buf, oob, unix.MSG_CMSG_CLOEXEC)
	unix.Close(nswire.OCIFDSocket)
	if err != nil {
		return nil, fmt.Errorf("receive the container's mounts: %w", err)
	}
	fds := rights(oob[:oobn])
	if len(fds) != want {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return nil, fmt.Errorf("receive the container's mounts: got %d trees, want %d", len(fds), want)
	}
	return fds, nil
}

// ociBuildRoot assembles an OCI container's root under cfg.Root (an empty
// directory of the runtime's state, reachable in the mount namespace we
// start in) and pivots into it:
//
//	cfg.Root            tmpfs, the container's private scratch
//	  lower/            the bundle's rootfs, id-mapped by the host so that
//	                    its owner (host root) is the container's root
//	  upper/ work/      the overlay's writable half (tmpfs: gone with us)
//	  root/             overlay of the two: the container's /
//
// The overlay exists even for a read-only root: mount points the image
// lacks (/proc, /dev, /tmp, the spec's mounts) are made in it without
// ever writing the bundle, then the root is made read-only.
func ociBuildRoot(cfg *nswire.Config) error {
	o := cfg.OCI
	nbinds := 0
	for _, m := range o.Mounts {
		if m.Type == "bind" {
			nbinds++
		}
	}
	trees, err := receiveTrees(1 + nbinds)
	if err != nil {
		return err
	}
	defer func() {
		for _, fd := range trees {
			unix.Close(fd)
		}
	}()
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make / private: %w", err)
	}
	stage := cfg.Root
	if err := unix.Mount("tmpfs", stage, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, fmt.Sprintf("mode=0700,size=%d", o.RootBytes)); err != nil {
		return fmt.Errorf("mount the container's scratch tmpfs on %s: %w", stage, err)
	}
	for _, d := range []string{"lower", "upper", "work", "root"} {
		if err := os.Mkdir(filepath.Join(stage, d), 0o755); err != nil {
			return fmt.Errorf("container scratch: %w", err)
		}
	}
	lower, root := filepath.Join(stage, "lower"), filepath.Join(stage, "root")
	if err := unix.MoveMount(trees[0], "", unix.AT_FDCWD, lower, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("attach the bundle's rootfs: %w", err)
	}
	// userxattr: this user namespace cannot write trusted.* xattrs, where
	// overlayfs keeps its whiteouts by default.
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s,userxattr", lower, filepath.Join(stage, "upper"), filepath.Join(stage, "work"))
	if err := unix.Mount("overlay", root, "overlay", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("mount the container's root overlay: %w", err)
	}
	rootFD, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open the container's root: %w", err)
	}
	defer unix.Close(rootFD)
	for _, d := range []string{"proc", "dev", "tmp"} {
		fd, err := mkdirIn(rootFD, d)
		if err != nil {
			return err
		}
		unix.Close(fd)
	}

	proc := filepath.Join(root, "proc")
	if err := unix.Mount("proc", proc, "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount /proc: %w", err)
	}
	for _, p := range maskedPaths {
		if err := mask(root, p); err != nil {
			return err
		}
	}
	for _, p := range readonlyPaths {
		if err := readonly(filepath.Join(root, p)); err != nil {
			return err
		}
	}
	if err := buildDev(filepath.Join(root, "dev")); err != nil {
		return err
	}
	tmpOpts := fmt.Sprintf("mode=1777,size=%d,nr_inodes=%d", cfg.TmpBytes, cfg.TmpFiles)
	if err := unix.Mount("tmpfs", filepath.Join(root, "tmp"), "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, tmpOpts); err != nil {
		return fmt.Errorf("mount /tmp: %w", err)
	}

	next := 1
	for _, m := range o.Mounts {
		if err := ociMount(rootFD, m, trees, &next); err != nil {
			return err
		}
	}
	// Read-only last, once every mount point exists; never setuid
	// binaries or device nodes from the bundle.
	if err := rootfs.SetAttr(root, rootAttr(!o.ReadonlyRoot)); err != nil {
		return fmt.Errorf("set the container root's attributes: %w", err)
	}
	return rootfs.PivotInto(root)
}

// ociMount makes one of the spec's mounts inside the container's root.
// The destination is resolved inside the root (openat2 RESOLVE_IN_ROOT):
// a symlink in the image cannot point a mount at the host's tree.
func ociMount(rootFD int, m nswire.OCIMount, trees []int, next *int) error {
	rel := strings.TrimPrefix(filepath.Clean("/"+m.Dest), "/")
	if rel == "" {
		return fmt.Errorf("mount %s: cannot mount over the container's root", m.Dest)
	}
	dir := m.Type != "bind" || m.Dir
	var target int
	var err error
	if dir {
		target, err = mkdirIn(rootFD, rel)
	} else {
		target, err = mkfileIn(rootFD, rel)
	}
	if err != nil {
		return err
	}
	defer unix.Close(target)
	attr := uint64(unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV)
	if m.ReadOnly {
		attr |= unix.MOUNT_ATTR_RDONLY
	}
	switch m.Type {
	case "bind":
		tree := trees[*next]
		*next++
		if err := unix.MoveMount(tree, "", target, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH); err != nil {
			return fmt.Errorf("bind mount on %s: %w", m.Dest, err)
		}
	case "tmpfs":
		fdPath := fmt.Sprintf("/proc/self/fd/%d", target)
		if err := unix.Mount("tmpfs", fdPath, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, m.Data); err != nil {
			return fmt.Errorf("tmpfs mount on %s: %w", m.Dest, err)
		}
	default:
		return fmt.Errorf("mount on %s: type %q is not one init makes", m.Dest, m.Type)
	}
	// The new mount is on top of target; reopen the path to reach it.
	fd, err := openIn(rootFD, rel, unix.O_PATH|unix.O_CLOEXEC)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &unix.MountAttr{Attr_set: attr}); err != nil {
		return fmt.Errorf("set attributes of the mount on %s: %w", m.Dest, err)
	}
	return nil
}

// inRoot resolves paths inside the container's root, never through a
// magic link or a symlink that leaves it.
const inRoot = unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS

func openIn(rootFD int, rel string, flags int) (int, error) {
	fd, err := unix.Openat2(rootFD, rel, &unix.OpenHow{Flags: uint64(flags), Resolve: inRoot})
	if err != nil {
		return -1, fmt.Errorf("open /%s in the container's root: %w", rel, err)
	}
	return fd, nil
}

// mkdirIn makes every missing directory of rel inside the root and
// returns an O_PATH descriptor of the last.
func mkdirIn(rootFD int, rel string) (int, error) {
	fd, err := unix.Dup(rootFD)
	if err != nil {
		return -1, err
	}
	for _, c := range strings.Split(rel, "/") {
		if c == "" || c == "." {
			continue
		}
		if c == ".." {
			unix.Close(fd)
			return -1, fmt.Errorf("mount point /%s: '..' is not allowed", rel)
		}
		if err := unix.Mkdirat(fd, c, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
			unix.Close(fd)
			return -1, fmt.Errorf("make mount point /%s: %w", rel, err)
		}
		nfd, err := unix.Openat2(fd, c, &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS})
		unix.Close(fd)
		if err != nil {
			return -1, fmt.Errorf("mount point /%s: %s is not a directory (a symlink?): %w", rel, c, err)
		}
		fd = nfd
	}
	return fd, nil
}

// mkfileIn makes rel's parents and rel itself, an empty file, if missing,
// and returns an O_PATH descriptor of it.
func mkfileIn(rootFD int, rel string) (int, error) {
	parent, err := mkdirIn(rootFD, filepath.Dir(rel))
	if err != nil {
		return -1, err
	}
	defer unix.Close(parent)
	base := filepath.Base(rel)
	fd, err := unix.Openat2(parent, base, &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS})
	if err == nil {
		return fd, nil
	}
	if !errors.Is(err, unix.ENOENT) {
		return -1, fmt.Errorf("mount point /%s: %w", rel, err)
	}
	cfd, err := unix.Openat(parent, base, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o644)
	if err != nil {
		return -1, fmt.Errorf("make mount point /%s: %w", rel, err)
	}
	unix.Close(cfd)
	return openIn(parent, base, unix.O_PATH|unix.O_CLOEXEC)
}

// setOCIRlimits sets the spec's rlimits; core dumps stay off (they would
// land in the container's root and leak memory).
func setOCIRlimits(rl []nswire.Rlimit) error {
	if err := unix.Setrlimit(unix.RLIMIT_CORE, &unix.Rlimit{}); err != nil {
		return fmt.Errorf("setrlimit core: %w", err)
	}
	for _, r := range rl {
		if r.Resource == unix.RLIMIT_CORE {
			continue
		}
		if err := unix.Setrlimit(r.Resource, &unix.Rlimit{Cur: r.Soft, Max: r.Hard}); err != nil {
			return fmt.Errorf("setrlimit %d soft=%d hard=%d: %w", r.Resource, r.Soft, r.Hard, err)
		}
	}
	return nil
}

// waitStart blocks until the runtime's `start` writes to the start FIFO.
func waitStart() error {
	ociWaiting.Store(true)
	defer ociWaiting.Store(false)
	p := []unix.PollFd{{Fd: nswire.OCIStartFD, Events: unix.POLLIN}}
	for {
		_, err := unix.Poll(p, -1)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("wait for start: %w", err)
		}
		break
	}
	var b [1]byte
	n, _ := unix.Read(nswire.OCIStartFD, b[:])
	unix.Close(nswire.OCIStartFD)
	if n != 1 {
		return errors.New("wait for start: the start FIFO closed without a start")
	}
	return nil
}
