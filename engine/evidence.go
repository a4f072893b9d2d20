package engine

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/moat-sandbox/moat/incident"
	"github.com/moat-sandbox/moat/result"
	"github.com/moat-sandbox/moat/tier"
)

// Incident evidence (issue 21 §4): when a command's result is final and
// flagged (incident.Reasons), the engine keeps a bundle of it — while the
// sandbox still exists, so that the workspace's files and the process
// list can be read — and then destroys the sandbox as it always does.
// Nothing of the sandbox itself survives: the bundle is a copy.

// Evidence says who asked for a run, for its incident bundle.
type Evidence struct {
	// Key is the API key id ("" for the local CLI).
	Key string
	// Audit is the run's audit record as JSON when it began (its end is
	// the result); nil: there is no audit log.
	Audit json.RawMessage
}

// IncidentDir is where an engine with home keeps incident bundles.
func IncidentDir(home string) string { return filepath.Join(home, "incidents") }

// keepEvidence keeps the bundle of x's result res when it is flagged, and
// names it in res.Incident; the bundle's result is the evidence
// (x.evidence: with output withheld from the caller). Failing to keep one is not the run's failure: it is said
// in the result's degradations and on Progress, and the run's result
// stands.
func (e *Engine) keepEvidence(x *execution, res *result.Result, ev Evidence, wsDir string) {
	if e == nil || e.opts.Incidents == nil || !incident.Flagged(res) {
		// (A session built around a prepared sandbox without an engine,
		// as a test does, keeps no evidence either.)
		return
	}
	p, m, st := x.p, x.m, e.opts.Incidents
	procs, note := sandboxProcs(p.sb)
	sum, err := st.Keep(&incident.Evidence{
		RunID: res.ID, Key: ev.Key, Manifest: m, Commands: [][]string{res.Command},
		Result: x.evidence(res), Procs: procs, ProcsNote: note, Audit: ev.Audit, WorkspaceDir: wsDir,
	})
	if err != nil {
		fmt.Fprintf(e.opts.Progress, "moat: run %s is flagged but its incident evidence could not be kept: %v\n", res.ID, err)
		res.Degradations = append(res.Degradations, "incident evidence not kept: "+err.Error())
		return
	}
	res.Incident = sum.ID
}

// sandboxProcs lists the sandbox's processes as the host sees them, or
// says why it cannot.
func sandboxProcs(sb tier.Sandbox) ([]incident.Process, string) {
	pl, ok := sb.(tier.ProcessLister)
	if !ok {
		return nil, "not available: this tier's processes are not host processes"
	}
	pids, err := pl.Procs()
	if err != nil {
		return nil, "not available: " + err.Error()
	}
	out := []incident.Process{}
	for _, pid := range pids {
		out = append(out, readProc(pid))
	}
	return out, ""
}

// readProc reads a process's name and command line from /proc, bounded:
// both are the sandbox's to choose.
func readProc(pid int) incident.Process {
	p := incident.Process{PID: pid, Cmdline: []string{}}
	dir := "/proc/" + strconv.Itoa(pid)
	if b, err := readBounded(dir+"/comm", 64); err == nil {
		p.Name = strings.TrimSuffix(string(b), "\n")
	}
	if b, err := readBounded(dir+"/cmdline", 4096); err == nil {
		for a := range bytes.SplitSeq(bytes.TrimSuffix(b, []byte{0}), []byte{0}) {
			p.Cmdline = append(p.Cmdline, string(a))
		}
	}
	return p
}

func readBounded(path string, n int) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b := make([]byte, n)
	k, err := f.Read(b)
	if k > 0 {
		return b[:k], nil
	}
	return nil, err
}
