package ociruntime

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/cgroup"
	"github.com/moat-sandbox/moat/guest/nsinit/nswire"
	"github.com/moat-sandbox/moat/seccomp"
	"github.com/moat-sandbox/moat/tier"
	"github.com/moat-sandbox/moat/tier/native"
)

// CreateOptions are create's flags.
type CreateOptions struct {
	Bundle        string
	PidFile       string
	ConsoleSocket string
}

// setupTimeout bounds how long create waits for the init to be ready.
const setupTimeout = 60 * time.Second

// nsFlags are the clone flags of the namespaces a container may join.
var nsFlags = map[string]uintptr{"network": unix.CLONE_NEWNET, "ipc": unix.CLONE_NEWIPC, "uts": unix.CLONE_NEWUTS}

var nsFiles = map[string]string{"network": "net", "ipc": "ipc", "uts": "uts"}

// Create makes the container: its init runs, confined, in its namespaces
// and cgroup, and waits for start; its pid is in PidFile. Any failure
// undoes everything and is logged with its reason.
func (r *Runtime) Create(id string, o CreateOptions) (err error) {
	if err := checkID(id); err != nil {
		return err
	}
	bundle, err := filepath.Abs(o.Bundle)
	if err != nil {
		return err
	}
	spec, err := readSpec(bundle)
	if err != nil {
		return err
	}
	c, err := Map(spec, bundle, r.Policy)
	if err != nil {
		return err
	}
	if err := r.checkHost(c); err != nil {
		return err
	}
	switch {
	case c.Terminal != nil && o.ConsoleSocket == "":
		return refuse("process.terminal", "true", "a terminal needs --console-socket, where its master is sent; the engine gives it with a TTY")
	case c.Terminal == nil && o.ConsoleSocket != "":
		return refuse("process.terminal", "false", "--console-socket was given for a container without a terminal; set process.terminal or drop the flag")
	}
	for _, n := range c.Notes {
		r.Log.Warnf("container %s: %s", id, n)
	}

	if err := os.MkdirAll(r.Root, 0o700); err != nil {
		return fmt.Errorf("--root %s: %w", r.Root, err)
	}
	dir := r.dir(id)
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, os.ErrExist) {
			return fmt.Errorf("container %s already exists", id)
		}
		return err
	}
	var undo []func()
	defer func() {
		if err != nil {
			for _, f := range slices.Backward(undo) {
				f()
			}
		}
	}()
	undo = append(undo, func() { os.RemoveAll(dir) })
	// Where init assembles the root: a directory init can reach (as root
	// of its own user namespace only, it may not traverse the engine's
	// --root, often 0700), mounted on only in init's own mount namespace.
	if err := os.MkdirAll(StageDir, 0o711); err != nil {
		return fmt.Errorf("stage directory: %w", err)
	}
	os.Chmod(StageDir, 0o711)
	stage := filepath.Join(StageDir, id)
	if err := os.Mkdir(stage, 0o700); err != nil {
		if errors.Is(err, os.ErrExist) {
			return fmt.Errorf("container %s: stage directory %s exists (a container of this id elsewhere?); delete it first", id, stage)
		}
		return err
	}
	undo = append(undo, func() { os.Remove(stage) })
	fifo := filepath.Join(dir, fifoFile)
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		return fmt.Errorf("start fifo: %w", err)
	}
	// Opened non-blocking by us and inherited by init: it needs no
	// permission on the file, and start finds a reader at once.
	fifoFD, err := unix.Open(fifo, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("start fifo: %w", err)
	}
	fifoR := os.NewFile(uintptr(fifoFD), "start-fifo")
	defer fifoR.Close()

	host, err := cgroup.Detect()
	if err != nil {
		return err
	}
	cg, err := host.Create(id, c.Limits)
	if err != nil {
		return fmt.Errorf("cgroup: %w", err)
	}
	undo = append(undo, func() { cg.Destroy() })
	ids, err := native.AllocIDRange()
	if err != nil {
		return err
	}
	defer ids.Release() // init holds its own reference to the slot's lock

	execL, err := listenExec(id)
	if err != nil {
		return err
	}
	defer execL.Close()
	undo = append(undo, func() { os.Remove(execSocket(id)) })

	// Where init leaves the program's final status, for the result.
	exitFile, err := os.OpenFile(filepath.Join(dir, exitFileName), os.O_WRONLY|os.O_CREATE|os.O_TRUNC|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	defer exitFile.Close()

	// Moat's network (AnnotationEgress): the proxy's socket, served by
	// the container's monitor, reached by init through an O_PATH
	// descriptor.
	var egressL, egressPath *os.File
	if c.Egress.Proxied() {
		if egressL, egressPath, err = listenEgress(id); err != nil {
			return err
		}
		defer egressL.Close()
		defer egressPath.Close()
		undo = append(undo, func() { os.Remove(egressSocket(id)) })
	}
	// The diff of a writable root: init sends its overlay's upper
	// directory, which the monitor keeps.
	sendUpper := spec.Annotations[AnnotationResult] == "true" && !c.ReadonlyRoot

	pid, upper, err := r.launch(c, cg, ids, fifoR, execL, exitFile, egressPath, sendUpper, stage, o.ConsoleSocket)
	if err != nil {
		return err
	}
	start, _, _ := procStart(pid)
	rec := &record{
		ID: id, Bundle: bundle, Rootfs: c.RootFS, Pid: pid, StartTime: start,
		Created: time.Now().UTC(), Annotations: spec.Annotations, Hooks: c.Hooks, UIDBase: ids.Base(),
		UID: c.UID, GID: c.GID, Command: c.Argv, Egress: c.Egress,
	}
	if egressL != nil || upper != nil {
		layers, err := rootLayers(c.RootFS)
		if err == nil {
			rec.Monitor, rec.MonitorStart, err = startMonitor(monitorConfig{ID: id, Dir: dir, Egress: c.Egress, Upper: upper != nil, Layers: layers}, pid, egressL, upper)
		}
		if upper != nil {
			upper.Close()
		}
		if err != nil {
			unix.Kill(pid, unix.SIGKILL)
			return err
		}
		undo = append(undo, func() { unix.Kill(pid, unix.SIGKILL); waitMonitor(rec.Monitor, rec.MonitorStart, 10*time.Second) })
	}
	if c.OOMScoreAdj != nil {
		if err := os.WriteFile(fmt.Sprintf("/proc/%d/oom_score_adj", pid), []byte(strconv.Itoa(*c.OOMScoreAdj)), 0); err != nil {
			r.Log.Warnf("container %s: oom_score_adj: %v", id, err)
		}
	}
	if err := r.save(rec); err != nil {
		return err
	}
	if c.Hooks != nil {
		st := r.state(rec)
		for _, h := range slices.Concat(c.Hooks.Prestart, c.Hooks.CreateRuntime) {
			if err := r.runHook("prestart", h, st); err != nil {
				return err
			}
		}
	}
	return writePidFile(o.PidFile, pid)
}

// listenEgress binds the socket of the container's egress proxy (served
// by its monitor) and returns it with an O_PATH descriptor of it for
// init. Mode 0666: init, the container's unprivileged ids, connects
// through that descriptor; the directory is root's.
func listenEgress(id string) (l, opath *os.File, err error) {
	path := egressSocket(id)
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, nil, fmt.Errorf("egress socket %s: %w", path, err)
	}
	ul := ln.(*net.UnixListener)
	ul.SetUnlinkOnClose(false) // the listener's file goes to the monitor
	f, err := ul.File()
	ln.Close()
	if err == nil {
		err = os.Chmod(path, 0o666)
	}
	var fd int
	if err == nil {
		fd, err = unix.Open(path, unix.O_PATH|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		if f != nil {
			f.Close()
		}
		os.Remove(path)
		return nil, nil, fmt.Errorf("egress socket %s: %w", path, err)
	}
	return f, os.NewFile(uintptr(fd), "egress"), nil
}

// listenExec binds the socket on which the container's init will take
// execs: SOCK_SEQPACKET (one message per request), mode 0600 (root only).
func listenExec(id string) (*os.File, error) {
	path := execSocket(id)
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("exec socket: %w", err)
	}
	f := os.NewFile(uintptr(fd), "exec-listener")
	old := unix.Umask(0o177)
	err = unix.Bind(fd, &unix.SockaddrUnix{Name: path})
	unix.Umask(old)
	if err == nil {
		err = unix.Listen(fd, 16)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("exec socket %s: %w", path, err)
	}
	return f, nil
}

// checkHost makes the checks Map cannot: that a namespace to join is not
// the host's own, and that each bind source, symlinks resolved, is still
// where the policy allows.
func (r *Runtime) checkHost(c *Container) error {
	for typ, path := range c.Join {
		// The runtime runs in the host's namespaces (the engine's); pid
		// 1's are compared too where this process may look at them.
		same, err := sameNamespace(path, "/proc/self/ns/"+nsFiles[typ])
		if s1, err1 := sameNamespace(path, "/proc/1/ns/"+nsFiles[typ]); err1 == nil && s1 {
			same = true
		}
		if err != nil {
			return refuse("linux.namespaces "+typ+".path", strconv.Quote(path), fmt.Sprintf("cannot open it (%v); give the path of a live namespace", err))
		}
		if same {
			if r.Policy == nil || !r.Policy.AcceptPrivileged {
				return refuse("linux.namespaces "+typ+".path", strconv.Quote(path), "it is the host's own "+typ+" namespace; Moat never shares the host's; set accept_privileged: true in the runtime policy to run such specs in a namespace of their own")
			}
			r.Log.Warnf("%s namespace %s is the host's: not joined, the container gets its own", typ, path)
			delete(c.Join, typ)
		}
	}
	for i := range c.Mounts {
		m := &c.Mounts[i]
		if m.Type != "bind" {
			continue
		}
		real, err := filepath.EvalSymlinks(m.Source)
		if err != nil {
			return refuse("mounts "+m.Dest+".source", strconv.Quote(m.Source), fmt.Sprintf("cannot resolve it: %v", err))
		}
		ok := slices.ContainsFunc(r.Policy.bindDirs(m.Dest), func(d string) bool {
			rd, err := filepath.EvalSymlinks(d)
			return err == nil && under(real, rd)
		})
		if !ok {
			return refuse("mounts "+m.Dest+".source", strconv.Quote(m.Source)+" (resolves to "+real+")", "the resolved path is outside the directories the policy allows binds from")
		}
		m.Source = real
	}
	return nil
}

// launch starts the container's init and waits until it is confined and
// waits for start. It returns init's host pid.
func (r *Runtime) launch(c *Container, cg *cgroup.Cgroup, ids *native.IDRange, fifo, execL, exitFile, egressPath *os.File, sendUpper bool, rootDir, consoleSocket string) (pid int, upper *os.File, err error) {
	exe := r.Exe
	if exe == "" {
		exe = "/proc/self/exe"
	}
	filter, err := seccomp.Default().Compile()
	if err != nil {
		return 0, nil, fmt.Errorf("compile the seccomp policy: %w", err)
	}
	layers, err := rootLayers(c.RootFS)
	if err != nil {
		return 0, nil, err
	}
	stdin, stdout, stderr := r.Stdin, r.Stdout, r.Stderr
	if stdin == nil {
		stdin, stdout, stderr = os.Stdin, os.Stdout, os.Stderr
	}
	// The engine's pipes are the program's stdio; its user must own them
	// to reopen them by path (/dev/stdout, /proc/self/fd/1), as runc
	// makes them the container's root's.
	for _, f := range []*os.File{stdin, stdout, stderr} {
		var st unix.Stat_t
		if unix.Fstat(int(f.Fd()), &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFIFO {
			unix.Fchown(int(f.Fd()), ids.Base()+c.UID, ids.Base()+c.GID)
		}
	}

	cfgR, cfgW, err := os.Pipe()
	if err != nil {
		return 0, nil, err
	}
	defer cfgR.Close()
	defer cfgW.Close()
	statusR, statusW, err := os.Pipe()
	if err != nil {
		return 0, nil, err
	}
	defer statusR.Close()
	defer statusW.Close()
	sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, nil, fmt.Errorf("socketpair: %w", err)
	}
	sockHost, sockInit := os.NewFile(uintptr(sp[0]), "trees"), os.NewFile(uintptr(sp[1]), "trees-init")
	defer sockHost.Close()
	defer sockInit.Close()

	joins, err := cg.JoinFiles()
	if err != nil {
		return 0, nil, fmt.Errorf("cgroup: %w", err)
	}
	defer func() {
		for _, f := range joins {
			f.Close()
		}
	}()
	// fds 3-6 (nswire), 7 unused, the cgroup v1 tasks files from 8, and
	// last the id range's lock, which init holds for its whole life.
	extra := []*os.File{cfgR, statusW, sockInit, fifo, execL}
	extra = append(extra, joins...)
	exitFD := 0
	if exitFile != nil {
		exitFD = 3 + len(extra)
		extra = append(extra, exitFile)
	}
	egressFD := 0
	if egressPath != nil {
		egressFD = 3 + len(extra)
		extra = append(extra, egressPath)
	}
	extra = append(extra, ids.File())

	flags := uintptr(unix.CLONE_NEWUSER | unix.CLONE_NEWNS | unix.CLONE_NEWPID)
	for typ, fl := range nsFlags {
		if _, joined := c.Join[typ]; !joined {
			flags |= fl
		}
	}
	idmap := []syscall.SysProcIDMap{{ContainerID: 0, HostID: ids.Base(), Size: ids.Size()}}
	cmd := &exec.Cmd{
		Path:       exe,
		Args:       []string{"moat-init", nswire.Arg},
		Env:        []string{"GOMAXPROCS=1"},
		Stdin:      stdin,
		Stdout:     stdout,
		Stderr:     stderr,
		ExtraFiles: extra,
		SysProcAttr: &syscall.SysProcAttr{
			Cloneflags:  flags,
			UidMappings: idmap,
			GidMappings: idmap,
			Credential:  &syscall.Credential{Uid: 0, Gid: 0},
			// No parent-death signal: init outlives create, and is
			// reparented to the engine's shim (a subreaper).
		},
	}
	if fd, ok := cg.FD(); ok {
		cmd.SysProcAttr.UseCgroupFD = true
		cmd.SysProcAttr.CgroupFD = fd
	}
	if err := startJoined(cmd, c.Join, ids.Base()); err != nil {
		return 0, nil, fmt.Errorf("start the container's init %s: %w", exe, err)
	}
	pid = cmd.Process.Pid
	ok := false
	defer func() {
		if !ok {
			cmd.Process.Kill()
			cmd.Wait()
		}
	}()
	cfgR.Close()
	statusW.Close()
	sockInit.Close()

	if err := sendTrees(sockHost, pid, c, layers); err != nil {
		return 0, nil, err
	}
	setup := nswire.Setup{
		Root:            rootDir,
		Hostname:        c.Hostname,
		UID:             c.UID,
		GID:             c.GID,
		KeepCaps:        c.KeepCaps,
		TmpBytes:        c.TmpBytes,
		TmpFiles:        65536,
		Seccomp:         filter,
		RequireLandlock: true,
		CgroupFDs:       len(joins),
		OCI: &nswire.OCI{
			ReadonlyRoot: c.ReadonlyRoot,
			RootBytes:    c.RootBytes,
			NewNet:       c.Join["network"] == "",
			NewUTS:       c.Join["uts"] == "",
			Rlimits:      c.Rlimits,
			Exec:         true,
			RootLayers:   len(layers),
			Terminal:     c.Terminal,

			UnprivilegedPortStart: c.UnprivilegedPortStart,
			ExitFD:                exitFD,
			EgressFD:              egressFD,
			SendUpper:             sendUpper,
		},
	}
	if egressPath != nil {
		setup.EgressPort = tier.EgressPort
	}
	if setup.Hostname == "" {
		setup.Hostname = "moat"
	}
	for _, m := range c.Mounts {
		om := nswire.OCIMount{Dest: m.Dest, Type: m.Type, ReadOnly: m.ReadOnly, Data: m.Data}
		if m.Type == "bind" {
			fi, err := os.Stat(m.Source)
			om.Dir = err == nil && fi.IsDir()
		}
		setup.OCI.Mounts = append(setup.OCI.Mounts, om)
	}
	// Frames are written while init reads them; the status pipe tells
	// whether it got through its setup.
	werr := make(chan error, 1)
	go func() {
		err := nswire.WriteFrame(cfgW, &setup)
		if err == nil {
			err = nswire.WriteFrame(cfgW, &nswire.Start{})
		}
		if err == nil {
			err = nswire.WriteFrame(cfgW, &nswire.Command{Argv: c.Argv, Env: c.Env, Dir: c.Cwd})
		}
		cfgW.Close()
		werr <- err
	}()
	if err := waitReady(statusR, setupTimeout); err != nil {
		return 0, nil, err
	}
	if err := <-werr; err != nil {
		return 0, nil, fmt.Errorf("send the container's configuration to its init: %w", err)
	}
	if sendUpper {
		// Init sent its upper directory first, before it was ready.
		fd, err := recvFD(sockHost)
		if err != nil {
			return 0, nil, fmt.Errorf("the container's root overlay: %w", err)
		}
		upper = os.NewFile(uintptr(fd), "upper")
		defer func() {
			if !ok {
				upper.Close()
			}
		}()
	}
	if c.Terminal != nil {
		// Init sent the terminal's master before it was ready.
		master, err := recvFD(sockHost)
		if err != nil {
			return 0, nil, fmt.Errorf("the container's terminal: %w", err)
		}
		err = sendConsole(consoleSocket, master)
		unix.Close(master)
		if err != nil {
			return 0, nil, err
		}
	}
	ok = true
	// Not waited for: the engine's shim, which adopts it when we exit,
	// reaps it and reads its exit status.
	cmd.Process.Release()
	return pid, upper, nil
}

// recvFD receives one descriptor on sock.
func recvFD(sock *os.File) (int, error) {
	buf := make([]byte, 64)
	oob := make([]byte, unix.CmsgSpace(4))
	_, oobn, _, _, err := unix.Recvmsg(int(sock.Fd()), buf, oob, unix.MSG_CMSG_CLOEXEC|unix.MSG_DONTWAIT)
	if err != nil {
		return -1, err
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		return -1, errors.New("no descriptor in init's message")
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != 1 {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return -1, errors.New("not one descriptor in init's message")
	}
	return fds[0], nil
}

// sendConsole sends a terminal's master to the engine's console socket,
// as runc does: one message whose SCM_RIGHTS is the master.
func sendConsole(path string, master int) error {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("--console-socket: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Connect(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		return fmt.Errorf("--console-socket %s: %w", path, err)
	}
	if err := unix.Sendmsg(fd, []byte("/dev/ptmx"), unix.UnixRights(master), nil, 0); err != nil {
		return fmt.Errorf("--console-socket %s: send the terminal: %w", path, err)
	}
	return nil
}

// startJoined starts cmd in the namespaces of join (a pod's network, IPC
// and UTS namespaces), entered on this OS thread only, from which the
// clone happens; the thread is never given back to other goroutines.
func startJoined(cmd *exec.Cmd, join map[string]string, owner int) error {
	if len(join) == 0 {
		return native.StartOwnedBy(cmd, owner)
	}
	done := make(chan error, 1)
	go func() {
		// Locked and never unlocked: the thread, in another
		// namespace, ends with this goroutine.
		runtime.LockOSThread()
		for typ, path := range join {
			fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				done <- fmt.Errorf("join %s namespace %s: %w", typ, path, err)
				return
			}
			err = unix.Setns(fd, int(nsFlags[typ]))
			unix.Close(fd)
			if err != nil {
				done <- fmt.Errorf("join %s namespace %s: %w", typ, path, err)
				return
			}
		}
		done <- native.StartOwnedBy(cmd, owner)
	}()
	return <-done
}

// sendTrees sends init its root tree and bind mounts: detached copies
// (open_tree), id-mapped into init's user namespace so that the bundle's
// owner (the host's root) is the container's root, nosuid and nodev.
func sendTrees(sock *os.File, pid int, c *Container, layers []string) error {
	userns, err := unix.Open(fmt.Sprintf("/proc/%d/ns/user", pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open the container's user namespace: %w", err)
	}
	defer unix.Close(userns)
	var fds []int
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	tree := func(path string, recursive, ro, mustMap bool) error {
		flags := unix.OPEN_TREE_CLONE | unix.OPEN_TREE_CLOEXEC
		if recursive {
			flags |= unix.AT_RECURSIVE
		}
		fd, err := unix.OpenTree(unix.AT_FDCWD, path, uint(flags))
		if err != nil {
			return fmt.Errorf("open_tree %s: %w", path, err)
		}
		fds = append(fds, fd)
		at := unix.AT_EMPTY_PATH
		if recursive {
			at |= unix.AT_RECURSIVE
		}
		attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP, Userns_fd: uint64(userns)}
		if err := unix.MountSetattr(fd, "", uint(at), attr); err != nil && mustMap {
			return fmt.Errorf("id-map %s into the container's user namespace: %w (its filesystem must support id-mapped mounts)", path, err)
		}
		set := uint64(unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV)
		if ro {
			set |= unix.MOUNT_ATTR_RDONLY
		}
		if err := unix.MountSetattr(fd, "", uint(at), &unix.MountAttr{Attr_set: set}); err != nil {
			return fmt.Errorf("set attributes of %s: %w", path, err)
		}
		return nil
	}
	// The layers are never written, whatever the spec says: the
	// container writes to its own tmpfs.
	for _, l := range layers {
		if err := tree(l, true, true, true); err != nil {
			return fmt.Errorf("container root %s: %w", c.RootFS, err)
		}
	}
	for _, m := range c.Mounts {
		if m.Type != "bind" {
			continue
		}
		// A file the engine made (/etc/hosts) is id-mapped where its
		// filesystem allows, so the container's root owns it.
		if err := tree(m.Source, m.Recursive, m.ReadOnly, false); err != nil {
			return fmt.Errorf("bind mount %s: %w", m.Dest, err)
		}
	}
	if err := unix.Sendmsg(int(sock.Fd()), []byte{0}, unix.UnixRights(fds...), nil, 0); err != nil {
		return fmt.Errorf("send the container's mounts to its init: %w", err)
	}
	return nil
}

// waitReady reads init's reports until it is ready (confined, waiting for
// start) and returns its setup error otherwise. The reports are bounded:
// init runs inside the container.
func waitReady(statusR *os.File, d time.Duration) error {
	type result struct{ err error }
	out := make(chan result, 1)
	go func() {
		sc := bufio.NewScanner(io.LimitReader(statusR, nswire.MaxStatusBytes))
		sc.Buffer(make([]byte, 4096), nswire.MaxStatusBytes)
		for sc.Scan() {
			var st nswire.Status
			if json.Unmarshal(sc.Bytes(), &st) != nil {
				continue
			}
			switch {
			case st.Ready:
				out <- result{}
				return
			case st.Error != "":
				out <- result{fmt.Errorf("container setup: %s", clip(st.Error))}
				return
			}
		}
		out <- result{errors.New("container setup: the container's init ended before it was ready")}
	}()
	select {
	case r := <-out:
		return r.err
	case <-time.After(d):
		return fmt.Errorf("container setup: init not ready after %s", d)
	}
}

func clip(s string) string {
	if len(s) > 4096 {
		return s[:4096] + "..."
	}
	return s
}

// runHookCmd runs a hook with state on stdin, bounded by timeout.
func runHookCmd(h Hook, state []byte, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, h.Path)
	if len(h.Args) > 0 {
		cmd.Args = h.Args
	}
	cmd.Env = h.Env
	cmd.Stdin = bytes.NewReader(state)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%w: %s", err, clip(out.String()))
	}
	return nil
}
