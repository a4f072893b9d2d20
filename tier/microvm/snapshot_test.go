package microvm_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/result"
	"github.com/moat-sandbox/moat/tier"
	"github.com/moat-sandbox/moat/tier/microvm"
)

// snapMemory is a memory limit no other test uses, so this test's
// snapshot is its own.
const snapMemory = 300 << 20

func withSnapMemory(m *manifest.Manifest) { m.Resources.Memory = snapMemory }

// snapshotFiles lists the snapshot directory (it belongs to these tests).
func snapshotFiles(t *testing.T) []string {
	t.Helper()
	names, _ := filepath.Glob(filepath.Join(home, "microvm", "snapshots", "*"))
	hidden, _ := filepath.Glob(filepath.Join(home, "microvm", "snapshots", ".*"))
	return append(names, hidden...)
}

// ourSnapshot is the snapshot file whose metadata is newest: the one the
// last cold boot saved.
func ourSnapshot(t *testing.T) string {
	t.Helper()
	var best string
	var bestT time.Time
	for _, p := range snapshotFiles(t) {
		if !strings.HasSuffix(p, ".vm") {
			continue
		}
		fi, err := os.Stat(p)
		if err == nil && fi.ModTime().After(bestT) {
			best, bestT = p, fi.ModTime()
		}
	}
	if best == "" {
		t.Fatalf("no snapshot file in %v", snapshotFiles(t))
	}
	return best
}

// TestSnapshot: the first VM of a configuration boots and is saved; the
// next ones are restored, run their command, get their own random bytes
// and the host's clock; a corrupt snapshot (bad digest) and an invalid one
// (good digest, not a migration stream) fall back to a cold boot that
// saves a new snapshot; nothing of the runs is left behind.
func TestSnapshot(t *testing.T) {
	v := need(t, microvm.Options{})
	e := newEngine(t, v)
	for _, p := range snapshotFiles(t) {
		os.Remove(p)
	}
	const prog = "import os,time;print(os.urandom(16).hex(), time.time())"
	type got struct {
		rnd   string
		clock float64
		start string
	}
	run := func(wantStart string) got {
		t.Helper()
		before := time.Now()
		res := runVM(t, e, withSnapMemory, "python3", "-c", prog)
		after := time.Now()
		if res.Termination != result.Exited || res.ExitCode != 0 {
			t.Fatalf("termination=%s exit=%d error=%q stderr=%q runtime=%q", res.Termination, res.ExitCode, res.Error, res.Stderr.Data, res.Runtime)
		}
		_, start, _ := strings.Cut(res.Runtime, " start=")
		if !strings.HasPrefix(start, wantStart) {
			t.Errorf("started %q, want %q", start, wantStart)
		}
		f := strings.Fields(res.Stdout.Data)
		if len(f) != 2 || len(f[0]) != 32 {
			t.Fatalf("stdout %q", res.Stdout.Data)
		}
		clock, err := strconv.ParseFloat(f[1], 64)
		if err != nil {
			t.Fatal(err)
		}
		// The guest's clock is set from the request: inside the host's
		// bracket of the run (a restored clock would be the snapshot's).
		g := time.Unix(0, int64(clock*1e9))
		if g.Before(before.Add(-2*time.Second)) || g.After(after.Add(2*time.Second)) {
			t.Errorf("guest clock %v outside the run's [%v, %v]", g, before, after)
		}
		return got{f[0], clock, start}
	}
	cold := run("cold boot (no snapshot yet); saved as the snapshot")
	snap := ourSnapshot(t)
	fi, err := os.Stat(snap)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("snapshot mode %v, want 0600", fi.Mode().Perm())
	}
	meta := strings.TrimSuffix(snap, ".vm") + ".json"
	if mi, err := os.Stat(meta); err != nil || mi.Mode().Perm() != 0o600 {
		t.Errorf("snapshot metadata: %v %v", mi, err)
	}
	t.Logf("snapshot %s: %d MiB", filepath.Base(snap), fi.Size()>>20)
	a, b := run("restored"), run("restored")
	if a.rnd == b.rnd || a.rnd == cold.rnd || b.rnd == cold.rnd {
		t.Errorf("random bytes repeat across VMs: cold %s, restored %s and %s", cold.rnd, a.rnd, b.rnd)
	}

	// Corrupt: one byte changed in the middle, same size.
	f, err := os.OpenFile(snap, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	var one [1]byte
	f.ReadAt(one[:], fi.Size()/2)
	one[0] ^= 0xff
	f.WriteAt(one[:], fi.Size()/2)
	f.Close()
	run("cold boot (snapshot rejected: snapshot " + snap + " has sha256")
	run("restored")

	// Invalid: a matching digest over garbage, so QEMU itself refuses it.
	junk := []byte(strings.Repeat("not a migration stream\n", 1000))
	if err := os.WriteFile(snap, junk, 0o600); err != nil {
		t.Fatal(err)
	}
	var mm map[string]any
	mb, _ := os.ReadFile(meta)
	json.Unmarshal(mb, &mm)
	mm["sha256"], mm["size"] = sha256hex(junk), len(junk)
	mb, _ = json.Marshal(mm)
	if err := os.WriteFile(meta, mb, 0o600); err != nil {
		t.Fatal(err)
	}
	run("cold boot (restore failed: ")
	run("restored")
	for _, p := range snapshotFiles(t) {
		if b := filepath.Base(p); strings.HasPrefix(b, ".") {
			t.Errorf("half-written snapshot left: %s", p)
		}
	}
}

// BenchmarkRestoreToResult measures request-to-result for `python3 -c
// pass` from a VM restored from its snapshot against a cold-booted VM
// (snapshots off), interleaved in one run.
func BenchmarkRestoreToResult(b *testing.B) {
	coldVM := need(b, microvm.Options{NoSnapshot: true})
	snapVM := need(b, microvm.Options{})
	engines := make([]*engine.Engine, 2)
	for i, v := range []*microvm.MicroVM{coldVM, snapVM} {
		e, err := engine.New(engine.Options{NoAutoBuild: true, Tiers: map[string]tier.Tier{microvm.Name: v}})
		if err != nil {
			b.Fatal(err)
		}
		engines[i] = e
	}
	run := func(e *engine.Engine) (*result.Result, time.Duration) {
		m := manifest.Default()
		m.Tier = microvm.Name
		start := time.Now()
		res, err := e.Run(context.Background(), &engine.Request{Manifest: m, Argv: []string{"python3", "-c", "pass"}})
		if err != nil {
			b.Fatal(err)
		}
		if res.Termination != result.Exited || res.ExitCode != 0 {
			b.Fatalf("termination=%s exit=%d error=%q", res.Termination, res.ExitCode, res.Error)
		}
		return res, time.Since(start)
	}
	b.StopTimer()
	run(engines[1]) // makes the snapshot when there is none
	b.StartTimer()
	var took [2]time.Duration
	for i := 0; i < b.N; i++ {
		for j, e := range engines {
			res, d := run(e)
			took[j] += d
			want := []string{"start=cold boot (snapshots are off", "start=restored"}[j]
			if !strings.Contains(res.Runtime, want) {
				b.Fatalf("runtime %q, want %q", res.Runtime, want)
			}
		}
	}
	n := float64(b.N)
	b.ReportMetric(float64(took[0].Microseconds())/1000/n, "cold-ms/op")
	b.ReportMetric(float64(took[1].Microseconds())/1000/n, "restored-ms/op")
	b.ReportMetric(float64(took[1])/float64(took[0]), "restored/cold")
}

func sha256hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// TestVMMMissing: a VMM that is not there makes the tier unavailable,
// naming it; one that cannot start (here a program that exits at once, run
// in the jail as QEMU would be) is an infrastructure error naming why, not
// a panic or a hang.
func TestVMMMissing(t *testing.T) {
	if skipReason != "" {
		t.Skip(skipReason)
	}
	_, err := microvm.New(microvm.Options{Home: home, Agent: agentBin, QEMU: "/nonexistent/qemu-system-x86_64", Accel: "tcg"})
	if !errors.Is(err, tier.ErrUnavailable) || !strings.Contains(err.Error(), "/nonexistent/qemu-system-x86_64") {
		t.Errorf("New with a missing QEMU: %v", err)
	}
	v := need(t, microvm.Options{QEMU: "/bin/false", Accel: "tcg", NoSnapshot: true})
	e := newEngine(t, v)
	res := runVM(t, e, nil, "true")
	if res.Termination != result.InfraError || !strings.Contains(res.Error, "VMM exited") {
		t.Errorf("termination=%s error=%q", res.Termination, res.Error)
	}
}
