package ociruntime

import (
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/egress"
	"github.com/moat-sandbox/moat/result"
	"github.com/moat-sandbox/moat/workspace"
)

// A container's monitor is a host process of the runtime's that outlives
// create, as the container's init does (the engine's shim, a subreaper,
// adopts and reaps both): it serves the container's egress proxy
// (AnnotationEgress) and keeps the detached copy of the root overlay's
// upper directory (the container's writes) that init sent. When init is
// gone it writes what it observed (the network log, the file diff) to
// the container's state directory for delete's result, and exits. It is
// never inside the container: it runs as the host's root, in the
// engine's namespaces, like the runtime itself.

// MonitorArg is the hidden argument under which the moat binary runs as a
// container's monitor (cmd/moat dispatches it to RunMonitor).
const MonitorArg = "__oci-monitor"

// The monitor's descriptors.
const (
	monConfigFD = 3 // read end: one JSON monitorConfig
	monReadyFD  = 4 // write end: "ok\n", or the reason it could not start
	monPidFD    = 5 // a pidfd of the container's init
	monEgressFD = 6 // the proxy's listening Unix socket (Egress.Proxied)
	monUpperFD  = 7 // the upper directory's detached mount (Upper)
)

const observedFile = "observed.json"

// monitorConfig is what create tells its monitor.
type monitorConfig struct {
	ID     string  `json:"id"`
	Dir    string  `json:"dir"` // the container's state directory
	Egress *Egress `json:"egress,omitempty"`
	Upper  bool    `json:"upper,omitempty"`
	// Layers are the root's layers on the host, top first: what a path
	// in the upper directory was before the container wrote it.
	Layers []string `json:"layers,omitempty"`
}

// observed is what the monitor leaves for delete's result.
type observed struct {
	Files          []result.FileChange     `json:"files,omitempty"`
	Network        []result.NetworkAttempt `json:"network,omitempty"`
	NetworkSummary *result.NetworkSummary  `json:"network_summary,omitempty"`
	Violations     []result.Violation      `json:"violations,omitempty"`
	Degradations   []string                `json:"degradations,omitempty"`
}

// diffLimits bound the monitor's walks of the upper directory, which the
// container wrote (hostile): the workspace's defaults.
var diffLimits = workspace.DiffLimits{}

// startMonitor starts the container's monitor and waits until it serves.
// egressL and upper may be nil; pid is init's. It returns the monitor's
// pid and start time (for delete, which waits for it).
func startMonitor(cfg monitorConfig, pid int, egressL, upper *os.File) (int, uint64, error) {
	// This moat binary, not the init's (moat-guest has no monitor).
	exe := "/proc/self/exe"
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return 0, 0, fmt.Errorf("monitor: pidfd of init %d: %w", pid, err)
	}
	pidf := os.NewFile(uintptr(pidfd), "init-pidfd")
	defer pidf.Close()
	cfgR, cfgW, err := os.Pipe()
	if err != nil {
		return 0, 0, err
	}
	defer cfgR.Close()
	defer cfgW.Close()
	readyR, readyW, err := os.Pipe()
	if err != nil {
		return 0, 0, err
	}
	defer readyR.Close()
	defer readyW.Close()
	devnull, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		return 0, 0, err
	}
	defer devnull.Close()
	cmd := &exec.Cmd{
		Path:       exe,
		Args:       []string{"moat-oci-monitor", MonitorArg},
		Env:        []string{"GOMAXPROCS=2"},
		Stdin:      devnull,
		Stdout:     devnull,
		Stderr:     devnull,
		ExtraFiles: []*os.File{cfgR, readyW, pidf, egressL, upper},
		// Its own session: the engine's signals to create's process
		// group do not reach it; delete ends it by its pid.
		SysProcAttr: &syscall.SysProcAttr{Setsid: true},
	}
	if err := cmd.Start(); err != nil {
		return 0, 0, fmt.Errorf("start the container's monitor: %w", err)
	}
	mpid := cmd.Process.Pid
	ok := false
	defer func() {
		if !ok {
			cmd.Process.Kill()
			cmd.Wait()
		}
	}()
	cfgR.Close()
	readyW.Close()
	if err := json.NewEncoder(cfgW).Encode(cfg); err != nil {
		return 0, 0, fmt.Errorf("configure the container's monitor: %w", err)
	}
	cfgW.Close()
	done := make(chan string, 1)
	go func() {
		b, _ := io.ReadAll(io.LimitReader(readyR, 4096))
		done <- string(b)
	}()
	select {
	case msg := <-done:
		if msg != "ok\n" {
			if msg == "" {
				msg = "it ended"
			}
			return 0, 0, fmt.Errorf("the container's monitor: %s", clip(msg))
		}
	case <-time.After(setupTimeout):
		return 0, 0, fmt.Errorf("the container's monitor not ready after %s", setupTimeout)
	}
	start, _, _ := procStart(mpid)
	ok = true
	cmd.Process.Release() // reaped by the engine's shim, as init is
	return mpid, start, nil
}

// RunMonitor is the monitor process (MonitorArg); it returns its exit
// status.
func RunMonitor() int {
	signal.Ignore(unix.SIGHUP, unix.SIGINT, unix.SIGPIPE)
	term := make(chan os.Signal, 1)
	signal.Notify(term, unix.SIGTERM)
	ready := os.NewFile(monReadyFD, "ready")
	fail := func(err error) int {
		fmt.Fprintf(ready, "%v\n", err)
		return 1
	}
	var cfg monitorConfig
	if err := json.NewDecoder(io.LimitReader(os.NewFile(monConfigFD, "config"), 1<<20)).Decode(&cfg); err != nil {
		return fail(fmt.Errorf("read its configuration: %w", err))
	}
	var (
		proxy  *egress.Proxy
		served = make(chan error, 1)
	)
	if cfg.Egress.Proxied() {
		pol, err := cfg.Egress.Policy()
		if err != nil {
			return fail(err)
		}
		l, err := net.FileListener(os.NewFile(monEgressFD, "egress"))
		if err != nil {
			return fail(fmt.Errorf("egress socket: %w", err))
		}
		proxy = egress.New(pol, egress.Options{})
		go func() { served <- proxy.Serve(l) }()
	}
	upper := fmt.Sprintf("/proc/self/fd/%d", monUpperFD)
	var base *workspace.Snapshot
	if cfg.Upper {
		// The mount points init made before the program runs are not
		// the program's writes.
		var err error
		if base, err = workspace.Scan(upper, diffLimits); err != nil {
			return fail(err)
		}
	}
	ready.WriteString("ok\n")
	ready.Close()

	waitInit(term)

	var obs observed
	if proxy != nil {
		proxy.Close()
		<-served
		obs.Network = egress.ResultAttempts(proxy.Attempts())
		obs.NetworkSummary = egress.ResultSummary(proxy.Summary())
	}
	if cfg.Upper {
		changes, err := workspace.Diff(upper, base, diffLimits)
		obs.Files = rootChanges(changes, upperInfo(upper), layersTree(cfg.Layers))
		vs := workspace.Violations(err)
		obs.Violations = append(obs.Violations, vs...)
		if err != nil && len(vs) == 0 {
			obs.Degradations = append(obs.Degradations, "file diff: "+err.Error())
		}
	}
	if err := writeObserved(cfg.Dir, &obs); err != nil {
		return 1
	}
	return 0
}

// waitInit returns when the container's init is gone (its pidfd becomes
// readable), or on SIGTERM.
func waitInit(term <-chan os.Signal) {
	gone := make(chan struct{})
	go func() {
		p := []unix.PollFd{{Fd: monPidFD, Events: unix.POLLIN}}
		for {
			if _, err := unix.Poll(p, -1); err != unix.EINTR {
				break
			}
		}
		close(gone)
	}()
	select {
	case <-gone:
	case <-term:
	}
}

func writeObserved(dir string, obs *observed) error {
	b, err := json.Marshal(obs)
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, "."+observedFile)
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, observedFile))
}

// readObserved reads what the monitor left; nil when nothing.
func readObserved(dir string) *observed {
	f, err := os.Open(filepath.Join(dir, observedFile))
	if err != nil {
		return nil
	}
	defer f.Close()
	var obs observed
	if json.NewDecoder(io.LimitReader(f, 256<<20)).Decode(&obs) != nil {
		return nil
	}
	return &obs
}

// waitMonitor waits up to d for the container's monitor to end (it does
// once init is gone), then ends it.
func waitMonitor(pid int, start uint64, d time.Duration) {
	if pid <= 0 {
		return
	}
	if s, zombie, ok := procStart(pid); !ok || zombie || s != start {
		return // gone (perhaps not yet reaped), and its pid perhaps another's
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		n, err := unix.Poll(p, int(time.Until(deadline).Milliseconds())+1)
		if n > 0 {
			return
		}
		if err != nil && err != unix.EINTR {
			break
		}
	}
	unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
}

// pathInfo is what a path is in a tree: its type, permission bits and
// size, or that it is a whiteout (an overlay's mark of a deletion).
type pathInfo struct {
	Type     string
	Mode     uint32
	Size     int64
	Whiteout bool
	Opaque   bool // a directory that hides the layers' below (overlay's opaque xattr)
}

// upperInfo looks paths up in the upper directory (hostile: resolved
// beneath it, no symlink followed).
func upperInfo(upper string) func(p string) (pathInfo, bool) {
	return func(p string) (pathInfo, bool) {
		return lookupBeneath(upper, p, "user.overlay.opaque")
	}
}

// lowerTree is what the container's root was below its writes: the
// layers, looked up by path (info) and listed by directory (names).
type lowerTree struct {
	info  func(p string) (pathInfo, bool)
	names func(dir string) []string
}

// layersTree is the root's layers, top first.
func layersTree(layers []string) lowerTree {
	return lowerTree{info: layersInfo(layers), names: layersNames(layers)}
}

// layersInfo looks paths up in the layers, top first: the first layer
// that has the path (or a whiteout of it) decides.
func layersInfo(layers []string) func(p string) (pathInfo, bool) {
	return func(p string) (pathInfo, bool) {
		for _, l := range layers {
			if pi, ok := lookupBeneath(l, p, ""); ok {
				if pi.Whiteout {
					return pathInfo{}, false
				}
				return pi, true
			}
		}
		return pathInfo{}, false
	}
}

// lookupBeneath stats rel inside the tree at top, never following a
// symlink (openat2 RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS on the parent).
func lookupBeneath(top, rel, opaqueXattr string) (pathInfo, bool) {
	tfd, err := unix.Open(top, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return pathInfo{}, false
	}
	defer unix.Close(tfd)
	dir, name := path.Split(rel)
	pfd := tfd
	if dir != "" {
		pfd, err = unix.Openat2(tfd, path.Clean(dir), &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS})
		if err != nil {
			return pathInfo{}, false
		}
		defer unix.Close(pfd)
	}
	var st unix.Stat_t
	if err := unix.Fstatat(pfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return pathInfo{}, false
	}
	pi := pathInfo{Mode: st.Mode & 0o7777, Size: st.Size}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		pi.Type = "file"
	case unix.S_IFDIR:
		pi.Type = "dir"
		pi.Size = 0
		if opaqueXattr != "" {
			// Read through an O_PATH descriptor's /proc link: no
			// symlink is followed (name is a directory).
			if fd, err := unix.Openat(pfd, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0); err == nil {
				buf := make([]byte, 8)
				n, err := unix.Getxattr("/proc/self/fd/"+strconv.Itoa(fd), opaqueXattr, buf)
				pi.Opaque = err == nil && n == 1 && buf[0] == 'y'
				unix.Close(fd)
			}
		}
	case unix.S_IFLNK:
		pi.Type = "symlink"
	case unix.S_IFCHR:
		pi.Type = "other"
		pi.Whiteout = st.Rdev == 0
	default:
		pi.Type = "other"
	}
	return pi, true
}

// maxOpaqueDeleted bounds the deletions listed for one opaque directory.
const maxOpaqueDeleted = 1000

// rootChanges turns a diff of the overlay's upper directory (against its
// state before the program ran) into changes of the container's root:
// a whiteout is the deletion of what the layers had there; a file or
// link the layers had is modified, not added; a directory copied up only
// because something below it changed is no change; an opaque directory
// (removed and made again) deletes what the layers had in it that it no
// longer has.
func rootChanges(upper []result.FileChange, inUpper func(string) (pathInfo, bool), layers lowerTree) []result.FileChange {
	inLayers := layers.info
	out := []result.FileChange{}
	for _, c := range upper {
		if c.Change == result.Deleted {
			out = append(out, c)
			continue
		}
		lower, inLower := inLayers(c.Path)
		up, _ := inUpper(c.Path)
		switch {
		case up.Whiteout:
			if inLower {
				out = append(out, result.FileChange{Path: c.Path, Change: result.Deleted, Type: lower.Type, Size: lower.Size, Mode: fmt.Sprintf("%04o", lower.Mode)})
			}
			continue
		case c.Type == "dir" && inLower && lower.Type == "dir":
			if c.Change == result.Added && c.Mode == fmt.Sprintf("%04o", lower.Mode) && !up.Opaque {
				continue // copied up as a parent
			}
			c.Change = result.Modified
		case inLower:
			c.Change = result.Modified
		}
		out = append(out, c)
		if up.Opaque && inLower && lower.Type == "dir" {
			out = append(out, opaqueDeletions(c.Path, upper, layers)...)
		}
	}
	slices.SortFunc(out, func(a, b result.FileChange) int {
		switch {
		case a.Path < b.Path:
			return -1
		case a.Path > b.Path:
			return 1
		}
		return 0
	})
	return slices.CompactFunc(out, func(a, b result.FileChange) bool { return a.Path == b.Path })
}

// opaqueDeletions lists what the layers had directly in dir that the
// upper diff does not have: hidden by an opaque directory, so deleted.
func opaqueDeletions(dir string, upper []result.FileChange, layers lowerTree) []result.FileChange {
	var out []result.FileChange
	for _, n := range layers.names(dir) {
		p := path.Join(dir, n)
		if slices.ContainsFunc(upper, func(c result.FileChange) bool { return c.Path == p }) {
			continue
		}
		if pi, ok := layers.info(p); ok {
			out = append(out, result.FileChange{Path: p, Change: result.Deleted, Type: pi.Type, Size: pi.Size, Mode: fmt.Sprintf("%04o", pi.Mode)})
		}
		if len(out) >= maxOpaqueDeleted {
			break
		}
	}
	return out
}

// layersNames lists the names directly in dir across the layers.
func layersNames(layers []string) func(string) []string {
	return func(dir string) []string {
		var names []string
		for _, l := range layers {
			root, err := os.OpenRoot(l)
			if err != nil {
				continue
			}
			ents, err := fs.ReadDir(root.FS(), path.Clean(dir))
			root.Close()
			if err != nil {
				continue
			}
			for _, e := range ents {
				if !slices.Contains(names, e.Name()) {
					names = append(names, e.Name())
				}
				if len(names) >= maxOpaqueDeleted {
					return names
				}
			}
		}
		return names
	}
}
