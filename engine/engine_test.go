package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/image"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/tier"
)

func TestEnvironment(t *testing.T) {
	// Whatever the host has must never reach the program.
	t.Setenv("MOAT_ENGINE_TEST_CANARY", "leaked")
	base := []string{"HOME=/workspace", "LANG=C.UTF-8", "PATH=/usr/local/bin:/usr/bin:/bin", "USER=sandbox"}
	tests := []struct {
		name     string
		imageEnv []string
		env      map[string]string
		want     []string
	}{
		{name: "nothing given", want: base},
		{name: "empty manifest env", env: map[string]string{}, want: base},
		{
			name:     "image overrides the built-in PATH and LANG and adds its own",
			imageEnv: []string{"PATH=/opt/py/bin:/usr/bin", "LANG=en_US.UTF-8", "PYTHONDONTWRITEBYTECODE=1"},
			want:     []string{"HOME=/workspace", "LANG=en_US.UTF-8", "PATH=/opt/py/bin:/usr/bin", "PYTHONDONTWRITEBYTECODE=1", "USER=sandbox"},
		},
		{
			name:     "image cannot move HOME or USER",
			imageEnv: []string{"HOME=/root", "USER=root"},
			want:     base,
		},
		{
			name:     "manifest overrides the image",
			imageEnv: []string{"MODE=slow", "KEEP=1"},
			env:      map[string]string{"MODE": "fast", "A": "b"},
			want:     []string{"A=b", "HOME=/workspace", "KEEP=1", "LANG=C.UTF-8", "MODE=fast", "PATH=/usr/local/bin:/usr/bin:/bin", "USER=sandbox"},
		},
		{
			// The manifest is the user's explicit grant; it may set
			// anything, HOME included ("plus env" in the README).
			name: "manifest may set HOME and PATH",
			env:  map[string]string{"HOME": "/workspace/home", "PATH": "/workspace/bin"},
			want: []string{"HOME=/workspace/home", "LANG=C.UTF-8", "PATH=/workspace/bin", "USER=sandbox"},
		},
		{
			name:     "image entries without = are dropped, values keep their =",
			imageEnv: []string{"NOEQUALS", "OPTS=a=b=c", "EMPTY="},
			want:     []string{"EMPTY=", "HOME=/workspace", "LANG=C.UTF-8", "OPTS=a=b=c", "PATH=/usr/local/bin:/usr/bin:/bin", "USER=sandbox"},
		},
		{
			name: "empty manifest value is kept",
			env:  map[string]string{"EMPTY": ""},
			want: []string{"EMPTY=", "HOME=/workspace", "LANG=C.UTF-8", "PATH=/usr/local/bin:/usr/bin:/bin", "USER=sandbox"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := environment(tc.imageEnv, tc.env)
			if !slices.Equal(got, tc.want) {
				t.Errorf("environment(%q, %v) =\n%q\nwant\n%q", tc.imageEnv, tc.env, got, tc.want)
			}
			if !sort.StringsAreSorted(got) {
				t.Errorf("not sorted: %q", got)
			}
			for _, kv := range got {
				if strings.Contains(kv, "leaked") || strings.HasPrefix(kv, "MOAT_ENGINE_TEST_CANARY=") {
					t.Errorf("the host's environment leaked: %q", kv)
				}
			}
			for _, k := range []string{"HOME", "USER"} {
				if !slices.ContainsFunc(got, func(kv string) bool { return strings.HasPrefix(kv, k+"=") }) {
					t.Errorf("%s is not set: %q", k, got)
				}
			}
		})
	}
}

func TestLimits(t *testing.T) {
	const MiB = int64(manifest.MiB)
	defaults := tier.Limits{
		CPUs: 1, MemoryBytes: 512 * MiB, Pids: 128, Timeout: 30 * time.Second, CPUTime: 30 * time.Second,
		OpenFiles: 256, FileSizeBytes: 64 * MiB, WorkspaceBytes: 256 * MiB, WorkspaceFiles: 10000, TmpBytes: 64 * MiB,
	}
	with := func(f func(l *tier.Limits)) tier.Limits {
		l := defaults
		f(&l)
		return l
	}
	tests := []struct {
		name string
		edit func(m *manifest.Manifest)
		want tier.Limits
	}{
		{name: "defaults", edit: func(*manifest.Manifest) {}, want: defaults},
		{
			name: "every field is mapped",
			edit: func(m *manifest.Manifest) {
				m.Resources = manifest.Resources{
					CPUs: 0.5, Memory: 1024 * manifest.MiB, Pids: 7, Timeout: manifest.Duration(90 * time.Second),
					CPUTime: manifest.Duration(10 * time.Second), OpenFiles: 33, FileSize: 3 * manifest.MiB,
					StdoutBytes: 5, StderrBytes: 6,
				}
				m.Workspace = manifest.Workspace{Size: 9 * manifest.MiB, Files: 99}
			},
			want: tier.Limits{
				CPUs: 0.5, MemoryBytes: 1024 * MiB, Pids: 7, Timeout: 90 * time.Second, CPUTime: 10 * time.Second,
				OpenFiles: 33, FileSizeBytes: 3 * MiB, WorkspaceBytes: 9 * MiB, WorkspaceFiles: 99, TmpBytes: 64 * MiB,
			},
		},
		{
			name: "cpu_time 0 defaults to the timeout",
			edit: func(m *manifest.Manifest) {
				m.Resources.Timeout = manifest.Duration(5 * time.Second)
				m.Resources.CPUTime = 0
			},
			want: with(func(l *tier.Limits) { l.Timeout, l.CPUTime = 5*time.Second, 5*time.Second }),
		},
		{
			name: "cpu_time set apart from the timeout is kept",
			edit: func(m *manifest.Manifest) { m.Resources.CPUTime = manifest.Duration(2 * time.Second) },
			want: with(func(l *tier.Limits) { l.CPUTime = 2 * time.Second }),
		},
		{
			name: "tmp is a quarter of a small memory limit",
			edit: func(m *manifest.Manifest) { m.Resources.Memory = 100 * manifest.MiB },
			want: with(func(l *tier.Limits) { l.MemoryBytes, l.TmpBytes = 100*MiB, 25*MiB }),
		},
		{
			name: "tmp at the boundary",
			edit: func(m *manifest.Manifest) { m.Resources.Memory = 256 * manifest.MiB },
			want: with(func(l *tier.Limits) { l.MemoryBytes, l.TmpBytes = 256*MiB, 64*MiB }),
		},
		{
			name: "tmp is capped at 64MiB",
			edit: func(m *manifest.Manifest) { m.Resources.Memory = 64 << 30 },
			want: with(func(l *tier.Limits) { l.MemoryBytes, l.TmpBytes = 64<<30, 64*MiB }),
		},
		{
			name: "tmp of the smallest memory limit",
			edit: func(m *manifest.Manifest) { m.Resources.Memory = 4 * manifest.MiB },
			want: with(func(l *tier.Limits) { l.MemoryBytes, l.TmpBytes = 4*MiB, 1*MiB }),
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := manifest.Default()
			tc.edit(m)
			if got := limits(m); got != tc.want {
				t.Errorf("limits =\n%+v\nwant\n%+v", got, tc.want)
			}
		})
	}
}

func TestDefaultHome(t *testing.T) {
	tests := []struct {
		name string
		root bool // which side of DefaultHome's euid check the case is on
		env  map[string]string
		want func() string
	}{
		{name: "MOAT_HOME as root", root: true, env: map[string]string{"MOAT_HOME": "/srv/moat-state"}, want: func() string { return "/srv/moat-state" }},
		{name: "root without MOAT_HOME", root: true, env: map[string]string{"MOAT_HOME": ""}, want: func() string { return "/var/lib/moat" }},
		{name: "MOAT_HOME without root", env: map[string]string{"MOAT_HOME": "/srv/moat-state"}, want: func() string { return "/srv/moat-state" }},
		{name: "user cache without root", env: map[string]string{"MOAT_HOME": "", "XDG_CACHE_HOME": "", "HOME": "/home/someone"}, want: func() string { return "/home/someone/.cache/moat" }},
		{name: "XDG cache without root", env: map[string]string{"MOAT_HOME": "", "XDG_CACHE_HOME": "/xdg/cache", "HOME": "/home/someone"}, want: func() string { return "/xdg/cache/moat" }},
		{name: "no home at all without root", env: map[string]string{"MOAT_HOME": "", "XDG_CACHE_HOME": "", "HOME": ""}, want: func() string {
			return filepath.Join(os.TempDir(), fmt.Sprintf("moat-%d", os.Geteuid()))
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			isRoot := os.Geteuid() == 0
			switch {
			case tc.root && !isRoot:
				t.Skip("needs root: DefaultHome's root branch depends on the effective uid")
			case !tc.root && isRoot:
				// The euid cannot be changed in a Go test process; run
				// this case in a copy of the test binary as nobody.
				runAsNobody(t, "^TestDefaultHome$/^"+regexp.QuoteMeta(strings.ReplaceAll(tc.name, " ", "_"))+"$")
				return
			}
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			if got, want := DefaultHome(), tc.want(); got != want {
				t.Errorf("DefaultHome() = %q, want %q", got, want)
			}
		})
	}
}

// nobodyUID is the unprivileged uid the tests switch to as root.
const nobodyUID = 65534

// runAsNobody runs the tests matching pattern in a copy of this test binary
// as uid 65534, with a private TMPDIR, and fails t if they fail or did not
// run.
func runAsNobody(t *testing.T, pattern string) {
	t.Helper()
	dir, err := os.MkdirTemp("", "moat-engine-test-nobody-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("remove %s: %v", dir, err)
		}
		if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s is still there", dir)
		}
	})
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "engine.test")
	if err := copyFile(exe, bin); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(dir, "tmp")
	for _, p := range []string{dir, tmp} {
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(p, nobodyUID, nobodyUID); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(bin, "-test.run", pattern, "-test.v", "-test.count=1")
	cmd.Dir = tmp
	cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobodyUID, Gid: nobodyUID, Groups: []uint32{}}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("as uid %d: %v\n%s", nobodyUID, err, out)
	}
	if !bytes.Contains(out, []byte("--- PASS")) || bytes.Contains(out, []byte("--- SKIP")) {
		t.Fatalf("as uid %d the test did not run to a pass:\n%s", nobodyUID, out)
	}
	t.Logf("as uid %d:\n%s", nobodyUID, out)
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// exists reports whether path exists (without following a final symlink).
func exists(t *testing.T, path string) bool {
	t.Helper()
	_, err := os.Lstat(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return err == nil
}

// held says whether a live process holds the run lock file at path.
func held(path string) bool { return RunAlive(filepath.Dir(path)) }

func TestClaim(t *testing.T) {
	e, err := New(Options{Home: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	id := newID()
	dir := filepath.Join(e.Home(), "runs", id)
	release, err := e.claim(id)
	if err != nil {
		t.Fatal(err)
	}
	released := false
	t.Cleanup(func() {
		if !released {
			release(true)
		}
	})
	if !exists(t, filepath.Join(dir, "lock")) {
		t.Fatalf("claim(%s) made no lock file", id)
	}
	if !held(filepath.Join(dir, "lock")) {
		t.Errorf("a claimed run is not alive")
	}
	if _, err := e.claim(id); err == nil {
		t.Errorf("claiming a live run's id twice succeeded")
	}
	if !held(filepath.Join(dir, "lock")) {
		t.Errorf("the refused second claim released the first")
	}
	release(true)
	released = true
	if exists(t, dir) {
		t.Errorf("release left %s", dir)
	}
	if held(filepath.Join(dir, "lock")) {
		t.Errorf("a released run is still alive")
	}
}

// TestClaimReleasedUnclean: a run whose sandbox could not be destroyed
// lets its lock go but keeps its directory, so the next GC takes it (and
// its cgroup) as a dead run's.
func TestClaimReleasedUnclean(t *testing.T) {
	e, err := New(Options{Home: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	id := newID()
	dir := filepath.Join(e.Home(), "runs", id)
	release, err := e.claim(id)
	if err != nil {
		t.Fatal(err)
	}
	release(false)
	if !exists(t, filepath.Join(dir, "lock")) {
		t.Fatalf("release(false) removed %s", dir)
	}
	if held(filepath.Join(dir, "lock")) {
		t.Errorf("a run released uncleanly still holds its lock")
	}
	rep, err := e.GC()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(rep.Runs, id) || exists(t, dir) {
		t.Errorf("GC = %+v; want run %s removed", rep, id)
	}
}

// leftoverTier's Prepare fails without being able to undo everything.
type leftoverTier struct{ tier.Tier }

func (leftoverTier) Prepare(context.Context, *tier.Spec) (tier.Sandbox, error) {
	return nil, fmt.Errorf("start init: broken pipe (%w: destroy cgroup: rmdir: device or resource busy)", tier.ErrLeftovers)
}

// TestPrepareLeftovers: a run the tier could not clean up after a failed
// Prepare keeps its directory, unlocked, for the next GC; a run whose
// Prepare failed cleanly leaves nothing.
func TestPrepareLeftovers(t *testing.T) {
	e, err := New(Options{Home: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	img := &image.Image{Name: "python", Root: t.TempDir(), Digest: "sha256:" + strings.Repeat("0", 64)}
	runs := func() []string {
		ents, _ := os.ReadDir(filepath.Join(e.Home(), "runs"))
		var names []string
		for _, ent := range ents {
			names = append(names, ent.Name())
		}
		return names
	}
	if _, err := e.prepare(context.Background(), leftoverTier{}, img, manifest.Default(), false, nil); !errors.Is(err, tier.ErrLeftovers) {
		t.Fatalf("prepare = %v, want ErrLeftovers", err)
	}
	left := runs()
	if len(left) != 1 || held(filepath.Join(e.Home(), "runs", left[0], "lock")) {
		t.Fatalf("runs/ = %v, want one dead run kept for GC", left)
	}
	rep, err := e.GC()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(rep.Runs, left[0]) || len(runs()) != 0 {
		t.Errorf("GC = %+v, runs/ now %v; want the run removed", rep, runs())
	}
}

// gcEntry is one thing put under runs/ before GC.
type gcEntry struct {
	name    string
	setup   func(t *testing.T, e *Engine, path string) // makes path
	removed bool                                       // GC removes and reports it
	legacy  bool                                       // named as an older moat named a claim
}

func gcEntries() []gcEntry {
	mkdir := func(t *testing.T, path string) {
		t.Helper()
		if err := os.Mkdir(path, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	return []gcEntry{
		{name: "claimed run", setup: func(t *testing.T, e *Engine, path string) {
			release, err := e.claim(filepath.Base(path))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { release(true) })
		}},
		{name: "stale run whose lock nobody holds", removed: true, setup: func(t *testing.T, e *Engine, path string) {
			mkdir(t, path)
			if err := os.WriteFile(filepath.Join(path, "lock"), nil, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(path, "junk"), []byte("x"), 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "run directory without a lock (its moat died claiming or releasing it)", removed: true, setup: func(t *testing.T, e *Engine, path string) {
			mkdir(t, path)
		}},
		{name: "directory of an older moat's claim", removed: true, legacy: true, setup: func(t *testing.T, e *Engine, path string) {
			mkdir(t, path)
			if err := os.WriteFile(filepath.Join(path, "lock"), nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}},
	}
}

// invalidRunNames are entries under runs/ that are not run ids; GC must
// leave them alone, lock or not.
var invalidRunNames = []string{"NotAnID", "has.dot", "lost+found", "under_score", strings.Repeat("a", 65)}

// checkGC fills e's runs/ with gcEntries and invalid names, runs GC once
// and checks what it removed and reported. Every entry is removed when the
// test ends, and that removal is checked. In a shared home another moat's
// GC may collect a dead entry first, so there only the removal is checked,
// not which GC reported it.
func checkGC(t *testing.T, e *Engine, shared bool) {
	t.Helper()
	runs := filepath.Join(e.Home(), "runs")
	type made struct {
		gcEntry
		id, path string
	}
	var entries []made
	for _, g := range gcEntries() {
		id := newID()
		path := filepath.Join(runs, id)
		if g.legacy {
			path = filepath.Join(runs, legacyClaimPrefix+id)
		}
		entries = append(entries, made{g, id, path})
	}
	for _, name := range invalidRunNames {
		name := name + "-" + newID()[:6]
		if len(name) > 70 {
			name = strings.Repeat("a", 65)
		}
		entries = append(entries, made{gcEntry{name: "invalid name " + name, setup: func(t *testing.T, e *Engine, path string) {
			if err := os.Mkdir(path, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(path, "lock"), nil, 0o600); err != nil {
				t.Fatal(err)
			}
			old := time.Now().Add(-time.Hour)
			if err := os.Chtimes(path, old, old); err != nil {
				t.Fatal(err)
			}
		}}, name, filepath.Join(runs, name)})
	}
	for _, m := range entries {
		t.Cleanup(func() {
			if err := os.RemoveAll(m.path); err != nil {
				t.Errorf("remove %s: %v", m.path, err)
			}
			if exists(t, m.path) {
				t.Errorf("%s is still there after the test", m.path)
			}
		})
		m.setup(t, e, m.path)
	}

	rep, err := e.GC()
	if err != nil {
		t.Errorf("GC: %v", err)
	}
	for _, m := range entries {
		if got := !exists(t, m.path); got != m.removed {
			t.Errorf("%s: removed=%v, want %v", m.name, got, m.removed)
		}
		if got := slices.Contains(rep.Runs, m.id); got != m.removed && !(shared && m.removed) {
			t.Errorf("%s: reported=%v, want %v (report %q)", m.name, got, m.removed, rep.Runs)
		}
		if slices.Contains(rep.Cgroups, m.id) {
			t.Errorf("%s: GC reported removing a cgroup for it, which never existed", m.name)
		}
	}
	// A second GC finds nothing more of ours.
	rep, err = e.GC()
	if err != nil {
		t.Errorf("second GC: %v", err)
	}
	for _, m := range entries {
		if slices.Contains(rep.Runs, m.id) {
			t.Errorf("%s: reported again by a second GC", m.name)
		}
	}
}

// TestGCAsRoot runs GC as root, which also collects the native tier's
// orphan cgroups. That part is host-wide (moat/<id> cgroups are not
// per-home), so this test uses the default home, shared with every other
// moat on this host, rather than a temporary one: GC from a private home
// would treat the live runs of other homes as orphans.
func TestGCAsRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: GC collects the native tier's cgroups only as root (TestGCWithoutRoot covers the rest)")
	}
	e, err := New(Options{NoAutoBuild: true})
	if err != nil {
		t.Fatal(err)
	}
	checkGC(t, e, true)
}

// TestGCWithoutRoot runs GC where the native tier is unavailable: run
// directories are still collected, cgroups are not looked at, and nothing
// fails.
func TestGCWithoutRoot(t *testing.T) {
	if os.Geteuid() == 0 {
		runAsNobody(t, "^TestGCWithoutRoot$")
		return
	}
	e, err := New(Options{Home: t.TempDir(), NoAutoBuild: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Tier("native"); !errors.Is(err, tier.ErrUnavailable) {
		t.Fatalf("without root the native tier is available (%v); this test means to run without it", err)
	}
	checkGC(t, e, false)
}

func TestRunRefusesBadRequests(t *testing.T) {
	e, err := New(Options{Home: t.TempDir(), NoAutoBuild: true})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		req   *Request
		check func(error) bool
		want  string
	}{
		{"nil manifest", &Request{Argv: []string{"true"}}, func(err error) bool { return errors.Is(err, ErrUsage) }, "no manifest"},
		{"nil argv", &Request{Manifest: manifest.Default()}, func(err error) bool { return errors.Is(err, ErrUsage) }, "no command"},
		{"empty argv", &Request{Manifest: manifest.Default(), Argv: []string{}}, func(err error) bool { return errors.Is(err, ErrUsage) }, "no command"},
		{"empty command name", &Request{Manifest: manifest.Default(), Argv: []string{"", "x"}}, func(err error) bool { return errors.Is(err, ErrUsage) }, "no command"},
		{"tier not implemented", &Request{Manifest: func() *manifest.Manifest { m := manifest.Default(); m.Tier = "nonsense"; return m }(), Argv: []string{"true"}},
			func(err error) bool { var fe *manifest.FieldError; return errors.As(err, &fe) && fe.Field == "tier" }, "not implemented yet"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res, err := e.Run(context.Background(), tc.req)
			if res != nil {
				t.Errorf("got a result %+v", res)
			}
			if err == nil || !tc.check(err) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Run error %v, want one mentioning %q of the right kind", err, tc.want)
			}
		})
	}
	if ents, err := os.ReadDir(filepath.Join(e.Home(), "runs")); err != nil || len(ents) != 0 {
		t.Errorf("refused runs left %d run directories (%v)", len(ents), err)
	}
}

func TestUnescapeMountinfo(t *testing.T) {
	tests := []struct{ in, want string }{
		{"/plain/path", "/plain/path"},
		{`/with\040space`, "/with space"},
		{`/tab\011and\134backslash`, "/tab\tand\\backslash"},
		{`/trailing\04`, `/trailing\04`},
	}
	for _, tc := range tests {
		if got := unescapeMountinfo(tc.in); got != tc.want {
			t.Errorf("unescapeMountinfo(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestGCUnmounts: a dead run's directory with a mount below it (what a
// killed gVisor run leaves) is unmounted and removed.
func TestGCUnmounts(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: mounts a tmpfs")
	}
	home := t.TempDir()
	e, err := New(Options{Home: home})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(home, "runs", "0123456789abcdef")
	ws := filepath.Join(dir, "work space")
	if err := os.MkdirAll(ws, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "lock"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", ws, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Unmount(ws, syscall.MNT_DETACH) })
	rep, err := e.GC()
	if err != nil {
		t.Fatalf("gc: %v", err)
	}
	if len(rep.Runs) != 1 {
		t.Errorf("gc removed %v, want the dead run", rep.Runs)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("run directory still there: %v", err)
	}
	if mi, _ := os.ReadFile("/proc/self/mountinfo"); bytes.Contains(mi, []byte(home)) {
		t.Errorf("a mount below %s is left", home)
	}
}

// capsTier is a tier that only declares capabilities: enough for resolve.
type capsTier struct{ tier.Tier }

func (capsTier) Capabilities() tier.Capabilities { return tier.Capabilities{} }

// TestResolveUnknownImage: a manifest image the store neither holds nor
// can build is the caller's mistake, a FieldError on image that names the
// images there are; it must not become an infra error (HTTP 500).
func TestResolveUnknownImage(t *testing.T) {
	e, err := New(Options{Home: t.TempDir(), NoAutoBuild: true})
	if err != nil {
		t.Fatal(err)
	}
	e.tiers["caps"] = capsTier{}
	tests := []struct{ name, image string }{
		{"no such image", "cobol"},
		{"reference the store cannot hold", "library/node:20"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := manifest.Default()
			m.Tier, m.Image = "caps", tc.image
			_, _, err := e.resolve(context.Background(), m, false)
			var fe *manifest.FieldError
			if !errors.As(err, &fe) || fe.Field != "image" || fe.Value != tc.image || !strings.Contains(fe.Problem, "python") {
				t.Errorf("resolve(image %q) = %v, want a FieldError on image naming the known images", tc.image, err)
			}
		})
	}
}

// idleTier prepares sandboxes that do nothing, so a test can hold one.
type idleTier struct{ capsTier }

type idleSandbox struct{ tier.Sandbox }

func (idleSandbox) Destroy() error { return nil }

func (idleTier) Prepare(context.Context, *tier.Spec) (tier.Sandbox, error) {
	return idleSandbox{}, nil
}

// TestSandboxPinsItsImage: while a sandbox lives, `moat image rm` of its
// image is refused (image.ErrInUse); once destroyed, it succeeds.
func TestSandboxPinsItsImage(t *testing.T) {
	e, err := New(Options{Home: t.TempDir(), NoAutoBuild: true})
	if err != nil {
		t.Fatal(err)
	}
	// A stored build as an import leaves it: rootfs, image.json, current.
	rootfs := filepath.Join(t.TempDir(), "rootfs")
	if err := os.MkdirAll(filepath.Join(rootfs, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rootfs, "bin", "tool"), []byte("x"), 0o755); err != nil {
		t.Fatal(err)
	}
	digest, _, err := image.TreeDigest(rootfs)
	if err != nil {
		t.Fatal(err)
	}
	hexDigest := strings.TrimPrefix(digest, "sha256:")
	dir := filepath.Join(e.Images().Dir, "tools", hexDigest)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(e.Images().Dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(rootfs, filepath.Join(dir, "rootfs")); err != nil {
		t.Fatal(err)
	}
	meta := fmt.Sprintf(`{"name":"tools","digest":%q}`, digest)
	if err := os.WriteFile(filepath.Join(dir, "image.json"), []byte(meta), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(hexDigest, filepath.Join(e.Images().Dir, "tools", "current")); err != nil {
		t.Fatal(err)
	}
	img, err := e.Images().Lookup("tools")
	if err != nil {
		t.Fatal(err)
	}
	p, err := e.prepare(context.Background(), idleTier{}, img, manifest.Default(), false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Images().RemoveName("tools"); !errors.Is(err, image.ErrInUse) {
		t.Errorf("RemoveName while a sandbox uses the image = %v, want ErrInUse", err)
	}
	p.close()
	if removed, err := e.Images().RemoveName("tools"); err != nil || len(removed) != 1 {
		t.Errorf("RemoveName after the sandbox ended = %v, %v; want the one build", removed, err)
	}
}
