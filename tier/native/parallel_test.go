package native_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// parallelRunsEnv scales TestParallelMoatRuns: "PROCSxRUNS", e.g.
// MOAT_PARALLEL_RUNS=16x3000 for a long soak.
const parallelRunsEnv = "MOAT_PARALLEL_RUNS"

// TestParallelMoatRuns: agents fire tool calls at once, each a `moat run`
// process of its own, and every moat run starts with a GC of what killed
// runs left. Processes must not break each other's runs (issue 17: a GC
// took a run being claimed by another process for dead and removed its
// cgroup; a prune took the cgroup parents from under another's Create):
// every run succeeds, and none leaves anything behind.
func TestParallelMoatRuns(t *testing.T) {
	needRoot(t)
	e, err := newEngine()
	if err != nil {
		t.Fatal(err)
	}
	home := e.Home()
	e.Close()
	procs, runs := 8, 25
	if v := os.Getenv(parallelRunsEnv); v != "" {
		p, r, ok := strings.Cut(v, "x")
		pn, err1 := strconv.Atoi(p)
		rn, err2 := strconv.Atoi(r)
		if !ok || err1 != nil || err2 != nil || pn < 1 || rn < 1 {
			t.Fatalf("%s=%q: want PROCSxRUNS, e.g. 16x3000", parallelRunsEnv, v)
		}
		procs, runs = pn, rn
	}
	var mu sync.Mutex
	failures := map[string]int{}
	var ids []string
	var wg sync.WaitGroup
	for range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range runs {
				var stdout, stderr bytes.Buffer
				cmd := exec.Command(moatBin, "run", "--json", "--", "true")
				cmd.Stdout, cmd.Stderr = &stdout, &stderr
				err := cmd.Run()
				var res struct {
					ID          string `json:"id"`
					Termination string `json:"termination"`
					ExitCode    int    `json:"exit_code"`
				}
				jerr := json.Unmarshal(stdout.Bytes(), &res)
				mu.Lock()
				switch {
				case err != nil || jerr != nil:
					failures[fmt.Sprintf("moat run: %v: %s", err, firstLine(stderr.String()))]++
				case res.Termination != "exited" || res.ExitCode != 0:
					failures[fmt.Sprintf("result %s exit %d: %s", res.Termination, res.ExitCode, firstLine(stderr.String()))]++
				case stderr.Len() > 0:
					// "removed leftovers of N killed run(s)": nothing was
					// killed, so another process's live run was collected.
					failures["moat run said: "+firstLine(stderr.String())]++
				}
				if res.ID != "" {
					ids = append(ids, res.ID)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	total := procs * runs
	bad := 0
	var kinds []string
	for k, n := range failures {
		bad += n
		kinds = append(kinds, fmt.Sprintf("%d× %s", n, k))
	}
	sort.Strings(kinds)
	t.Logf("%d runs, %d processes at a time: %d failed", total, procs, bad)
	if bad > 0 {
		t.Errorf("%d of %d parallel runs failed:\n%s", bad, total, strings.Join(kinds, "\n"))
	}
	if len(ids) != total-bad {
		t.Errorf("%d runs reported an id, want %d", len(ids), total-bad)
	}
	for _, l := range leftoversOf(home, ids) {
		t.Errorf("left behind: %s", l)
	}
}

// leftoversOf is leftovers for many runs at once: one look at the host's
// cgroups, run directories, mounts and processes, whatever the number of
// runs (a soak's tens of thousands).
func leftoversOf(home string, ids []string) []string {
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	var left []string
	for _, pat := range []string{"/sys/fs/cgroup/*/moat/*", "/sys/fs/cgroup/moat/*", "/sys/fs/cgroup/*/*/moat/*"} {
		m, _ := filepath.Glob(pat)
		for _, p := range m {
			if want[filepath.Base(p)] {
				left = append(left, "cgroup "+p)
			}
		}
	}
	runs, _ := os.ReadDir(filepath.Join(home, "runs"))
	for _, r := range runs {
		if want[r.Name()] {
			left = append(left, "run directory "+r.Name())
		}
	}
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(mi), "\n") {
	fields:
		for _, f := range strings.Fields(line) {
			for _, part := range strings.Split(f, "/") {
				if want[part] {
					left = append(left, "mount "+line)
					break fields
				}
			}
		}
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cgroup")
	for _, p := range procs {
		b, _ := os.ReadFile(p)
		for _, line := range strings.Split(string(b), "\n") {
			if i := strings.LastIndex(line, "/moat/"); i >= 0 && want[line[i+len("/moat/"):]] {
				left = append(left, "process "+filepath.Base(filepath.Dir(p))+" of run "+line[i+len("/moat/"):])
				break
			}
		}
	}
	return left
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	return line
}
