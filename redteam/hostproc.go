package redteam

// Host /proc inspection: the sandbox's processes, a user-space kernel's
// runtime processes and a VMM's threads, sampled from the host while a run
// lives and judged by what the host's /proc shows of them.

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/moat-sandbox/moat/cgroup"
	"github.com/moat-sandbox/moat/tier/microvm/jail"
)

// procWatch samples the sandbox's processes from the host side while the
// run lives.
type procWatch struct {
	poller
	// runtime: the tier runs the program inside a user-space kernel, and
	// the pids are the runtime's host processes (inspectRuntime), the
	// executable runtimeExe.
	runtime    bool
	runtimeExe string
	// vmm: the runtime is a virtual machine monitor (microvm's QEMU),
	// judged by inspectVMM against the run's cgroup (runID); vmmIDs
	// records the ids it ran as, for the evidence.
	vmm    bool
	vmmIDs string
	runID  string
	// filtered: VMM pids seen with both seccomp filters installed (Moat's
	// from the jailer, then QEMU's -sandbox); until then a sample is the
	// jailer or QEMU's own start-up (it installs -sandbox before creating
	// the machine and its vCPUs), counted in preSandbox.
	filtered   map[int]bool
	preSandbox int
	// inProcess: the program is a guest in moat's own process (wasm); the
	// pids are moat's child processes, of which there must be none.
	inProcess bool
	samples   int
	mu        sync.Mutex
	threads   int
	pids      map[int]bool
	bad       string
	errs      []string
}

func (w *procWatch) start(id string, procs func() ([]int, error)) {
	w.runID = id
	each := w.inspect
	if w.runtime {
		each = w.inspectRuntime
		if w.vmm {
			each = w.inspectVMM
		}
	}
	if w.inProcess {
		each = w.inspectChild
	}
	w.sample(procs, func(err error) {
		w.mu.Lock()
		w.errs = append(w.errs, err.Error())
		w.mu.Unlock()
	}, each)
}

// poller polls a run's host pids every 5 ms while the run lives and hands
// each to a function; every process watcher of the cases builds on it.
type poller struct {
	done chan struct{}
	wg   sync.WaitGroup
}

// sample starts polling; onErr gets the first listing error, which ends
// the sampling.
func (s *poller) sample(procs func() ([]int, error), onErr func(error), each func(pid int)) {
	s.done = make(chan struct{})
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-s.done:
				return
			case <-tick.C:
			}
			pids, err := procs()
			if err != nil {
				if onErr != nil {
					onErr(err)
				}
				return
			}
			for _, pid := range pids {
				each(pid)
			}
		}
	}()
}

// stop ends the sampling and waits for it; safe to call twice.
func (s *poller) stop() {
	if s.done != nil {
		close(s.done)
		s.wg.Wait()
		s.done = nil
	}
}

// inspect reads every thread's status of one host pid. Moat's own init
// (argv[0] moat-init) is checked too: it is as unprivileged as the program
// once the program runs, but may still be setting up, so only its uid is
// judged.
func (w *procWatch) inspect(pid int) {
	cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	// Moat's init is PID 1 of the sandbox's PID namespace (NSpid ends in
	// 1); its cmdline says so too, except while it exits, when the kernel
	// empties cmdline but its threads are still there to be read.
	isInit := bytes.HasPrefix(cmdline, []byte("moat-init\x00"))
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
		ns := strings.Fields(parseStatus(string(b))["NSpid"])
		isInit = isInit || len(ns) > 1 && ns[len(ns)-1] == "1"
	}
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue // exited meanwhile
		}
		st := parseStatus(string(b))
		if state := st["State"]; strings.HasPrefix(state, "Z") || strings.HasPrefix(state, "X") {
			continue
		}
		w.mu.Lock()
		w.threads++
		if w.bad == "" {
			uid, _ := strconv.ParseInt(firstField(st["Uid"]), 10, 64)
			switch {
			case uid < 0x70000000:
				w.bad = fmt.Sprintf("pid %d runs as host uid %d (not the sandbox's unprivileged range)", pid, uid)
			case isInit:
			case st["CapEff"] != "0000000000000000" || st["CapPrm"] != "0000000000000000" || st["CapBnd"] != "0000000000000000":
				w.bad = fmt.Sprintf("pid %d (%s) has capabilities: CapEff %s CapPrm %s CapBnd %s", pid, strings.ReplaceAll(string(cmdline), "\x00", " "), st["CapEff"], st["CapPrm"], st["CapBnd"])
			case st["NoNewPrivs"] != "1":
				w.bad = fmt.Sprintf("pid %d lacks no_new_privs", pid)
			case st["Seccomp"] != "2":
				w.bad = fmt.Sprintf("pid %d is not seccomp-filtered (Seccomp %s)", pid, st["Seccomp"])
			}
		}
		w.mu.Unlock()
	}
}

func (w *procWatch) verdict() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.bad != "" {
		return w.bad
	}
	if w.vmm && w.threads == 0 && w.preSandbox > 0 {
		return fmt.Sprintf("the VMM was sampled %d times and never had both seccomp filters installed (Moat's, from the jailer, and QEMU's -sandbox)", w.preSandbox)
	}
	if w.inProcess {
		if w.samples == 0 {
			if len(w.errs) > 0 {
				return "error: " + w.errs[0]
			}
			return "error: the host never sampled moat's processes while the guest ran (the program ended too fast: make it sleep)"
		}
		return ""
	}
	if w.threads == 0 {
		if len(w.errs) > 0 {
			return "error: " + w.errs[0]
		}
		return "error: the host never saw a sandbox process (the program ended too fast to inspect: make it sleep)"
	}
	return ""
}

func parseStatus(s string) map[string]string {
	m := map[string]string{}
	for _, line := range strings.Split(s, "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			m[k] = strings.TrimSpace(v)
		}
	}
	return m
}

func firstField(s string) string {
	f := strings.Fields(s)
	if len(f) == 0 {
		return ""
	}
	return f[0]
}

// runtimeCaps are the capabilities gVisor's own processes keep on the host
// (within their user namespace, whose map is the identity: gVisor's
// standard model runs them as root): the Sentry CHOWN, DAC_OVERRIDE,
// DAC_READ_SEARCH, FOWNER, FSETID, SYS_PTRACE (it traces its systrap
// stubs); the gofer the first five and SYS_CHROOT, plus SETUID and SETGID
// when it serves host sockets. Any other bit (SYS_ADMIN, NET_ADMIN,
// SYS_MODULE...) is a gain.
const runtimeCaps = 1<<0 | 1<<1 | 1<<2 | 1<<3 | 1<<4 | 1<<6 | 1<<7 | 1<<18 | 1<<19

// runtimeExe is the executable of the tier's runtime processes (runsc for
// gVisor), resolved, or "" for tiers without one.
func (r *runner) runtimeExe() string {
	t, err := r.e.Tier(r.tier)
	if err != nil {
		return ""
	}
	var exe string
	switch x := t.(type) {
	case interface{ Runsc() string }:
		exe = x.Runsc()
	case interface{ VMMBinary() string }:
		exe = x.VMMBinary()
	default:
		return ""
	}
	p, err := filepath.EvalSymlinks(exe)
	if err != nil {
		return exe
	}
	return p
}

// hostNamespaces are the namespaces moat itself runs in, which no runtime
// process may share (the cgroup namespace is not listed: runsc leaves its
// processes in the host's, and they see cgroupfs only as far as their
// mount namespace, an empty chroot, shows it).
var hostNamespaces = []string{"user", "mnt", "pid", "net", "ipc", "uts"}

// inspectRuntime judges one host process of a user-space kernel's runtime
// (the Sentry, a systrap stub where the program's instructions execute,
// the gofer): it must be the runtime's executable, every thread
// seccomp-filtered with no_new_privs, no capability beyond runtimeCaps in
// any set, in none of the host's namespaces.
func (w *procWatch) inspectRuntime(pid int) {
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil {
		return // exited meanwhile
	}
	var shared []string
	for _, ns := range hostNamespaces {
		mine, err1 := os.Readlink("/proc/self/ns/" + ns)
		its, err2 := os.Readlink(fmt.Sprintf("/proc/%d/ns/%s", pid, ns))
		if err1 == nil && err2 == nil && mine == its {
			shared = append(shared, ns)
		}
	}
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue
		}
		st := parseStatus(string(b))
		w.mu.Lock()
		w.threads++
		if w.pids == nil {
			w.pids = map[int]bool{}
		}
		w.pids[pid] = true
		if w.bad == "" {
			var extra uint64
			for _, set := range []string{"CapEff", "CapPrm", "CapBnd", "CapAmb", "CapInh"} {
				v, _ := strconv.ParseUint(st[set], 16, 64)
				extra |= v &^ runtimeCaps
			}
			switch {
			case w.runtimeExe == "" || strings.TrimSuffix(exe, " (deleted)") != w.runtimeExe:
				w.bad = fmt.Sprintf("host pid %d in the run's cgroup runs %s, not the runtime %s", pid, exe, w.runtimeExe)
			case st["Seccomp"] != "2":
				w.bad = fmt.Sprintf("runtime pid %d (%s) is not seccomp-filtered (Seccomp %s)", pid, t, st["Seccomp"])
			case st["NoNewPrivs"] != "1":
				w.bad = fmt.Sprintf("runtime pid %d (%s) lacks no_new_privs", pid, t)
			case extra != 0:
				w.bad = fmt.Sprintf("runtime pid %d (%s) has capabilities beyond gVisor's own: %#x", pid, t, extra)
			case len(shared) > 0:
				w.bad = fmt.Sprintf("runtime pid %d shares the host's %v namespaces", pid, shared)
			}
		}
		w.mu.Unlock()
	}
}

// moatChildren lists moat's own child processes, for a tier whose guest
// runs inside moat (wasm): the guest has no way to create a process, so any
// child that appears while it runs (other than the red-team's own "moat
// run" helpers) is one it made the host start. Each listing is a sample.
func (w *procWatch) moatChildren() ([]int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	me := os.Getpid()
	exe, _ := os.Executable()
	var kids []int
	for _, d := range ents {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		// The fields after the command's closing parenthesis: state ppid ...
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 2 || f[1] != strconv.Itoa(me) {
			continue
		}
		cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if exe != "" && bytes.HasPrefix(cmd, []byte(exe+"\x00run\x00")) {
			continue // a case's own "moat run" helper
		}
		kids = append(kids, pid)
	}
	w.mu.Lock()
	w.samples++
	w.mu.Unlock()
	return kids, nil
}

// inspectChild judges a child of moat seen during an in-process run: its
// existence is the escape.
func (w *procWatch) inspectChild(pid int) {
	cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.bad == "" {
		w.bad = fmt.Sprintf("host pid %d (%s) is a child of moat while the in-process guest ran", pid, strings.ReplaceAll(string(cmd), "\x00", " "))
	}
}

// inspectVMM judges one host process of a microvm run: it must be the VMM
// executable, every thread seccomp-filtered (QEMU's -sandbox) with
// no_new_privs and confined by the tier's jail (judgeVMMThread: the jail's
// unprivileged ids, no capability, its own namespaces, the run's cgroup),
// and hold no host file open for writing except under moat's state
// directories, the shared root disk image only read-only.
func (w *procWatch) inspectVMM(pid int) {
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil {
		return
	}
	st0, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	ps := parseStatus(string(st0))
	w.mu.Lock()
	if w.filtered == nil {
		w.filtered = map[int]bool{}
	}
	if !w.filtered[pid] {
		// Judged from the moment both filters are on: Moat's, which the
		// jailer installs last before its exec, and QEMU's -sandbox, one
		// of QEMU's first acts. A VMM missing either is never judged, and
		// that is itself an escape (see the end of the run).
		if ps["Seccomp"] != "2" || ps["Seccomp_filters"] != "2" {
			w.preSandbox++
			w.mu.Unlock()
			return
		}
		w.filtered[pid] = true
	}
	w.mu.Unlock()
	var bad string
	if w.runtimeExe == "" || strings.TrimSuffix(exe, " (deleted)") != w.runtimeExe {
		bad = fmt.Sprintf("host pid %d of the run runs %s, not the VMM %s", pid, exe, w.runtimeExe)
	}
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	for _, fd := range fds {
		target, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if err != nil || !strings.HasPrefix(target, "/") || target == "/dev/null" {
			continue // pipes, sockets, eventfds, exited meanwhile
		}
		info, _ := os.ReadFile(fmt.Sprintf("/proc/%d/fdinfo/%s", pid, fd.Name()))
		var flags int64
		for _, line := range strings.Split(string(info), "\n") {
			if v, ok := strings.CutPrefix(line, "flags:"); ok {
				flags, _ = strconv.ParseInt(strings.TrimSpace(v), 8, 64)
			}
		}
		writable := flags&3 != 0
		switch {
		case strings.Contains(target, "/microvm/images/") && writable:
			bad = fmt.Sprintf("the VMM (pid %d) holds the shared root disk %s writable (flags %o)", pid, target, flags)
		case writable && !strings.HasPrefix(target, "/var/lib/moat") && !strings.HasPrefix(target, os.Getenv("MOAT_HOME")+"/"):
			bad = fmt.Sprintf("the VMM (pid %d) holds host file %s open for writing (flags %o)", pid, target, flags)
		}
	}
	var shared []string
	for _, ns := range vmmNamespaces {
		mine, err1 := os.Readlink("/proc/self/ns/" + ns)
		its, err2 := os.Readlink(fmt.Sprintf("/proc/%d/ns/%s", pid, ns))
		if err1 == nil && err2 == nil && mine == its {
			shared = append(shared, ns)
		}
	}
	cg, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	// A VMM being killed (the end of every run) shows the root cgroups and
	// no threads' details once it has exited: judge only what was read
	// while it still ran, so check it still does after the reads.
	if !running(pid) {
		return
	}
	ids := fmt.Sprintf("uid %s, gid %s", firstField(ps["Uid"]), firstField(ps["Gid"]))
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue
		}
		st := parseStatus(string(b))
		w.mu.Lock()
		w.threads++
		if w.pids == nil {
			w.pids = map[int]bool{}
		}
		w.pids[pid] = true
		w.vmmIDs = ids
		switch {
		case w.bad != "":
		case bad != "":
			w.bad = bad
		case st["Seccomp"] != "2" || st["Seccomp_filters"] != "2":
			w.bad = fmt.Sprintf("VMM pid %d (%s) is not under Moat's and QEMU's seccomp filters (Seccomp %s, Seccomp_filters %s)", pid, t, st["Seccomp"], st["Seccomp_filters"])
		case st["NoNewPrivs"] != "1":
			w.bad = fmt.Sprintf("VMM pid %d (%s) lacks no_new_privs", pid, t)
		default:
			if ev := judgeVMMThread(st, shared, string(cg), w.runID); ev != "" {
				w.bad = fmt.Sprintf("VMM pid %d (%s) %s", pid, t, ev)
			}
		}
		w.mu.Unlock()
	}
}

// running reports whether pid is alive and not exiting: its state is
// neither zombie nor dead, and it has not begun to exit (PF_EXITING in
// its flags: an exiting task leaves its cgroups, and reads as in the root
// ones, before it becomes a zombie).
func running(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 || i+2 >= len(b) {
		return false
	}
	// After the command: state, ppid, pgrp, session, tty_nr, tpgid, flags.
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 7 {
		return false
	}
	const pfExiting = 0x4
	flags, err := strconv.ParseUint(f[6], 10, 64)
	if err != nil || flags&pfExiting != 0 {
		return false
	}
	return f[0] != "Z" && f[0] != "X" && f[0] != "x"
}

// vmmNamespaces are the host namespaces a jailed VMM must not share. The
// user namespace is the host's by design: the jail makes none, so its
// namespaces belong to the host's user namespace, in which the VMM holds
// no capability (judged below).
var vmmNamespaces = []string{"mnt", "pid", "net", "ipc", "uts", "cgroup"}

// judgeVMMThread says what of the microvm tier's jail one VMM thread
// lacks, or "": every uid the jail's (jail.UIDBase+1 .. jail.UIDLimit,
// never root), every gid the jail's, no supplementary group, every
// capability set empty, none of the host's namespaces (shared lists those
// it shares), and in the run's cgroup in every hierarchy Moat uses
// (cgroups is /proc/PID/cgroup).
func judgeVMMThread(st map[string]string, shared []string, cgroups, runID string) string {
	for _, f := range strings.Fields(st["Uid"]) {
		if id, err := strconv.ParseInt(f, 10, 64); err != nil || id <= jail.UIDBase || id > jail.UIDLimit {
			return fmt.Sprintf("runs as host uid %s (Uid %s), not the jail's unprivileged range", f, st["Uid"])
		}
	}
	for _, f := range strings.Fields(st["Gid"]) {
		if f != strconv.Itoa(jail.GID) {
			return fmt.Sprintf("runs as host gid %s (Gid %s), not the jail's", f, st["Gid"])
		}
	}
	if g := strings.TrimSpace(st["Groups"]); g != "" {
		return "keeps supplementary groups " + g
	}
	for _, set := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"} {
		if v := st[set]; v != "0000000000000000" {
			return fmt.Sprintf("has capabilities: %s %s", set, v)
		}
	}
	if len(shared) > 0 {
		return fmt.Sprintf("shares the host's %v namespaces", shared)
	}
	return inRunCgroup(cgroups, runID)
}

// inRunCgroup says "" when /proc/PID/cgroup (cgroups) puts the process in
// moat/<runID> in every hierarchy Moat's cgroups use (cgroup.InRun).
func inRunCgroup(cgroups, runID string) string {
	if runID == "" {
		return "could not be matched to its run's cgroup (no run id)"
	}
	if err := cgroup.InRun([]byte(cgroups), runID); err != nil {
		return "is " + err.Error()
	}
	return ""
}
