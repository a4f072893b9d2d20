package ociruntime

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/cgroup"
	"github.com/moat-sandbox/moat/guest/nsinit/nswire"
	"github.com/moat-sandbox/moat/result"
)

// AnnotationResult, set to "true" on a container, makes delete write its
// Moat result (result.Result: termination, exit status, duration, CPU,
// peak memory, violations) to the policy's result_dir as <id>.json. The
// path is the operator's, never the annotation's: annotations come from
// the engine's users.
const AnnotationResult = "moat.sandbox/result"

// DefaultResultDir is where results go when the policy names no
// result_dir.
const DefaultResultDir = "/var/lib/moat/oci-results"

// DefaultAuditDB is the audit database results are recorded in when the
// policy names none: moat serve's and moat audit's default as root.
const DefaultAuditDB = "/var/lib/moat/audit.db"

// writeResult writes the container's result from its exit record (init's
// last status) and its cgroup's counters, and records it in the audit
// database.
func (r *Runtime) writeResult(rec *record, cg *cgroup.Cgroup) error {
	res := buildResult(rec, readExit(filepath.Join(r.dir(rec.ID), exitFileName)), cgStats(cg), time.Now())
	addObserved(res, readObserved(r.dir(rec.ID)), rec)
	if err := r.audit(rec, res); err != nil {
		// The result file below still holds it; a busy or broken
		// database must not keep the container from going.
		r.Log.Warnf("container %s: audit log: %v", rec.ID, err)
	}
	dir := DefaultResultDir
	if r.Policy != nil && r.Policy.ResultDir != "" {
		dir = r.Policy.ResultDir
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("result of %s: %w", rec.ID, err)
	}
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, "."+rec.ID+".tmp")
	if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("result of %s: %w", rec.ID, err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, rec.ID+".json")); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("result of %s: %w", rec.ID, err)
	}
	return nil
}

// audit adds the container's record to the policy's audit database, as
// one finished run of the native tier: moat audit lists it beside the
// API's runs, and moat policy suggest learns from it.
func (r *Runtime) audit(rec *record, res *result.Result) error {
	path := DefaultAuditDB
	if r.Policy != nil && r.Policy.AuditDB != "" {
		path = r.Policy.AuditDB
	}
	if path == "off" {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	st, err := audit.Open(path)
	if err != nil {
		return err
	}
	defer st.Close()
	// Engines may reuse a container id once it is deleted (ctr run, docker
	// create --name): the record's id carries its start.
	id := "oci-" + rec.ID
	if len(id) > audit.MaxIDLen-24 {
		id = id[:audit.MaxIDLen-24]
	}
	started := rec.Started
	if started.IsZero() { // deleted before start
		started = time.Now()
	}
	id += "-" + strconv.FormatInt(started.UnixNano(), 36)
	if err := st.Begin(audit.Record{ID: id, Kind: audit.KindRun, Started: started, Tier: res.Tier, Image: rec.Rootfs, Command: rec.Command}); err != nil {
		return err
	}
	return st.Finish(id, res, nil)
}

// addObserved adds what the container's monitor observed (nil: it had
// none, or left nothing) to its result: the network log of its egress
// proxy, the diff of its writable root.
func addObserved(res *result.Result, obs *observed, rec *record) {
	if obs == nil {
		if rec.Monitor != 0 {
			res.Degradations = append(res.Degradations, "the container's monitor left no record: no file diff or network log")
		}
		return
	}
	if obs.Files != nil {
		res.Files = obs.Files
	}
	if obs.Network != nil {
		res.Network = obs.Network
	}
	res.NetworkSummary = obs.NetworkSummary
	res.Violations = append(res.Violations, obs.Violations...)
	res.Degradations = append(res.Degradations, obs.Degradations...)
}

func cgStats(cg *cgroup.Cgroup) *cgroup.Stats {
	if cg == nil {
		return nil
	}
	st, err := cg.Stats()
	if err != nil {
		return nil
	}
	return &st
}

// readExit reads init's exit record: written from inside the container,
// so bounded and checked like any report of init's.
func readExit(path string) *nswire.Status {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, nswire.MaxStatusBytes))
	if err != nil {
		return nil
	}
	return parseExit(b)
}

// parseExit reads the first line of an exit record; nil unless it is a
// well-formed final status.
func parseExit(b []byte) *nswire.Status {
	line, _, _ := bytes.Cut(b, []byte("\n"))
	var st nswire.Status
	if json.Unmarshal(line, &st) != nil || !st.Exited || st.Exit < 0 || st.Exit > 255 || st.Signal < 0 || st.Signal > 64 || st.DurationNS < 0 {
		return nil
	}
	return &st
}

// buildResult is the container's result from what is known at delete: a
// pure function of the record, init's exit record (nil: init was killed
// before it could write one) and the cgroup's counters (nil: unknown).
func buildResult(rec *record, exit *nswire.Status, st *cgroup.Stats, now time.Time) *result.Result {
	res := &result.Result{
		Schema:       result.SchemaVersion,
		ID:           rec.ID,
		Tier:         "native",
		Runtime:      "moat-runtime (OCI)",
		Image:        result.Image{Name: rec.Rootfs},
		Command:      rec.Command,
		StartedAt:    rec.Started,
		Files:        []result.FileChange{},
		Network:      []result.NetworkAttempt{},
		Violations:   []result.Violation{},
		Degradations: []string{},
	}
	switch {
	case exit != nil:
		res.ExitCode, res.Signal = exit.Exit, exit.Signal
		res.DurationMS = float64(exit.DurationNS) / 1e6
		res.Termination = result.Exited
		if exit.Signal != 0 {
			res.Termination = result.Signaled
		}
	default:
		// Init itself was killed (kill KILL, delete --force, the OOM
		// killer): the engine saw SIGKILL.
		res.Termination, res.Signal, res.ExitCode = result.Signaled, int(unix.SIGKILL), 128+int(unix.SIGKILL)
		if !rec.Started.IsZero() {
			res.DurationMS = float64(now.Sub(rec.Started).Microseconds()) / 1e3
		}
	}
	if res.Signal != 0 {
		res.SignalName = unix.SignalName(unix.Signal(res.Signal))
	}
	if st != nil {
		res.CPUMS = float64(st.CPU.Microseconds()) / 1e3
		res.PeakMemoryBytes = st.PeakMemory
		if st.OOMKills > 0 {
			res.OOMKilled = true
			res.Violations = append(res.Violations, result.Violation{Kind: "memory", Detail: fmt.Sprintf("the kernel OOM-killed %d process(es) at the container's memory limit", st.OOMKills)})
			if res.Signal == int(unix.SIGKILL) {
				res.Termination = result.OOM
			}
		}
	}
	return res
}
