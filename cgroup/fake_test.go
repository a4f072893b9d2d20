package cgroup

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// These tests run the v1 and v2 code paths against a fake cgroupfs in
// t.TempDir(): a fake mountinfo points the Host at the temp tree, and the
// fake mkdir populates each new directory with the interface files the
// kernel would create. They need no privileges and no particular host, so
// the v2 path is covered on this v1 CI host.

// v2Files are the interface files of a fresh non-root v2 cgroup.
var v2Files = map[string]string{
	"cgroup.controllers":     "cpuset cpu io memory hugetlb pids rdma misc\n",
	"cgroup.subtree_control": "",
	"cgroup.procs":           "",
	"cgroup.kill":            "",
	"cgroup.freeze":          "0\n",
	"cgroup.events":          "populated 0\nfrozen 0\n",
	"memory.max":             "max\n",
	"memory.swap.max":        "max\n",
	"memory.oom.group":       "0\n",
	"memory.current":         "0\n",
	"memory.peak":            "0\n",
	"memory.events":          "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n",
	"pids.max":               "max\n",
	"pids.events":            "max 0\n",
	"cpu.max":                "max 100000\n",
	"cpu.stat":               "usage_usec 0\nuser_usec 0\nsystem_usec 0\n",
}

// v1Files are the interface files of a fresh v1 cgroup, by controller.
var v1Files = map[string]map[string]string{
	"memory": {
		"memory.limit_in_bytes":     "9223372036854771712\n",
		"memory.max_usage_in_bytes": "0\n",
		"memory.failcnt":            "0\n",
		"memory.swappiness":         "60\n",
		"memory.oom_control":        "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n",
	},
	"pids":    {"pids.max": "max\n", "pids.events": "max 0\n"},
	"cpu":     {"cpu.cfs_quota_us": "-1\n", "cpu.cfs_period_us": "100000\n"},
	"cpuacct": {"cpuacct.usage": "0\n"},
	"freezer": {"freezer.state": "THAWED\n"},
}

type fakeTree struct {
	t        *testing.T
	root     string
	files    func(dir string) map[string]string
	omit     map[string]bool // interface files the fake kernel lacks
	readOnly map[string]bool // directories fs.writable reports as not writable
	// delegated are the directories fs.delegated reports as delegated
	// by systemd (the trusted.delegate xattr).
	delegated map[string]bool
	mkdirs    []string
}

func (f *fakeTree) ops() fsOps {
	return fsOps{
		mkdir: func(p string) error {
			if err := unix.Mkdir(p, 0o755); err != nil {
				return err
			}
			f.mkdirs = append(f.mkdirs, p)
			f.populate(p)
			return nil
		},
		rmdir: func(p string) error {
			ents, err := os.ReadDir(p)
			if err != nil {
				return unix.ENOENT
			}
			for _, e := range ents {
				if e.IsDir() {
					return unix.EBUSY // a cgroup with children
				}
			}
			return os.RemoveAll(p)
		},
		writable:  func(dir string) bool { return !f.readOnly[dir] },
		delegated: func(dir string) bool { return f.delegated[dir] },
	}
}

func (f *fakeTree) populate(dir string) {
	f.t.Helper()
	for name, content := range f.files(dir) {
		if f.omit[name] {
			continue
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			f.t.Fatal(err)
		}
	}
}

func (f *fakeTree) read(rel string) string {
	f.t.Helper()
	b, err := os.ReadFile(filepath.Join(f.root, rel))
	if err != nil {
		f.t.Fatal(err)
	}
	return string(b)
}

func (f *fakeTree) write(rel, content string) {
	f.t.Helper()
	if err := os.WriteFile(filepath.Join(f.root, rel), []byte(content), 0o644); err != nil {
		f.t.Fatal(err)
	}
}

// newFakeV2 builds a cgroup2 mount at <tmp>/cg and a /proc/self/cgroup
// placing us in ownPath, and returns the tree plus the paths for detect.
func newFakeV2(t *testing.T, ownPath string) (*fakeTree, string, string) {
	t.Helper()
	tmp := t.TempDir()
	f := &fakeTree{t: t, root: filepath.Join(tmp, "cg"), files: func(string) map[string]string { return v2Files }, readOnly: map[string]bool{}}
	if err := os.MkdirAll(filepath.Join(f.root, ownPath), 0o755); err != nil {
		t.Fatal(err)
	}
	for d := filepath.Join(f.root, ownPath); ; d = filepath.Dir(d) {
		f.populate(d)
		if d == f.root {
			break
		}
	}
	mi := filepath.Join(tmp, "mountinfo")
	pc := filepath.Join(tmp, "cgroup")
	writeTemp(t, mi, "24 18 0:22 / "+f.root+" rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n")
	writeTemp(t, pc, "0::"+ownPath+"\n")
	return f, mi, pc
}

func writeTemp(t *testing.T, p, s string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestFakeV2CreateWritesLimits(t *testing.T) {
	f, mi, pc := newFakeV2(t, "/")
	h, err := detect(mi, pc, f.ops())
	if err != nil {
		t.Fatal(err)
	}
	if h.Version != V2 || h.v2Parent != filepath.Join(f.root, "moat") {
		t.Fatalf("detect: version %v parent %s", h.Version, h.v2Parent)
	}
	if len(f.mkdirs) != 0 {
		t.Fatalf("Detect created %v; it must only inspect", f.mkdirs)
	}
	c, err := h.Create("run-1", Limits{MemoryBytes: 64 << 20, Pids: 32, CPUs: 1.5})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct{ file, want string }{
		{"cgroup.subtree_control", "+memory +pids +cpu"},
		{"moat/cgroup.subtree_control", "+memory +pids +cpu"},
		{"moat/run-1/memory.max", "67108864"},
		{"moat/run-1/memory.swap.max", "0"},
		{"moat/run-1/memory.oom.group", "1"},
		{"moat/run-1/pids.max", "32"},
		{"moat/run-1/cpu.max", "150000 100000"},
	}
	for _, tc := range tests {
		if got := f.read(tc.file); got != tc.want {
			t.Errorf("%s = %q, want %q", tc.file, got, tc.want)
		}
	}
	fd, ok := c.FD()
	if !ok || fd < 0 {
		t.Fatalf("FD() = %d, %v on v2", fd, ok)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		t.Errorf("FD is not a directory: %v", err)
	}

	// A second Create reuses the prepared parent: exactly one mkdir.
	f.mkdirs = nil
	c2, err := h.Create("run-2", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{filepath.Join(f.root, "moat/run-2")}; !reflect.DeepEqual(f.mkdirs, want) {
		t.Errorf("second Create made %v, want %v", f.mkdirs, want)
	}
	if got := f.read("moat/run-2/memory.max"); got != "max\n" {
		t.Errorf("unset memory limit was written: %q", got)
	}

	for _, c := range []*Cgroup{c, c2} {
		if err := c.Destroy(); err != nil {
			t.Fatal(err)
		}
		if err := c.Destroy(); err != nil {
			t.Fatalf("second Destroy: %v", err)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(f.root, "moat", "*", "cgroup.procs")); len(left) != 0 {
		t.Errorf("left behind: %v", left)
	}
	if err := unix.Fstat(fd, &st); err == nil {
		t.Errorf("FD still open after Destroy")
	}
	if err := h.Prune(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(f.root, "moat")); !os.IsNotExist(err) {
		t.Errorf("Prune left moat/: %v", err)
	}
}

func TestFakeV2Stats(t *testing.T) {
	tests := []struct {
		name string
		omit map[string]bool
		peak string // memory.peak, or memory.current when peak is omitted
		want Stats
	}{
		{
			name: "memory.peak",
			peak: "33554432\n",
			want: Stats{CPU: 1234567 * time.Microsecond, PeakMemory: 33554432, OOMKills: 1, MemoryMaxHits: 412, PidsMaxHits: 5},
		},
		{
			name: "before 5.19 peak tracked from memory.current",
			omit: map[string]bool{"memory.peak": true},
			peak: "1000\n",
			want: Stats{CPU: 1234567 * time.Microsecond, PeakMemory: 1000, OOMKills: 1, MemoryMaxHits: 412, PidsMaxHits: 5},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f, mi, pc := newFakeV2(t, "/")
			f.omit = tc.omit
			h, err := detect(mi, pc, f.ops())
			if err != nil {
				t.Fatal(err)
			}
			c, err := h.Create("s", Limits{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Destroy() })
			f.write("moat/s/cpu.stat", "usage_usec 1234567\nuser_usec 1000000\nsystem_usec 234567\n")
			f.write("moat/s/memory.events", "low 0\nhigh 0\nmax 412\noom 2\noom_kill 1\noom_group_kill 1\n")
			f.write("moat/s/pids.events", "max 5\n")
			if tc.omit["memory.peak"] {
				f.write("moat/s/memory.current", tc.peak)
			} else {
				f.write("moat/s/memory.peak", tc.peak)
			}
			got, err := c.Stats()
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("Stats = %+v, want %+v", got, tc.want)
			}
			if tc.omit["memory.peak"] {
				// The processes died: current falls, the tracked peak stays.
				f.write("moat/s/memory.current", "0\n")
				if got, _ := c.Stats(); got.PeakMemory != 1000 {
					t.Errorf("tracked peak fell to %d", got.PeakMemory)
				}
			}
		})
	}
}

func TestFakeV2Parent(t *testing.T) {
	tests := []struct {
		name      string
		own       string
		readOnly  []string // relative to the mount
		delegated []string // relative to the mount: systemd's trusted.delegate xattr
		want      string   // relative to the mount
		wantErr   string
	}{
		{name: "root writable", own: "/system.slice/moat.service", want: "moat"},
		{name: "delegated subtree", own: "/system.slice/moat.service", readOnly: []string{""}, want: "system.slice/moat.service/moat"},
		{name: "nothing writable", own: "/user.slice", readOnly: []string{"", "user.slice"}, wantErr: "not writable"},
		// systemd's Delegate=yes: the runs go in the unit's subtree even
		// though root could write the mount root.
		{name: "systemd Delegate=yes, root writable", own: "/system.slice/moat.service", delegated: []string{"system.slice/moat.service"}, want: "system.slice/moat.service/moat"},
		{name: "systemd Delegate=yes, root not writable", own: "/system.slice/moat.service", readOnly: []string{""}, delegated: []string{"system.slice/moat.service"}, want: "system.slice/moat.service/moat"},
		{name: "delegation of another cgroup is not ours", own: "/system.slice/moat.service", delegated: []string{"system.slice/other.service"}, want: "moat"},
		{name: "delegated but not writable", own: "/system.slice/moat.service", readOnly: []string{"system.slice/moat.service"}, delegated: []string{"system.slice/moat.service"}, wantErr: "delegated to it but not writable"},
		{name: "in the mount root", own: "/", delegated: []string{""}, want: "moat"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f, mi, pc := newFakeV2(t, tc.own)
			for _, r := range tc.readOnly {
				f.readOnly[filepath.Join(f.root, r)] = true
			}
			f.delegated = map[string]bool{}
			for _, d := range tc.delegated {
				f.delegated[filepath.Clean(filepath.Join(f.root, d))] = true
			}
			h, err := detect(mi, pc, f.ops())
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if want := filepath.Join(f.root, tc.want); h.v2Parent != want {
				t.Errorf("parent = %s, want %s", h.v2Parent, want)
			}
			c, err := h.Create("x", Limits{Pids: 8})
			if err != nil {
				t.Fatal(err)
			}
			if got := f.read(filepath.Join(tc.want, "x", "pids.max")); got != "8" {
				t.Errorf("pids.max = %q", got)
			}
			if err := c.Destroy(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestFakeV2ContainerMountRoot(t *testing.T) {
	// The mount shows only /docker/abc of the hierarchy; our cgroup
	// /docker/abc/sub is <mount>/sub.
	m := &mount{root: "/docker/abc", point: "/sys/fs/cgroup", fstype: "cgroup2"}
	got, err := cgroupDir(m, "/docker/abc/sub")
	if err != nil || got != "/sys/fs/cgroup/sub" {
		t.Errorf("cgroupDir = %q, %v", got, err)
	}
	if _, err := cgroupDir(m, "/other"); err == nil {
		t.Errorf("cgroup outside the mount accepted")
	}
}

func TestFakeV2MissingController(t *testing.T) {
	f, mi, pc := newFakeV2(t, "/")
	f.write("cgroup.controllers", "cpu io\n")
	_, err := detect(mi, pc, f.ops())
	var me *MissingError
	if !errors.As(err, &me) || !reflect.DeepEqual(me.Controllers, []string{"memory", "pids"}) {
		t.Fatalf("err = %v, want MissingError for memory, pids", err)
	}
	if !strings.Contains(err.Error(), "cgroup v2 memory, pids controller not available") {
		t.Errorf("message does not name what is missing: %v", err)
	}
}

func TestFakeV2CreateUndoesPartialFailure(t *testing.T) {
	f, mi, pc := newFakeV2(t, "/")
	h, err := detect(mi, pc, f.ops())
	if err != nil {
		t.Fatal(err)
	}
	// A kernel without the pids controller file: the write fails after
	// mkdir and memory.max were done.
	f.omit = map[string]bool{"pids.max": true}
	if _, err := h.Create("bad", Limits{MemoryBytes: 1 << 20, Pids: 4}); err == nil {
		t.Fatal("Create succeeded without pids.max")
	}
	if _, err := os.Stat(filepath.Join(f.root, "moat/bad")); !os.IsNotExist(err) {
		t.Errorf("moat/bad left after failed Create: %v", err)
	}
	// And an existing directory is never adopted.
	f.omit = nil
	c, err := h.Create("dup", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Destroy() })
	if _, err := h.Create("dup", Limits{}); err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Errorf("second Create(dup) = %v, want already exists", err)
	}
	if _, err := os.Stat(filepath.Join(f.root, "moat/dup")); err != nil {
		t.Errorf("failed duplicate Create removed the first: %v", err)
	}
}

func TestFakeV2Orphans(t *testing.T) {
	f, mi, pc := newFakeV2(t, "/")
	// No swap accounting: memory.swap.max is absent, which is fine.
	f.omit = map[string]bool{"memory.swap.max": true}
	h, err := detect(mi, pc, f.ops())
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"b", "a"} {
		if _, err := h.Create(id, Limits{MemoryBytes: 1 << 20}); err != nil {
			t.Fatal(err)
		}
	}
	// Interface files and directories that are not ids are not orphans.
	if err := os.Mkdir(filepath.Join(f.root, "moat", "not.an-id"), 0o755); err != nil {
		t.Fatal(err)
	}
	got, err := h.Orphans()
	if err != nil || !reflect.DeepEqual(got, []string{"a", "b"}) {
		t.Fatalf("Orphans = %v, %v; want [a b]", got, err)
	}
	for _, id := range got {
		if err := h.Remove(id); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.Remove("a"); err != nil {
		t.Errorf("Remove of a removed id: %v", err)
	}
	if err := h.Remove("../x"); err == nil {
		t.Errorf("Remove accepted a bad id")
	}
	if got, _ := h.Orphans(); len(got) != 0 {
		t.Errorf("after Remove: %v", got)
	}
}

// newFakeV1 builds a v1 host; cpu and cpuacct co-mounted when comount.
func newFakeV1(t *testing.T, comount, memsw bool) (*fakeTree, *Host) {
	t.Helper()
	tmp := t.TempDir()
	f := &fakeTree{t: t, root: tmp, readOnly: map[string]bool{}}
	hier := map[string][]string{ // mount dir -> controllers
		"memory": {"memory"}, "pids": {"pids"}, "freezer": {"freezer"},
	}
	if comount {
		hier["cpu,cpuacct"] = []string{"cpu", "cpuacct"}
	} else {
		hier["cpu"], hier["cpuacct"] = []string{"cpu"}, []string{"cpuacct"}
	}
	var mi strings.Builder
	ctlOf := map[string][]string{}
	for dir, ctls := range hier {
		p := filepath.Join(tmp, dir)
		ctlOf[p] = ctls
		if err := os.Mkdir(p, 0o755); err != nil {
			t.Fatal(err)
		}
		mi.WriteString("30 25 0:27 / " + p + " rw - cgroup cgroup rw," + strings.Join(ctls, ",") + "\n")
	}
	if memsw {
		writeTemp(t, filepath.Join(tmp, "memory", "memory.memsw.limit_in_bytes"), "9223372036854771712\n")
	}
	f.files = func(dir string) map[string]string {
		out := map[string]string{"cgroup.procs": ""}
		for m, ctls := range ctlOf {
			if strings.HasPrefix(dir, m+"/") {
				for _, c := range ctls {
					for k, v := range v1Files[c] {
						out[k] = v
					}
					if c == "memory" && memsw {
						out["memory.memsw.limit_in_bytes"] = "9223372036854771712\n"
						out["memory.memsw.failcnt"] = "0\n"
					}
				}
			}
		}
		return out
	}
	writeTemp(t, filepath.Join(tmp, "mountinfo"), mi.String())
	h, err := detect(filepath.Join(tmp, "mountinfo"), "/nonexistent", f.ops())
	if err != nil {
		t.Fatal(err)
	}
	return f, h
}

func TestFakeV1Create(t *testing.T) {
	tests := []struct {
		name          string
		comount       bool
		memsw         bool
		wantDirs      int
		wantMemsw     string // "" = file absent
		wantSwappines string
	}{
		{name: "separate cpu and cpuacct with memsw", memsw: true, wantDirs: 5, wantMemsw: "33554432", wantSwappines: "60\n"},
		{name: "co-mounted cpu,cpuacct without memsw", comount: true, wantDirs: 4, wantSwappines: "0"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f, h := newFakeV1(t, tc.comount, tc.memsw)
			if h.Version != V1 || h.memsw != tc.memsw {
				t.Fatalf("detect: %v memsw=%v", h.Version, h.memsw)
			}
			c, err := h.Create("r", Limits{MemoryBytes: 32 << 20, Pids: 16, CPUs: 0.25})
			if err != nil {
				t.Fatal(err)
			}
			if len(c.Dirs()) != tc.wantDirs {
				t.Errorf("dirs = %v, want %d", c.Dirs(), tc.wantDirs)
			}
			if _, ok := c.FD(); ok {
				t.Errorf("FD() ok on v1")
			}
			cpu := "cpu"
			if tc.comount {
				cpu = "cpu,cpuacct"
			}
			checks := []struct{ file, want string }{
				{"memory/moat/r/memory.limit_in_bytes", "33554432"},
				{"memory/moat/r/memory.swappiness", tc.wantSwappines},
				{"pids/moat/r/pids.max", "16"},
				{cpu + "/moat/r/cpu.cfs_quota_us", "25000"},
				{cpu + "/moat/r/cpu.cfs_period_us", "100000\n"}, // default, not rewritten
			}
			if tc.wantMemsw != "" {
				checks = append(checks, struct{ file, want string }{"memory/moat/r/memory.memsw.limit_in_bytes", tc.wantMemsw})
			}
			for _, ck := range checks {
				if got := f.read(ck.file); got != ck.want {
					t.Errorf("%s = %q, want %q", ck.file, got, ck.want)
				}
			}
			f.write("memory/moat/r/memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
			f.write("memory/moat/r/memory.max_usage_in_bytes", "33554432\n")
			f.write("memory/moat/r/memory.failcnt", "9\n")
			if tc.memsw {
				f.write("memory/moat/r/memory.memsw.failcnt", "0\n")
			}
			f.write("pids/moat/r/pids.events", "max 3\n")
			acct := "cpuacct"
			if tc.comount {
				acct = cpu
			}
			f.write(acct+"/moat/r/cpuacct.usage", "5000000\n")
			st, err := c.Stats()
			if err != nil {
				t.Fatal(err)
			}
			want := Stats{CPU: 5 * time.Millisecond, PeakMemory: 32 << 20, OOMKills: 2, MemoryMaxHits: 9, PidsMaxHits: 3}
			if st != want {
				t.Errorf("Stats = %+v, want %+v", st, want)
			}
			if err := c.Destroy(); err != nil {
				t.Fatal(err)
			}
			for _, p := range h.Parents() {
				if left, _ := filepath.Glob(filepath.Join(p, "*", "cgroup.procs")); len(left) != 0 {
					t.Errorf("left behind: %v", left)
				}
			}
		})
	}
}

func TestFakeV1MissingController(t *testing.T) {
	tmp := t.TempDir()
	mi := filepath.Join(tmp, "mountinfo")
	writeTemp(t, mi, mountinfoHybrid[:strings.Index(mountinfoHybrid, "37 31")]) // no freezer, blkio, pids
	_, err := detect(mi, "/nonexistent", realFS)
	var me *MissingError
	if !errors.As(err, &me) || !reflect.DeepEqual(me.Controllers, []string{"freezer", "pids"}) {
		t.Fatalf("err = %v, want MissingError for freezer, pids", err)
	}
	if !strings.Contains(err.Error(), "cgroup v1 freezer, pids controller not mounted") {
		t.Errorf("message: %v", err)
	}
}

// TestFakeSetCPUs: a CPU limit set after Create (the microvm tier sets it
// when the program starts) is written in each version's format, 0 removes
// it, and a destroyed cgroup or an invalid value is refused.
func TestFakeSetCPUs(t *testing.T) {
	tests := []struct {
		name string
		cpus float64
		v2   string
		v1   string
	}{
		{"one CPU", 1, "100000 100000", "100000"},
		{"a quarter", 0.25, "25000 100000", "25000"},
		{"two and a half", 2.5, "250000 100000", "250000"},
		{"no limit", 0, "max 100000", "-1"},
	}
	f2, mi, pc := newFakeV2(t, "/")
	h2, err := detect(mi, pc, f2.ops())
	if err != nil {
		t.Fatal(err)
	}
	f1, h1 := newFakeV1(t, false, false)
	c2, err := h2.Create("cpu-run", Limits{MemoryBytes: 32 << 20})
	if err != nil {
		t.Fatal(err)
	}
	c1, err := h1.Create("cpu-run", Limits{MemoryBytes: 32 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if got := f2.read("moat/cpu-run/cpu.max"); got != "max 100000\n" {
		t.Fatalf("a cgroup created without a CPU limit has cpu.max %q", got)
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := c2.SetCPUs(tc.cpus); err != nil {
				t.Fatal(err)
			}
			if got := f2.read("moat/cpu-run/cpu.max"); got != tc.v2 {
				t.Errorf("v2 cpu.max = %q, want %q", got, tc.v2)
			}
			if err := c1.SetCPUs(tc.cpus); err != nil {
				t.Fatal(err)
			}
			if got := f1.read("cpu/moat/cpu-run/cpu.cfs_quota_us"); got != tc.v1 {
				t.Errorf("v1 cpu.cfs_quota_us = %q, want %q", got, tc.v1)
			}
		})
	}
	for _, bad := range []float64{-1, 0.001} {
		if err := c2.SetCPUs(bad); err == nil {
			t.Errorf("SetCPUs(%v) accepted", bad)
		}
	}
	for _, c := range []*Cgroup{c1, c2} {
		if err := c.Destroy(); err != nil {
			t.Fatal(err)
		}
		if err := c.SetCPUs(1); err == nil {
			t.Error("SetCPUs on a destroyed cgroup succeeded")
		}
	}
}
