package ociruntime

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// OCIVersion is the runtime-spec version this runtime speaks.
const OCIVersion = "1.1.0"

// DefaultRoot is where the runtime keeps its containers' state.
const DefaultRoot = "/run/moat-runtime"

// Container statuses (runtime-spec).
const (
	StatusCreated = "created"
	StatusRunning = "running"
	StatusStopped = "stopped"
)

// record is what create leaves in the state directory for the commands
// that follow.
type record struct {
	ID          string            `json:"id"`
	Bundle      string            `json:"bundle"`
	Rootfs      string            `json:"rootfs"`
	Pid         int               `json:"pid"`
	StartTime   uint64            `json:"start_time"` // /proc/<pid>/stat field 22: tells our init from a reused pid
	Created     time.Time         `json:"created"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Hooks       *Hooks            `json:"hooks,omitempty"`
	UIDBase     int               `json:"uid_base"`
	// UID and GID are the container's user: every exec runs as it.
	UID int `json:"uid"`
	GID int `json:"gid"`
	// Command is the program, for the result.
	Command []string `json:"command"`
	// Started is when start let the program run (zero: never).
	Started time.Time `json:"started,omitzero"`
	// Egress is the container's network through Moat (AnnotationEgress).
	Egress *Egress `json:"egress,omitempty"`
	// Monitor and MonitorStart are the container's monitor (its pid and
	// /proc start time), when it has one.
	Monitor      int    `json:"monitor,omitempty"`
	MonitorStart uint64 `json:"monitor_start,omitempty"`
}

// State is the runtime-spec state, with runc's extra fields that
// containerd and Docker read (rootfs, created, owner).
type State struct {
	OCIVersion  string            `json:"ociVersion"`
	ID          string            `json:"id"`
	Status      string            `json:"status"`
	Pid         int               `json:"pid"`
	Bundle      string            `json:"bundle"`
	Rootfs      string            `json:"rootfs"`
	Created     time.Time         `json:"created"`
	Owner       string            `json:"owner"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

const (
	recordFile   = "state.json"
	fifoFile     = "start.fifo"
	exitFileName = "exit.json"
)

// execSocket is where a container's init takes its execs: in StageDir, a
// short path (a socket's is at most 107 bytes), root's only.
func execSocket(id string) string { return filepath.Join(StageDir, id+".sock") }

// egressSocket is where a container's egress proxy listens.
func egressSocket(id string) string { return filepath.Join(StageDir, id+".egress") }

// StageDir holds one empty directory per container, on which its init
// mounts the container's root in its own mount namespace (the host sees
// an empty directory). Under /run, which every process may traverse.
const StageDir = "/run/moat-runtime-stage"

func (r *Runtime) dir(id string) string { return filepath.Join(r.Root, id) }

func (r *Runtime) load(id string) (*record, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(filepath.Join(r.dir(id), recordFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("container %s %w", id, ErrNotExist)
	}
	if err != nil {
		return nil, err
	}
	var rec record
	if err := json.Unmarshal(b, &rec); err != nil {
		return nil, fmt.Errorf("container %s: state %s: %w", id, filepath.Join(r.dir(id), recordFile), err)
	}
	return &rec, nil
}

func (r *Runtime) save(rec *record) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	tmp := filepath.Join(r.dir(rec.ID), recordFile+".tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(r.dir(rec.ID), recordFile))
}

// status tells the container's state from its init: alive and not yet
// started (the start FIFO is there), running, or stopped (gone, a
// zombie the engine has yet to reap, or a pid reused by another process).
func (r *Runtime) status(rec *record) string {
	st, zombie, ok := procStart(rec.Pid)
	if !ok || zombie || st != rec.StartTime {
		return StatusStopped
	}
	if _, err := os.Lstat(filepath.Join(r.dir(rec.ID), fifoFile)); err == nil {
		return StatusCreated
	}
	return StatusRunning
}

func (r *Runtime) state(rec *record) *State {
	s := &State{
		OCIVersion: OCIVersion, ID: rec.ID, Status: r.status(rec), Pid: rec.Pid,
		Bundle: rec.Bundle, Rootfs: rec.Rootfs, Created: rec.Created, Owner: "",
		Annotations: rec.Annotations,
	}
	if s.Status == StatusStopped {
		s.Pid = 0
	}
	return s
}

// procStart reads a process's start time (clock ticks after boot) and
// whether it is a zombie.
func procStart(pid int) (start uint64, zombie, ok bool) {
	if pid <= 0 {
		return 0, false, false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false, false
	}
	// The command name, in parentheses, may hold anything: fields start
	// after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, false, false
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state), so field 22 (starttime) is f[19].
	if len(f) < 20 {
		return 0, false, false
	}
	start, err = strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return 0, false, false
	}
	return start, f[0] == "Z" || f[0] == "X", true
}

// waitGone waits for pid (not our child: the engine's shim reaps it) to be
// gone or a zombie.
func waitGone(pid int, start uint64, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		st, zombie, ok := procStart(pid)
		if !ok || zombie || st != start {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// writePidFile writes pid to path atomically, as the shim expects.
func writePidFile(path string, pid int) error {
	if path == "" {
		return nil
	}
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	if err := os.WriteFile(tmp, []byte(strconv.Itoa(pid)), 0o644); err != nil {
		return fmt.Errorf("--pid-file: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("--pid-file: %w", err)
	}
	return nil
}

// sameNamespace reports whether the namespace file at path is the one
// nsFile (e.g. /proc/1/ns/net, the host's) names.
func sameNamespace(path, nsFile string) (bool, error) {
	var a, b unix.Stat_t
	if err := unix.Stat(path, &a); err != nil {
		return false, err
	}
	if err := unix.Stat(nsFile, &b); err != nil {
		return false, err
	}
	return a.Dev == b.Dev && a.Ino == b.Ino, nil
}
