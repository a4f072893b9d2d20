package incident

import (
	"archive/tar"
	"compress/gzip"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/result"
)

// testStore is a store in a temporary directory that its cleanup can
// remove without root: bundles are read-only.
func testStore(t testing.TB, pol Policy) *Store {
	t.Helper()
	st := Open(filepath.Join(t.TempDir(), "incidents"), pol)
	t.Cleanup(func() { removeBundle(st.Dir()) })
	return st
}

func TestReasons(t *testing.T) {
	tests := []struct {
		name string
		res  *result.Result
		want []string // prefixes of the reasons, in order; nil: not flagged
	}{
		{"nil result", nil, nil},
		{"clean exit", &result.Result{Termination: result.Exited}, nil},
		{"timeout does not flag", &result.Result{Termination: result.Timeout, Violations: []result.Violation{{Kind: "timeout"}}}, nil},
		{"limits do not flag", &result.Result{Violations: []result.Violation{{Kind: "memory"}, {Kind: "pids"}, {Kind: "output"}, {Kind: "disk"}, {Kind: "files"}, {Kind: "file-size"}, {Kind: "cpu-time"}, {Kind: "cancelled"}, {Kind: "diff"}}}, nil},
		{"canary", &result.Result{Violations: []result.Violation{{Kind: "canary", Detail: "AWS key in stdout"}}}, []string{"canary: AWS key in stdout"}},
		{"secret exfiltration", &result.Result{Violations: []result.Violation{{Kind: "secret-exfiltration", Detail: "tok to evil.example"}}}, []string{"secret-exfiltration: tok to evil.example"}},
		{"typosquat", &result.Result{Violations: []result.Violation{{Kind: "package", Detail: "reqeusts refused"}}}, []string{"package: reqeusts"}},
		{"seccomp kill", &result.Result{Termination: result.Policy, Violations: []result.Violation{{Kind: "syscall", Detail: "SIGSYS"}}}, []string{"syscall: SIGSYS"}},
		{"hostile file name", &result.Result{Violations: []result.Violation{{Kind: "filename", Detail: "escape"}}}, []string{"filename: escape"}},
		{"policy violation", &result.Result{Violations: []result.Violation{{Kind: "policy", Detail: "denied"}}}, []string{"policy: denied"}},
		{"policy termination alone", &result.Result{Termination: result.Policy}, []string{"termination: policy"}},
		{"mixed keeps only flagging kinds", &result.Result{Violations: []result.Violation{{Kind: "timeout"}, {Kind: "canary", Detail: "a"}, {Kind: "memory"}}}, []string{"canary: a"}},
		{"many of one kind are capped", &result.Result{Violations: []result.Violation{{Kind: "canary", Detail: "1"}, {Kind: "canary", Detail: "2"}, {Kind: "canary", Detail: "3"}, {Kind: "canary", Detail: "4"}}}, []string{"canary: 1", "canary: 2", "canary: 3"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := Reasons(tc.res)
			if len(got) != len(tc.want) {
				t.Fatalf("Reasons = %q, want %d like %q", got, len(tc.want), tc.want)
			}
			for i := range got {
				if !strings.HasPrefix(got[i], tc.want[i]) {
					t.Errorf("reason %d = %q, want prefix %q", i, got[i], tc.want[i])
				}
			}
			if Flagged(tc.res) != (len(tc.want) > 0) {
				t.Errorf("Flagged = %v, want %v", Flagged(tc.res), len(tc.want) > 0)
			}
		})
	}
}

// hostileWorkspace is a workspace a flagged run left: a stolen file, a
// symlink out of the sandbox, a file with an escape in its name, a big
// file, and a diff that lists them.
func hostileWorkspace(t *testing.T) (string, []result.FileChange) {
	t.Helper()
	ws := t.TempDir()
	write := func(name, data string) {
		if err := os.WriteFile(filepath.Join(ws, name), []byte(data), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write("loot.txt", "AKIAFAKEFAKEFAKE\n")
	write("evil\x1b]0;pwned\x07.sh", "#!/bin/sh\nrm -rf /\n")
	write("big.bin", strings.Repeat("x", 64<<10))
	if err := os.Symlink("/etc/shadow", filepath.Join(ws, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(ws, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	// A file swapped for a symlink after the diff: the diff says file.
	if err := os.Symlink("/etc/passwd", filepath.Join(ws, "sub", "swapped")); err != nil {
		t.Fatal(err)
	}
	return ws, []result.FileChange{
		{Path: "loot.txt", Change: result.Added, Type: "file", Size: 17},
		{Path: "evil\x1b]0;pwned\x07.sh", Change: result.Added, Type: "file", Size: 20},
		{Path: "big.bin", Change: result.Added, Type: "file", Size: 64 << 10},
		{Path: "link", Change: result.Added, Type: "symlink"},
		{Path: "sub", Change: result.Added, Type: "dir"},
		{Path: "sub/swapped", Change: result.Modified, Type: "file", Size: 10},
		{Path: "gone.txt", Change: result.Deleted, Type: "file"},
		{Path: "../../etc/passwd", Change: result.Added, Type: "file", Size: 10},
		{Path: "bad\xffname", Change: result.Added, Type: "file", Size: 3},
	}
}

func flaggedEvidence(t *testing.T) *Evidence {
	t.Helper()
	ws, files := hostileWorkspace(t)
	m := manifest.Default()
	m.Inputs = []manifest.Input{{Src: "/data/customers", Dst: "customers"}}
	m.Network.Mode = "allowlist"
	m.Network.Allow = []string{"api.example.com"}
	m.Secrets = []manifest.Secret{{Name: "gh-token", Hosts: []string{"api.example.com"}}}
	m.Packages.PyPI.Allow = []string{"requests==2.31.0"}
	return &Evidence{
		Key: "k0123456789ab", Manifest: m, Commands: [][]string{{"sh", "-c", "cat .aws/credentials"}},
		Result: &result.Result{ID: "run1", Tier: "native", Command: []string{"sh", "-c", "cat .aws/credentials"},
			Violations:  []result.Violation{{Kind: "canary", Detail: "decoy AWS key in stdout"}},
			Network:     []result.NetworkAttempt{{Host: "evil.example", Port: 443, Reason: "not-allowlisted"}},
			SecretsUsed: []result.SecretUse{{Name: "gh-token", Host: "api.example.com", Requests: 2}},
			Files:       files},
		Procs:        []Process{{PID: 42, Name: "sh", Cmdline: []string{"sh", "-c", "sleep 1"}}},
		Audit:        json.RawMessage(`{"id":"run1","status":"running"}`),
		WorkspaceDir: ws,
	}
}

func TestKeepBundle(t *testing.T) {
	st := testStore(t, Policy{MaxBundleBytes: 32 << 10})
	sum, err := st.Keep(flaggedEvidence(t))
	if err != nil {
		t.Fatal(err)
	}
	dir, err := st.Path(sum.ID)
	if err != nil {
		t.Fatal(err)
	}
	wantFiles := []string{"manifest.json", "commands.json", "result.json", "network.json", "processes.json", "audit.json", "workspace/1", "workspace/2", "workspace.json", "summary.json"}
	slices.Sort(wantFiles)
	var got []string
	euid := os.Geteuid()
	err = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); !ok || int(st.Uid) != euid {
			t.Errorf("%s is not owned by uid %d", p, euid)
		}
		rel, _ := filepath.Rel(dir, p)
		switch {
		case d.IsDir():
			if fi.Mode().Perm() != 0o500 {
				t.Errorf("directory %s has mode %04o, want %04o", rel, fi.Mode().Perm(), 0o500)
			}
		case fi.Mode().IsRegular():
			if fi.Mode().Perm() != 0o400 {
				t.Errorf("file %s has mode %04o, want %04o", rel, fi.Mode().Perm(), 0o400)
			}
			got = append(got, rel)
		default:
			t.Errorf("%s is neither a file nor a directory (%s)", rel, fi.Mode())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(got)
	if !slices.Equal(got, wantFiles) {
		t.Errorf("bundle files %q, want %q", got, wantFiles)
	}
	gotSum := slices.Clone(sum.Files)
	slices.Sort(gotSum)
	if !slices.Equal(gotSum, wantFiles) {
		t.Errorf("summary lists %q, want %q", gotSum, wantFiles)
	}
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	if s := read("workspace/1"); s != "AKIAFAKEFAKEFAKE\n" {
		t.Errorf("workspace/1 = %q, want the stolen file", s)
	}
	var idx struct {
		Entries []workspaceEntry `json:"entries"`
	}
	if err := json.Unmarshal([]byte(read("workspace.json")), &idx); err != nil {
		t.Fatal(err)
	}
	why := map[string]workspaceEntry{}
	for _, e := range idx.Entries {
		why[e.Path] = e
	}
	for _, tc := range []struct{ path, stored, omitted string }{
		{"loot.txt", "workspace/1", ""},
		{"evil\x1b]0;pwned\x07.sh", "workspace/2", ""},
		{"big.bin", "", "over the bundle's cap"},
		{"link", "", "not a regular file (symlink)"},
		{"sub", "", "not a regular file (dir)"},
		{"sub/swapped", "", "not copied"},
		{"gone.txt", "", ""},
		{"../../etc/passwd", "", "not copied"},
		{"YmFk/25hbWU=", "", "not copied"},
	} {
		e, ok := why[tc.path]
		if !ok {
			t.Errorf("workspace.json lacks %q", tc.path)
			continue
		}
		if e.Stored != tc.stored || !strings.HasPrefix(e.Omitted, tc.omitted) || (tc.omitted == "" && e.Omitted != "") {
			t.Errorf("%q: stored %q omitted %q, want stored %q omitted %q...", tc.path, e.Stored, e.Omitted, tc.stored, tc.omitted)
		}
	}
	if sum.Key != "k0123456789ab" || sum.RunID != "run1" || len(sum.Reasons) != 1 || !strings.HasPrefix(sum.Reasons[0], "canary") {
		t.Errorf("summary %+v", sum)
	}
	x := sum.Exposure
	if !slices.Equal(x.Inputs, []string{"/data/customers -> /workspace/customers"}) || !slices.Equal(x.Allow, []string{"api.example.com"}) ||
		len(x.Secrets) != 1 || x.Secrets[0].Name != "gh-token" || !slices.Equal(x.Packages, []string{"pypi:requests==2.31.0"}) ||
		!slices.Equal(x.SecretsUsed, []string{"gh-token -> api.example.com (2 requests)"}) || x.Network != "allowlist" {
		t.Errorf("exposure %+v", x)
	}
	if !strings.Contains(read("audit.json"), `"status":"running"`) || !strings.Contains(read("processes.json"), `"sleep 1"`) ||
		!strings.Contains(read("network.json"), "evil.example") || !strings.Contains(read("commands.json"), ".aws/credentials") {
		t.Error("audit, processes, network or commands are not the evidence's")
	}
	var total int64
	for _, f := range sum.Files {
		fi, _ := os.Stat(filepath.Join(dir, f))
		total += fi.Size()
	}
	if total > st.Policy().MaxBundleBytes || sum.Bytes < total {
		t.Errorf("bundle holds %d bytes, summary says %d, cap %d", total, sum.Bytes, st.Policy().MaxBundleBytes)
	}
	// Nothing but the bundle is left in the store.
	ents, _ := os.ReadDir(st.Dir())
	if len(ents) != 1 || ents[0].Name() != sum.ID {
		t.Errorf("store holds %v, want only %s", ents, sum.ID)
	}
}

func TestKeepWithoutWorkspaceOrAudit(t *testing.T) {
	st := testStore(t, Policy{})
	sum, err := st.Keep(&Evidence{Result: &result.Result{ID: "r", Violations: []result.Violation{{Kind: "syscall"}},
		Files: []result.FileChange{{Path: "a", Change: result.Added, Type: "file", Size: 1}}}, ProcsNote: "not available: wasm"})
	if err != nil {
		t.Fatal(err)
	}
	dir, _ := st.Path(sum.ID)
	for name, want := range map[string]string{
		"processes.json": "not available: wasm", "audit.json": "not available", "workspace.json": "workspace was gone", "manifest.json": "not available",
	} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil || !strings.Contains(string(b), want) {
			t.Errorf("%s = %q (%v), want it to say %q", name, b, err, want)
		}
	}
	if _, err := st.Keep(nil); err == nil {
		t.Error("Keep(nil) succeeded")
	}
}

// keepAt writes a bundle as if at time at, of about size bytes.
func keepAt(t *testing.T, st *Store, at time.Time, size int) Summary {
	t.Helper()
	st.now = func() time.Time { return at }
	ws := t.TempDir()
	os.WriteFile(filepath.Join(ws, "f"), make([]byte, size), 0o644)
	sum, err := st.Keep(&Evidence{WorkspaceDir: ws, Result: &result.Result{ID: "r", Violations: []result.Violation{{Kind: "canary"}},
		Files: []result.FileChange{{Path: "f", Change: result.Added, Type: "file", Size: int64(size)}}}})
	if err != nil {
		t.Fatal(err)
	}
	return sum
}

func TestPrune(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		name    string
		pol     Policy
		ages    []time.Duration // how long before now each bundle was written
		size    int
		reserve int64
		keep    []int // indexes of the bundles left
	}{
		{"nothing to prune", Policy{}, []time.Duration{3 * time.Hour, 2 * time.Hour, time.Hour}, 100, 0, []int{0, 1, 2}},
		{"past max age", Policy{MaxAge: 90 * time.Minute}, []time.Duration{3 * time.Hour, 2 * time.Hour, time.Hour}, 100, 0, []int{2}},
		{"over total: oldest first", Policy{MaxTotalBytes: 2*20000 + 8000}, []time.Duration{3 * time.Hour, 2 * time.Hour, time.Hour}, 16000, 0, []int{1, 2}},
		{"reserve makes room for a new one", Policy{MaxTotalBytes: 3*20000 + 8000}, []time.Duration{3 * time.Hour, 2 * time.Hour, time.Hour}, 16000, 20000, []int{1, 2}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st := testStore(t, Policy{MaxBundleBytes: 1 << 20})
			now := t0.Add(24 * time.Hour)
			var ids []string
			for _, age := range tc.ages {
				ids = append(ids, keepAt(t, st, now.Add(-age), tc.size).ID)
			}
			st.pol = tc.pol.withDefaults()
			st.now = func() time.Time { return now }
			if _, err := st.Prune(tc.reserve); err != nil {
				t.Fatal(err)
			}
			left, _ := st.List()
			var got []string
			for _, s := range left {
				got = append(got, s.ID)
			}
			var want []string
			for i := len(tc.keep) - 1; i >= 0; i-- { // List is newest first
				want = append(want, ids[tc.keep[i]])
			}
			if !slices.Equal(got, want) {
				t.Errorf("left %q, want %q", got, want)
			}
		})
	}
}

func TestKeepPrunesOldest(t *testing.T) {
	st := testStore(t, Policy{MaxBundleBytes: 1 << 20, MaxTotalBytes: 50000})
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	first := keepAt(t, st, t0, 20000)
	second := keepAt(t, st, t0.Add(time.Minute), 20000)
	third := keepAt(t, st, t0.Add(2*time.Minute), 20000)
	for _, c := range []struct {
		id   string
		want bool
	}{{first.ID, false}, {second.ID, true}, {third.ID, true}} {
		if _, err := st.Path(c.id); (err == nil) != c.want {
			t.Errorf("bundle %s present = %v, want %v", c.id, err == nil, c.want)
		}
	}
}

func TestUnknownIDs(t *testing.T) {
	st := testStore(t, Policy{})
	sum, err := st.Keep(&Evidence{Result: &result.Result{ID: "r", Violations: []result.Violation{{Kind: "canary"}}}})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct{ name, id string }{
		{"empty", ""},
		{"traversal", "../../etc"},
		{"absolute", "/etc/passwd"},
		{"well-formed but absent", "20200101T000000Z-00000000"},
		{"with a slash", sum.ID + "/summary.json"},
		{"temporary directory", ".tmp-123"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := st.Get(tc.id); !errors.Is(err, ErrNotFound) {
				t.Errorf("Get: %v, want ErrNotFound", err)
			}
			if err := st.Remove(tc.id); !errors.Is(err, ErrNotFound) {
				t.Errorf("Remove: %v, want ErrNotFound", err)
			}
			if err := st.Export(tc.id, filepath.Join(t.TempDir(), "x.tar.gz")); !errors.Is(err, ErrNotFound) {
				t.Errorf("Export: %v, want ErrNotFound", err)
			}
		})
	}
	if err := st.Remove(sum.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Get(sum.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("after Remove, Get: %v", err)
	}
	if ents, _ := os.ReadDir(st.Dir()); len(ents) != 0 {
		t.Errorf("Remove left %v", ents)
	}
}

func TestExport(t *testing.T) {
	st := testStore(t, Policy{})
	sum, err := st.Keep(flaggedEvidence(t))
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "bundle.tar.gz")
	if err := st.Export(sum.ID, out); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(out)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("export %v: %v, want mode 0600", fi.Mode(), err)
	}
	f, _ := os.Open(out)
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			names = append(names, strings.TrimPrefix(h.Name, sum.ID+"/"))
		}
		if !strings.HasPrefix(h.Name, sum.ID+"/") {
			t.Errorf("entry %q is not under %s/", h.Name, sum.ID)
		}
	}
	slices.Sort(names)
	want := slices.Clone(sum.Files)
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Errorf("archive holds %q, want %q", names, want)
	}
	// Never overwrite, never follow a symlink to a victim.
	victim := filepath.Join(t.TempDir(), "victim")
	os.WriteFile(victim, []byte("keep me"), 0o644)
	link := filepath.Join(t.TempDir(), "link")
	os.Symlink(victim, link)
	for _, dst := range []string{out, victim, link} {
		if err := st.Export(sum.ID, dst); !errors.Is(err, ErrExists) {
			t.Errorf("Export to existing %s: %v, want ErrExists", dst, err)
		}
	}
	if b, _ := os.ReadFile(victim); string(b) != "keep me" {
		t.Errorf("victim now %q", b)
	}
}

// FuzzKeepNames keeps bundles of workspaces whose diff names files as a
// hostile program would: whatever the name, the bundle holds only its
// own fixed names, and the name is only data in workspace.json.
func FuzzKeepNames(f *testing.F) {
	for _, s := range []string{"loot.txt", "../../../etc/passwd", "a/../../b", "\x1b]0;x\x07", "bad\xffname", "..", ".", "", "/abs", "dir/", "\u202eevil"} {
		f.Add(s, []byte("data"))
	}
	f.Fuzz(func(t *testing.T, name string, data []byte) {
		ws := t.TempDir()
		if name != "" && !strings.ContainsRune(name, 0) && !strings.Contains(name, "/") && name != "." && name != ".." && len(name) < 200 {
			os.WriteFile(filepath.Join(ws, name), data, 0o644)
		}
		st := testStore(t, Policy{MaxBundleBytes: 1 << 16})
		sum, err := st.Keep(&Evidence{WorkspaceDir: ws, Result: &result.Result{ID: "r", Violations: []result.Violation{{Kind: "canary"}},
			Files: []result.FileChange{{Path: name, Change: result.Added, Type: "file", Size: int64(len(data))}}}})
		if err != nil {
			t.Fatal(err)
		}
		dir, _ := st.Path(sum.ID)
		filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
			rel, _ := filepath.Rel(dir, p)
			if rel != "." && rel != "workspace" && !slices.Contains(sum.Files, rel) {
				t.Errorf("bundle holds %q, not one of its own names", rel)
			}
			return nil
		})
		if ents, _ := os.ReadDir(st.Dir()); len(ents) != 1 {
			t.Errorf("store holds %d entries", len(ents))
		}
	})
}
