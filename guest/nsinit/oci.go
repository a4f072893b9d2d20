package nsinit

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/guest/nsinit/nswire"
	"github.com/moat-sandbox/moat/internal/rootfs"
)

// OCI mode's signal state, under sigMu. forwardTo is the program's pid
// once it runs: init then passes the signals it receives (the runtime's
// `kill`, which signals the container's init pid as runc's callers
// expect) to the program's process group. 0: absorb them (a Moat run,
// whose host signals with frames). ociWaiting: the container has not been
// started; a terminating signal ends it, as it ends runc's init blocked
// on its FIFO. pending: signals that came after start but before the
// program was forked, delivered to it right after the fork; none is lost
// in that window.
var (
	sigMu      sync.Mutex
	forwardTo  int
	ociWaiting bool
	ociActive  bool
	pending    []unix.Signal
)

// handleSignal is what init does with a signal it caught.
func handleSignal(sig os.Signal) {
	s, ok := sig.(unix.Signal)
	if !ok {
		return
	}
	sigMu.Lock()
	defer sigMu.Unlock()
	switch {
	case forwardTo > 0:
		unix.Kill(-forwardTo, s)
	case ociWaiting:
		switch s {
		case unix.SIGTERM, unix.SIGINT, unix.SIGHUP, unix.SIGQUIT:
			os.Exit(128 + int(s))
		}
	case ociActive && len(pending) < 64:
		pending = append(pending, s)
	}
}

// ociSignals sets OCI mode's signal state: before start (waiting), or
// the program forked (pid), which also gets the pending signals.
func ociSignals(waiting bool, pid int) {
	sigMu.Lock()
	defer sigMu.Unlock()
	ociActive, ociWaiting = true, waiting
	if pid > 0 {
		forwardTo = pid
		for _, s := range pending {
			unix.Kill(-pid, s)
		}
		pending = nil
	}
}

// receiveTrees reads the detached mounts the host sends on OCIFDSocket:
// the root tree first, then one per bind mount.
func receiveTrees(want int) ([]int, error) {
	oob := make([]byte, unix.CmsgSpace(4*want))
	buf := make([]byte, 16)
	_, oobn, _, _, err := unix.Recvmsg(nswire.OCIFDSocket, buf, oob, unix.MSG_CMSG_CLOEXEC)
	if err != nil {
		unix.Close(nswire.OCIFDSocket)
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

// sendUpper sends the host a detached copy of the overlay's upper
// directory (relative to the stage, our working directory): the
// container's writes to its root, kept by the runtime's monitor for the
// result's diff after this mount namespace is gone.
func sendUpper() error {
	fd, err := unix.OpenTree(unix.AT_FDCWD, "upper", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return fmt.Errorf("open_tree the root's upper directory: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Sendmsg(nswire.OCIFDSocket, []byte("upper"), unix.UnixRights(fd), nil, 0); err != nil {
		return fmt.Errorf("send the root's upper directory: %w", err)
	}
	return nil
}

// ociTerminal opens the container's terminal (after pivot_root: on the
// container's own devpts), sends its master to the host on OCIFDSocket,
// blocking, as the engine's console socket expects it, and returns the
// slave for the program, owned by the program's user. It closes
// OCIFDSocket, whose work is then done.
func ociTerminal(ws nswire.Winsize, uid, gid int) (int, error) {
	defer unix.Close(nswire.OCIFDSocket)
	if ws.Rows == 0 || ws.Cols == 0 {
		ws = nswire.Winsize{Rows: 24, Cols: 80}
	}
	master, slave, err := openTerminal(ws)
	if err != nil {
		return -1, fmt.Errorf("the container's terminal: %w", err)
	}
	defer master.Close()
	if err := unix.SetNonblock(int(master.Fd()), false); err != nil {
		unix.Close(slave)
		return -1, fmt.Errorf("the container's terminal: %w", err)
	}
	if err := unix.Fchown(slave, uid, gid); err != nil {
		unix.Close(slave)
		return -1, fmt.Errorf("give the terminal to the program's user: %w", err)
	}
	if err := unix.Sendmsg(nswire.OCIFDSocket, []byte("tty"), unix.UnixRights(int(master.Fd())), nil, 0); err != nil {
		unix.Close(slave)
		return -1, fmt.Errorf("send the container's terminal: %w", err)
	}
	return slave, nil
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
	nlayers := max(o.RootLayers, 1)
	trees, err := receiveTrees(nlayers + nbinds)
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
	for _, d := range []string{"upper", "work", "root"} {
		if err := os.Mkdir(filepath.Join(stage, d), 0o755); err != nil {
			return fmt.Errorf("container scratch: %w", err)
		}
	}
	root := filepath.Join(stage, "root")
	lowers := make([]string, nlayers)
	for i := range nlayers {
		lowers[i] = fmt.Sprintf("l%d", i)
		if err := os.Mkdir(filepath.Join(stage, lowers[i]), 0o755); err != nil {
			return fmt.Errorf("container scratch: %w", err)
		}
		if err := unix.MoveMount(trees[i], "", unix.AT_FDCWD, filepath.Join(stage, lowers[i]), unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
			return fmt.Errorf("attach layer %d of the bundle's rootfs: %w", i, err)
		}
	}
	// Paths relative to the stage, so that many layers fit in the one
	// page the mount options may take. userxattr: this user namespace
	// cannot write trusted.* xattrs, where overlayfs keeps its metadata
	// by default.
	if err := unix.Chdir(stage); err != nil {
		return fmt.Errorf("container scratch: %w", err)
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=upper,workdir=work,userxattr", strings.Join(lowers, ":"))
	if err := unix.Mount("overlay", "root", "overlay", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("mount the container's root overlay: %w", err)
	}
	if o.SendUpper {
		if err := sendUpper(); err != nil {
			return err
		}
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
	if o.UnprivilegedPortStart != nil && o.NewNet {
		// Before /proc/sys is made read-only: a sysctl of the network
		// namespace init made, which its user namespace owns.
		p := filepath.Join(proc, "sys/net/ipv4/ip_unprivileged_port_start")
		if err := os.WriteFile(p, []byte(fmt.Sprint(*o.UnprivilegedPortStart)), 0); err != nil {
			return fmt.Errorf("set net.ipv4.ip_unprivileged_port_start: %w", err)
		}
	}
	if err := confineProcDevTmp(root, cfg); err != nil {
		return err
	}

	next := nlayers
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

// ociNoFile is the descriptor limit init lives under in OCI mode: the
// spec's RLIMIT_NOFILE, else the kernel's default soft limit.
func ociNoFile(rl []nswire.Rlimit) uint64 {
	for _, r := range rl {
		if r.Resource == unix.RLIMIT_NOFILE {
			return r.Soft
		}
	}
	return 1024
}

// waitStart blocks until the runtime's `start` writes to the start FIFO.
func waitStart() error {
	defer ociSignals(false, 0)
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

// execReq is one exec, handed by its connection's goroutine to the main
// thread, which alone forks (see ociServe).
type execReq struct {
	path  string
	req   nswire.Request
	fds   []int
	tty   int // the terminal's slave, or -1
	reply chan execStart
}

type execStart struct {
	pid    int
	err    error
	exited chan unix.WaitStatus
}

// ociServe runs on init's main thread, locked since init started, once
// the container's program (main) runs: it forks the execs the runtime
// asks for (from this thread, whose bounding set is empty and which is in
// the container's cgroup on v1 too), reaps every child, and returns the
// program's status when it ends.
func ociServe(main int, exec bool) unix.WaitStatus {
	sigchld := make(chan os.Signal, 64)
	signal.Notify(sigchld, unix.SIGCHLD)
	reqs := make(chan *execReq)
	if exec {
		go acceptExecs(reqs)
	}
	waiting := map[int]chan unix.WaitStatus{}
	for {
		// A pass before each wait: a child that ended before Notify
		// above sent no signal we could see.
		for {
			var ws unix.WaitStatus
			pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
			if errors.Is(err, unix.EINTR) {
				continue
			}
			if err != nil || pid <= 0 {
				break
			}
			if pid == main {
				return ws
			}
			if ch, ok := waiting[pid]; ok {
				ch <- ws
				delete(waiting, pid)
			}
		}
		select {
		case <-sigchld:
		case r := <-reqs:
			attr := &syscall.ProcAttr{
				Dir:   r.req.Dir,
				Env:   r.req.Env,
				Files: []uintptr{uintptr(r.fds[0]), uintptr(r.fds[1]), uintptr(r.fds[2])},
				Sys:   &syscall.SysProcAttr{Setpgid: true},
			}
			if r.tty >= 0 {
				t := uintptr(r.tty)
				attr.Files = []uintptr{t, t, t}
				attr.Sys = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
			}
			pid, err := syscall.ForkExec(r.path, r.req.Argv, attr)
			st := execStart{pid: pid, err: err}
			if err == nil {
				st.exited = make(chan unix.WaitStatus, 1)
				waiting[pid] = st.exited
			}
			r.reply <- st
		}
	}
}

// acceptExecs takes each exec connection the runtime makes.
func acceptExecs(reqs chan<- *execReq) {
	for {
		fd, _, err := unix.Accept4(nswire.OCIExecFD, unix.SOCK_CLOEXEC)
		if errors.Is(err, unix.EINTR) || errors.Is(err, unix.ECONNABORTED) {
			continue
		}
		if err != nil {
			return
		}
		go serveExec(fd, reqs)
	}
}

// serveExec runs one exec: its request, its start, its signals, its end.
// The peer is the runtime on the host (the socket's path is root's only),
// but its request is checked like any other.
func serveExec(conn int, reqs chan<- *execReq) {
	defer unix.Close(conn)
	send := func(s nswire.Status) {
		b, _ := json.Marshal(s)
		unix.Write(conn, b)
	}
	buf := make([]byte, nswire.MaxRequestBytes)
	oob := make([]byte, unix.CmsgSpace(3*4))
	n, oobn, _, _, err := unix.Recvmsg(conn, buf, oob, unix.MSG_CMSG_CLOEXEC)
	if err != nil {
		return
	}
	fds := rights(oob[:oobn])
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	var req nswire.Request
	if json.Unmarshal(buf[:n], &req) != nil || req.Op != nswire.OpExec || len(fds) != 3 || len(req.Argv) == 0 || req.Argv[0] == "" || !filepath.IsAbs(req.Dir) ||
		(req.TTY != nil && (req.TTY.Rows == 0 || req.TTY.Cols == 0)) {
		send(nswire.Status{Exited: true, Exit: 125, Error: "malformed exec request"})
		return
	}
	path, err := lookPath(req.Argv[0], req.Dir, req.Env)
	if err != nil {
		writeAll(fds[2], fmt.Sprintf("moat: %v\n", err))
		nf, _ := err.(*notFoundError)
		if nf != nil && nf.exists {
			send(nswire.Status{Started: true})
			send(nswire.Status{Exited: true, Exit: 126, NotExecutable: true})
			return
		}
		send(nswire.Status{Started: true})
		send(nswire.Status{Exited: true, Exit: 127, NotFound: true})
		return
	}
	r := &execReq{path: path, req: req, fds: fds, tty: -1, reply: make(chan execStart, 1)}
	var master *os.File
	if req.TTY != nil {
		// The exec's own terminal, its master for the engine's console
		// socket, sent with the Started status.
		m, slave, err := openTerminal(*req.TTY)
		if err == nil {
			err = unix.SetNonblock(int(m.Fd()), false)
		}
		if err != nil {
			writeAll(fds[2], fmt.Sprintf("moat: cannot give %s a terminal: %v\n", req.Argv[0], err))
			send(nswire.Status{Exited: true, Exit: 126, Error: "no terminal: " + err.Error()})
			return
		}
		master, r.tty = m, slave
		defer master.Close()
	}
	reqs <- r
	st := <-r.reply
	if r.tty >= 0 {
		unix.Close(r.tty)
	}
	if st.err != nil {
		writeAll(fds[2], fmt.Sprintf("moat: cannot execute %s: %v\n", req.Argv[0], st.err))
		send(nswire.Status{Started: true})
		send(nswire.Status{Exited: true, Exit: 126, NotExecutable: true})
		return
	}
	if master != nil {
		b, _ := json.Marshal(nswire.Status{Started: true, Pid: st.pid})
		unix.Sendmsg(conn, b, unix.UnixRights(int(master.Fd())), nil, 0)
		master.Close()
		master = nil
	} else {
		send(nswire.Status{Started: true, Pid: st.pid})
	}
	for _, fd := range fds {
		unix.Close(fd)
	}
	fds = nil
	var ended atomic.Bool
	go func() {
		// The runtime's signals for the command, until it ends or the
		// runtime's exec process goes (SIGKILL'd by the engine): then the
		// command goes too.
		b := make([]byte, 4096)
		for {
			n, _, _, _, err := unix.Recvmsg(conn, b, nil, 0)
			if errors.Is(err, unix.EINTR) {
				continue
			}
			if err != nil || n == 0 {
				if !ended.Load() {
					unix.Kill(-st.pid, unix.SIGKILL)
				}
				return
			}
			var sig nswire.Request
			if json.Unmarshal(b[:n], &sig) == nil && sig.Op == nswire.OpSignal && sig.Signal > 0 && sig.Signal < 65 && !ended.Load() {
				unix.Kill(-st.pid, unix.Signal(sig.Signal))
			}
		}
	}()
	ws := <-st.exited
	ended.Store(true)
	s := nswire.Status{Exited: true}
	switch {
	case ws.Exited():
		s.Exit = ws.ExitStatus()
	case ws.Signaled():
		s.Signal = int(ws.Signal())
		s.Exit = 128 + s.Signal
	}
	send(s)
	unix.Shutdown(conn, unix.SHUT_RDWR)
}

// ociRecordExit writes the program's final status to the runtime's exit
// file (OCI.ExitFD), for the container's result.
func ociRecordExit(oci *nswire.OCI, s nswire.Status) {
	if oci == nil || oci.ExitFD <= 2 {
		return
	}
	b, _ := json.Marshal(s)
	unix.Write(oci.ExitFD, append(b, '\n'))
}
