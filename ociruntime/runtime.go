// Package ociruntime is Moat as an OCI runtime: the runc-compatible
// commands (create, start, state, kill, delete, exec, ps, features) that
// containerd's runc shim and dockerd call, mapping a bundle's config.json
// onto the native tier's sandbox (Moat's init, user namespace, seccomp,
// Landlock, masked /proc, cgroup).
//
// Map is the whole mapping, pure and table-tested; this package's other
// files are the host side, which starts the container's init (package
// guest/nsinit in OCI mode) and finds it again by its state directory.
// It must never run container code on the host, grant what the policy
// does not allow, or leave a process, cgroup or state directory behind a
// delete.
package ociruntime

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/cgroup"
	"github.com/moat-sandbox/moat/internal/runid"
)

// Runtime runs OCI containers. Root, Log and Policy come from the global
// flags.
type Runtime struct {
	// Root holds one state directory per container (--root).
	Root string
	// Exe is the moat binary re-executed as the container's init.
	// Default: /proc/self/exe.
	Exe    string
	Policy *Policy
	Log    *Logger
	// Stdio are the descriptors the container's init gets (the ones
	// create was given); nil: this process's own.
	Stdin, Stdout, Stderr *os.File
}

// ErrNotRunning is the error for a signal or start to a container whose
// init is gone; its text is what containerd's shim matches.
var ErrNotRunning = errors.New("container not running")

// ErrNotExist is the error for an id with no container; its text is what
// containerd's shim matches ("does not exist").
var ErrNotExist = errors.New("does not exist")

func checkID(id string) error {
	if err := runid.Check(id); err != nil {
		return fmt.Errorf("container id: %w", err)
	}
	return nil
}

// readSpec reads the bundle's config.json, bounded.
func readSpec(bundle string) (*Spec, error) {
	f, err := os.Open(filepath.Join(bundle, "config.json"))
	if err != nil {
		return nil, fmt.Errorf("bundle %s: %w", bundle, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxSpecBytes+1))
	if err != nil {
		return nil, fmt.Errorf("bundle %s: %w", bundle, err)
	}
	return ParseSpec(b)
}

// Start lets a created container's program run.
func (r *Runtime) Start(id string) error {
	rec, err := r.load(id)
	if err != nil {
		return err
	}
	switch r.status(rec) {
	case StatusRunning:
		return fmt.Errorf("container %s is already running", id)
	case StatusStopped:
		return fmt.Errorf("cannot start container %s: %w", id, ErrNotRunning)
	}
	if rec.Egress != nil {
		// Fail closed: the engine's hooks (Docker's network set-up) ran
		// on the container's own network namespace at create; whatever
		// they put there would be a way out around the proxy.
		if err := loopbackOnly(rec.Pid); err != nil {
			return fmt.Errorf("cannot start container %s: %w", id, err)
		}
	}
	fifo := filepath.Join(r.dir(id), fifoFile)
	// Non-blocking: ENXIO when no init holds the read end any more.
	fd, err := unix.Open(fifo, unix.O_WRONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("cannot start container %s: %w (%v)", id, ErrNotRunning, err)
	}
	_, werr := unix.Write(fd, []byte{1})
	unix.Close(fd)
	if werr != nil {
		return fmt.Errorf("start container %s: %w", id, werr)
	}
	os.Remove(fifo)
	rec.Started = time.Now().UTC()
	if err := r.save(rec); err != nil {
		r.Log.Warnf("container %s: record its start: %v", id, err)
	}
	if rec.Hooks != nil {
		for _, h := range rec.Hooks.Poststart {
			if err := r.runHook("poststart", h, r.state(rec)); err != nil {
				r.Log.Warnf("container %s: %v", id, err)
			}
		}
	}
	return nil
}

// State returns the container's runtime-spec state.
func (r *Runtime) State(id string) (*State, error) {
	rec, err := r.load(id)
	if err != nil {
		return nil, err
	}
	return r.state(rec), nil
}

// Kill sends sig to the container's init (which passes it on to the
// program), or with all to every process in the container.
func (r *Runtime) Kill(id string, sig unix.Signal, all bool) error {
	rec, err := r.load(id)
	if err != nil {
		return err
	}
	if all {
		pids, err := r.Ps(id)
		if err != nil {
			return err
		}
		for _, p := range pids {
			unix.Kill(p, sig)
		}
		return nil
	}
	if r.status(rec) == StatusStopped {
		return fmt.Errorf("kill container %s: %w", id, ErrNotRunning)
	}
	if err := unix.Kill(rec.Pid, sig); err != nil {
		return fmt.Errorf("kill container %s: %w: %v", id, ErrNotRunning, err)
	}
	return nil
}

// Ps lists the host pids of the container's processes.
func (r *Runtime) Ps(id string) ([]int, error) {
	if _, err := r.load(id); err != nil {
		return nil, err
	}
	h, err := cgroup.Detect()
	if err != nil {
		return nil, err
	}
	cg := h.Existing(id)
	if cg == nil {
		return []int{}, nil
	}
	pids, err := cg.Procs()
	if err != nil {
		return nil, err
	}
	if pids == nil {
		pids = []int{}
	}
	return pids, nil
}

// Delete removes a stopped (or, with force, any) container: its processes,
// cgroup and state directory.
func (r *Runtime) Delete(id string, force bool) error {
	rec, err := r.load(id)
	if err != nil {
		if force && errors.Is(err, ErrNotExist) {
			return nil
		}
		return err
	}
	switch r.status(rec) {
	case StatusRunning:
		if !force {
			return fmt.Errorf("cannot delete container %s: it is running; stop it first (kill), or use delete --force", id)
		}
		fallthrough
	case StatusCreated:
		// A created container never ran its program: deleting it is
		// ending it, as with runc.
		unix.Kill(rec.Pid, unix.SIGKILL)
		if !waitGone(rec.Pid, rec.StartTime, 10*time.Second) {
			return fmt.Errorf("delete container %s: its init (pid %d) outlived SIGKILL for 10s", id, rec.Pid)
		}
	}
	// The monitor ends once init is gone, leaving what it observed.
	waitMonitor(rec.Monitor, rec.MonitorStart, 10*time.Second)
	var errs []error
	if h, err := cgroup.Detect(); err != nil {
		errs = append(errs, err)
	} else {
		if rec.Annotations[AnnotationResult] == "true" {
			// Before the cgroup goes: its counters are the result's.
			if err := r.writeResult(rec, h.Existing(id)); err != nil {
				errs = append(errs, err)
			}
		}
		if err := h.Remove(id); err != nil {
			errs = append(errs, err)
		}
	}
	if rec.Hooks != nil {
		st := r.state(rec)
		for _, h := range rec.Hooks.Poststop {
			if err := r.runHook("poststop", h, st); err != nil {
				r.Log.Warnf("container %s: %v", id, err)
			}
		}
	}
	if len(errs) == 0 {
		// Remove, not RemoveAll: the stage directory is a mount point
		// only in the dead init's namespace, and must be empty here.
		for _, p := range []string{filepath.Join(StageDir, id), execSocket(id), egressSocket(id)} {
			if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
		if err := os.RemoveAll(r.dir(id)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// loopbackOnly checks that the network namespace of pid has no interface
// but loopback (its /proc/<pid>/net/dev, the namespace's own list).
func loopbackOnly(pid int) error {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/dev", pid))
	if err != nil {
		return fmt.Errorf("%s: read the container's interfaces: %w", AnnotationEgress, err)
	}
	var others []string
	for i, line := range strings.Split(string(b), "\n") {
		name, _, ok := strings.Cut(line, ":")
		if i < 2 || !ok {
			continue // the two header lines
		}
		if name = strings.TrimSpace(name); name != "lo" {
			others = append(others, name)
		}
	}
	if len(others) > 0 {
		return fmt.Errorf("%s: the container's own network namespace has interfaces %v besides loopback, added by the engine (Docker's network hook): they would bypass Moat's egress proxy; run it without the engine's network (docker run --network none)", AnnotationEgress, others)
	}
	return nil
}

// List returns the ids of the containers under Root.
func (r *Runtime) List() ([]string, error) {
	ents, err := os.ReadDir(r.Root)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, e := range ents {
		if e.IsDir() && checkID(e.Name()) == nil {
			ids = append(ids, e.Name())
		}
	}
	return ids, nil
}

// Features is the runtime-spec features document: what this runtime
// honours, so that an engine can tell before it asks.
func Features() map[string]any {
	return map[string]any{
		"ociVersionMin": "1.0.0",
		"ociVersionMax": OCIVersion,
		"hooks":         []string{"prestart", "createRuntime", "poststart", "poststop"},
		"mountOptions":  []string{"ro", "rw", "bind", "rbind", "nosuid", "nodev", "noexec", "size", "mode", "nr_inodes"},
		"linux": map[string]any{
			"namespaces":   []string{"cgroup", "ipc", "mount", "network", "pid", "user", "uts"},
			"capabilities": engineCaps,
			"cgroup":       map[string]any{"v1": true, "v2": true, "systemd": false, "systemdUser": false},
			"seccomp":      map[string]any{"enabled": true},
			"apparmor":     map[string]any{"enabled": false},
			"selinux":      map[string]any{"enabled": false},
		},
		"annotations": map[string]string{
			"org.moat-sandbox.runtime": "moat",
		},
	}
}

// runHook runs one hook on the host with the state on its stdin, as the
// runtime-spec says; only reached when the policy allows hooks.
func (r *Runtime) runHook(kind string, h Hook, st *State) error {
	b, _ := json.Marshal(st)
	timeout := 30 * time.Second
	if h.Timeout != nil && *h.Timeout > 0 {
		timeout = time.Duration(*h.Timeout) * time.Second
	}
	if err := runHookCmd(h, b, timeout); err != nil {
		return fmt.Errorf("%s hook %s: %w", kind, h.Path, err)
	}
	return nil
}
