package engine

import (
	"archive/zip"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/idshift"
	"github.com/moat-sandbox/moat/internal/testbin"
	"github.com/moat-sandbox/moat/result"
)

// buildStepEnv is a private home and a copy of the python image's tree,
// shared by a test's cases (each writes its own paths): copying the tree
// costs seconds.
func buildStepEnv(t *testing.T) (*Engine, string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: build steps run in real native sandboxes")
	}
	store, err := New(Options{NoAutoBuild: true})
	if err != nil {
		t.Fatal(err)
	}
	img, err := store.Images().Lookup("python")
	if err != nil {
		t.Skipf("the python image is not built (%v): run moat image build python", err)
	}
	bin, cleanup, err := testbin.Build()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cleanup)
	base := t.TempDir()
	// The sandbox's init reaches the tree as an unprivileged host id.
	for d := base; d != "/"; d = filepath.Dir(d) {
		if strings.HasPrefix(d, os.TempDir()+"/") {
			os.Chmod(d, 0o711)
		}
	}
	home := filepath.Join(base, "home")
	e, err := New(Options{Home: home, Exe: bin, NoAutoBuild: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	root := filepath.Join(base, "tree")
	if out, err := exec.Command("cp", "-a", img.Root, root).CombinedOutput(); err != nil {
		t.Fatalf("copy the python image: %v: %s", err, out)
	}
	t.Cleanup(func() { noBuildLeftovers(t, e) })
	return e, root
}

// noBuildLeftovers checks that no run directory of the home is left.
func noBuildLeftovers(t *testing.T, e *Engine) {
	t.Helper()
	runs, _ := os.ReadDir(filepath.Join(e.Home(), "runs"))
	for _, r := range runs {
		t.Errorf("run directory %s left behind", r.Name())
	}
	if b, err := os.ReadFile("/proc/self/mountinfo"); err == nil && strings.Contains(string(b), e.Home()) {
		t.Errorf("a mount below %s is left", e.Home())
	}
}

// ownersInRange fails when any entry of root is owned by an id of a
// sandbox's range (>= 65536): the tree was not shifted back.
func ownersInRange(t *testing.T, root string) {
	t.Helper()
	bad := 0
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return nil
		}
		st := fi.Sys().(*syscall.Stat_t)
		if st.Uid >= 65536 || st.Gid >= 65536 {
			if bad++; bad < 5 {
				t.Errorf("%s is owned by %d:%d after the step", p, st.Uid, st.Gid)
			}
		}
		return nil
	})
}

func owner(t *testing.T, path string) (int, int) {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatalf("after the step: %v", err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	return int(st.Uid), int(st.Gid)
}

func sh(script string) []string { return []string{"/bin/sh", "-c", script} }

var stepEnv = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root"}

// TestBuildStep's cases run in order on one tree (a copy costs seconds):
// later cases use what earlier ones installed (/srv/app, moatdemo), so a
// -run filter must keep them together.
func TestBuildStep(t *testing.T) {
	e, root := buildStepEnv(t)
	// A host file outside the tree that the escape cases aim at.
	outside := filepath.Join(filepath.Dir(root), "host-secret")
	if err := os.WriteFile(outside, []byte("host\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "moatdemo-1.0-py3-none-any.whl"), tinyWheel(t), 0o644); err != nil {
		t.Fatal(err)
	}
	// Where this host's resolver answers registry.npmjs.org with a
	// reserved address (a test network's 203.0.113.x, as on Moat's CI),
	// the proxy refuses it by design (egress/address.go) unless the
	// operator grants it: the step grants exactly what the host resolves.
	npmAddrs, err := net.LookupHost("registry.npmjs.org")
	if err != nil {
		t.Fatalf("resolve registry.npmjs.org (the npm registry must be reachable for this test): %v", err)
	}
	// And where the host's own network intercepts TLS (Moat's CI does),
	// only the host's CA bundle verifies the registry: the step's curl
	// gets a copy of it.
	hostCAs, err := os.ReadFile("/etc/ssl/certs/ca-certificates.crt")
	if err != nil {
		t.Fatalf("the host's CA bundle: %v", err)
	}
	if err := os.WriteFile(filepath.Join(root, "host-cas.pem"), hostCAs, 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		step     BuildStep
		wantExit int
		wantOut  []string // each in stdout+stderr
		check    func(t *testing.T)
	}{
		{
			name: "root installs a file and chowns one to the sandbox user",
			step: BuildStep{UID: 0, Dir: "/", Argv: sh(`set -e
				printf '#!/bin/sh\necho hello\n' > /usr/local/bin/hello; chmod 755 /usr/local/bin/hello
				mkdir /srv/app; touch /srv/app/data; chown -R 1000:1000 /srv/app; id -u; grep CapEff /proc/self/status; sed -n 's/^CapEff:/init/p' /proc/1/status`)},
			// CHOWN, DAC_OVERRIDE, FOWNER, FSETID, KILL, SETGID, SETUID,
			// for the step and for init itself (a uid that stays 0 clears
			// nothing by itself).
			wantOut: []string{"0\nCapEff:\t00000000000000fb\ninit\t00000000000000fb\n"},
			check: func(t *testing.T) {
				if u, g := owner(t, filepath.Join(root, "usr/local/bin/hello")); u != 0 || g != 0 {
					t.Errorf("/usr/local/bin/hello owned by %d:%d, want 0:0", u, g)
				}
				if u, g := owner(t, filepath.Join(root, "srv/app/data")); u != 1000 || g != 1000 {
					t.Errorf("/srv/app/data owned by %d:%d, want 1000:1000", u, g)
				}
				if u, _ := owner(t, filepath.Join(root, "usr/bin/python3")); u != 0 {
					t.Errorf("/usr/bin/python3 owned by %d, want 0", u)
				}
			},
		},
		{
			name:    "the sandbox user cannot write /usr but writes its own directory",
			step:    BuildStep{UID: 1000, Dir: "/srv/app", Argv: sh(`id -u; grep CapEff /proc/self/status; touch /usr/x 2>&1 || echo denied; echo hi > /srv/app/mine && echo wrote`)},
			wantOut: []string{"1000\nCapEff:\t0000000000000000\n"},
			check: func(t *testing.T) {
				if _, err := os.Lstat(filepath.Join(root, "usr/x")); err == nil {
					t.Error("uid 1000 wrote /usr/x")
				}
				if u, g := owner(t, filepath.Join(root, "srv/app/mine")); u != 1000 || g != 1000 {
					t.Errorf("/srv/app/mine owned by %d:%d, want 1000:1000", u, g)
				}
			},
		},
		{
			name: "escapes fail and the walk back follows no link",
			step: BuildStep{UID: 0, Dir: "/", Argv: sh(`
				ln -s ` + outside + ` /etc/x; chown -h 0:0 /etc/x
				ln ` + outside + ` /etc/hard 2>/dev/null && echo LINKED
				cat ` + outside + ` 2>/dev/null && echo READ
				mknod /dev-node c 1 3 2>/dev/null && echo MKNOD
				mknod /dev-node2 b 8 0 2>/dev/null && echo MKNOD
				mount -t tmpfs none /mnt 2>/dev/null && echo MOUNTED
				echo 1 > /proc/sys/kernel/sysrq 2>/dev/null && echo SYSCTL
				echo done`)},
			wantOut: []string{"done"},
			check: func(t *testing.T) {
				if u, g := owner(t, outside); u != 0 || g != 0 {
					t.Errorf("the host file the link names is owned by %d:%d, want 0:0", u, g)
				}
				if b, _ := os.ReadFile(outside); string(b) != "host\n" {
					t.Errorf("the host file changed: %q", b)
				}
				for _, p := range []string{"etc/hard", "dev-node", "dev-node2"} {
					if _, err := os.Lstat(filepath.Join(root, p)); err == nil {
						t.Errorf("/%s exists", p)
					}
				}
			},
		},
		{
			name:    "no network without hosts",
			step:    BuildStep{UID: 0, Dir: "/", Argv: []string{"python3", "-c", "import socket\ntry:\n socket.create_connection(('1.1.1.1',80),timeout=3); print('CONNECTED')\nexcept OSError as e: print('refused', e)"}},
			wantOut: []string{"refused"},
		},
		{
			name: "hosts go through the egress proxy, others are refused",
			step: BuildStep{UID: 0, Dir: "/", Hosts: []string{"registry.npmjs.org"}, AllowAddresses: npmAddrs, Argv: sh(`
				curl -sS --cacert /host-cas.pem -o /dev/null -w 'npm %{http_code}\n' https://registry.npmjs.org/is-number
				curl -sS -o /dev/null -w 'other %{http_code}\n' https://pypi.org/simple/ 2>&1 | head -c 300; echo
				echo "proxy $npm_config_https_proxy $PIP_PROXY"`)},
			wantOut: []string{"npm 200\n", "other 000\n", "proxy http://127.0.0.1:3128 http://127.0.0.1:3128",
				"moat: the egress proxy refused pypi.org port 443 (not-allowlisted); this step may reach only registry.npmjs.org, the indexes its build file names\n"},
		},
		{
			name:    "a wheel installs with pip as root",
			step:    BuildStep{UID: 0, Dir: "/", Argv: []string{"python3", "-m", "pip", "install", "--no-index", "--no-deps", "--break-system-packages", "--root-user-action=ignore", "/moatdemo-1.0-py3-none-any.whl"}, Env: append(stepEnv, "PIP_NO_CACHE_DIR=1")},
			wantOut: []string{"Successfully installed moatdemo-1.0"},
			check: func(t *testing.T) {
				matches, _ := filepath.Glob(filepath.Join(root, "usr/local/lib/python3*/dist-packages/moatdemo/__init__.py"))
				if len(matches) != 1 {
					t.Fatalf("moatdemo not installed in the tree: %v", matches)
				}
				if u, g := owner(t, matches[0]); u != 0 || g != 0 {
					t.Errorf("%s owned by %d:%d, want 0:0", matches[0], u, g)
				}
			},
		},
		{
			name:    "the installed package imports in a later step",
			step:    BuildStep{UID: 1000, Dir: "/", Argv: []string{"python3", "-c", "import moatdemo; print('answer', moatdemo.ANSWER)"}},
			wantOut: []string{"answer 42\n"},
		},
		{
			name:     "a failing step returns its status",
			step:     BuildStep{UID: 1000, Dir: "/", Argv: sh("exit 3")},
			wantExit: 3,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			tc.step.Stdout, tc.step.Stderr = &out, &out
			if tc.step.Env == nil {
				tc.step.Env = stepEnv
			}
			tc.step.Timeout = 2 * time.Minute
			code, err := e.RunBuildStep(context.Background(), root, tc.step)
			if err != nil {
				t.Fatalf("RunBuildStep: %v\noutput: %s", err, out.String())
			}
			if code != tc.wantExit {
				t.Errorf("exit %d, want %d; output: %s", code, tc.wantExit, out.String())
			}
			for _, want := range tc.wantOut {
				if !strings.Contains(out.String(), want) {
					t.Errorf("output %q does not contain %q", out.String(), want)
				}
			}
			for _, bad := range []string{"LINKED", "READ", "MKNOD", "MOUNTED", "SYSCTL", "CONNECTED", "other 200"} {
				if strings.Contains(out.String(), bad) {
					t.Errorf("output says %s: %s", bad, out.String())
				}
			}
			if tc.check != nil {
				tc.check(t)
			}
			ownersInRange(t, root)
		})
	}
}

func TestBuildStepTimeoutAndCancel(t *testing.T) {
	e, root := buildStepEnv(t)
	tests := []struct {
		name   string
		ctx    func() (context.Context, context.CancelFunc)
		tmo    time.Duration
		wantIs error
	}{
		{"timeout", func() (context.Context, context.CancelFunc) { return context.WithCancel(context.Background()) }, 2 * time.Second, ErrBuildStepTimeout},
		{"cancel", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 3*time.Second)
		}, time.Minute, context.DeadlineExceeded},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := tc.ctx()
			defer cancel()
			start := time.Now()
			_, err := e.RunBuildStep(ctx, root, BuildStep{UID: 0, Dir: "/", Env: stepEnv, Timeout: tc.tmo,
				Argv: sh("touch /during; sleep 60 & sleep 60")})
			if !errors.Is(err, tc.wantIs) {
				t.Fatalf("err = %v, want %v", err, tc.wantIs)
			}
			if d := time.Since(start); d > 30*time.Second {
				t.Errorf("the killed step took %s", d)
			}
			if tc.name == "timeout" && !strings.Contains(err.Error(), "after 2s") {
				t.Errorf("error %q does not say the timeout", err)
			}
			ownersInRange(t, root)
			noBuildLeftovers(t, e)
		})
	}
}

func TestBuildStepRefusesBadInput(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the engine's home")
	}
	home := t.TempDir()
	os.Chmod(home, 0o711)
	os.Chmod(filepath.Dir(home), 0o711)
	e, err := New(Options{Home: home, NoAutoBuild: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	tree := t.TempDir()
	file := filepath.Join(tree, "file")
	os.WriteFile(file, nil, 0o644)
	link := filepath.Join(t.TempDir(), "link")
	os.Symlink(tree, link)
	runsDir := filepath.Join(home, "runs", "x")
	os.MkdirAll(runsDir, 0o700)
	published := filepath.Join(home, "images", "python", strings.Repeat("ab", 32), "rootfs")
	os.MkdirAll(published, 0o755)
	ok := BuildStep{Argv: []string{"true"}, Dir: "/"}
	with := func(f func(*BuildStep)) BuildStep { s := ok; f(&s); return s }
	tests := []struct {
		name string
		root string
		step BuildStep
		want string
	}{
		{"uid 5", tree, with(func(s *BuildStep) { s.UID = 5 }), "UID 5"},
		{"relative dir", tree, with(func(s *BuildStep) { s.Dir = "usr" }), `Dir "usr"`},
		{"no command", tree, with(func(s *BuildStep) { s.Argv = nil }), "Argv"},
		{"negative timeout", tree, with(func(s *BuildStep) { s.Timeout = -time.Second }), "Timeout"},
		{"bad host", tree, with(func(s *BuildStep) { s.Hosts = []string{"a b"} }), "Hosts[0]"},
		{"addresses without hosts", tree, with(func(s *BuildStep) { s.AllowAddresses = []string{"10.0.0.1"} }), "AllowAddresses"},
		{"bad address", tree, with(func(s *BuildStep) { s.Hosts = []string{"example.com"}; s.AllowAddresses = []string{"not-an-ip"} }), "AllowAddresses[0]"},
		{"root /", "/", ok, `root "/"`},
		{"root holds the home", filepath.Dir(home), ok, "holds Moat's home"},
		{"root is the home", home, ok, "holds Moat's home"},
		{"root in runs", runsDir, ok, "run directories"},
		{"root in a published image", published, ok, "published image"},
		{"relative root", "tree", ok, "not an absolute path"},
		{"missing root", filepath.Join(tree, "nope"), ok, "no such file"},
		{"root is a file", file, ok, "not a directory"},
		{"root through a link", link, ok, "symbolic link"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.RunBuildStep(context.Background(), tc.root, tc.step)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, ErrUsage) {
				t.Errorf("err = %v, want an ErrUsage naming %q", err, tc.want)
			}
		})
	}
	runs, _ := os.ReadDir(filepath.Join(home, "runs"))
	if len(runs) != 1 {
		t.Errorf("runs/ holds %d entries, want only the test's own", len(runs))
	}
}

// resolvesPublic reports whether every address host resolves to on this
// host is ordinary global unicast, which the egress proxy dials.
// tinyWheel is a pure-Python wheel of one module, moatdemo.
func tinyWheel(t *testing.T) []byte {
	t.Helper()
	var buf bytes.Buffer
	z := zip.NewWriter(&buf)
	files := [][2]string{
		{"moatdemo/__init__.py", "ANSWER = 42\n"},
		{"moatdemo-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: moatdemo\nVersion: 1.0\n"},
		{"moatdemo-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: moat-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"},
		{"moatdemo-1.0.dist-info/RECORD", "moatdemo/__init__.py,,\nmoatdemo-1.0.dist-info/METADATA,,\nmoatdemo-1.0.dist-info/WHEEL,,\nmoatdemo-1.0.dist-info/RECORD,,\n"},
	}
	for _, f := range files {
		w, err := z.Create(f[0])
		if err != nil {
			t.Fatal(err)
		}
		w.Write([]byte(f[1]))
	}
	if err := z.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestGCRestoresBuildTree: a build step whose moat died leaves its tree
// owned by the run's id range and recorded in the run's directory; GC of
// the dead run puts the ids back before removing the directory.
func TestGCRestoresBuildTree(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: lchown to a sandbox's ids")
	}
	tests := []struct {
		name  string
		owner int // inside the sandbox
	}{
		{"root's file", 0},
		{"the sandbox user's file", 1000},
	}
	home := t.TempDir()
	os.Chmod(home, 0o711)
	e, err := New(Options{Home: home, NoAutoBuild: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	const base = 0x72000000 + 3*idshift.Range
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			f := filepath.Join(root, "f")
			os.WriteFile(f, nil, 0o644)
			os.Lchown(f, tc.owner, tc.owner)
			run := filepath.Join(home, "runs", newID())
			// A dead run: its lock file held by nobody.
			if err := os.Mkdir(run, 0o700); err != nil {
				t.Fatal(err)
			}
			os.WriteFile(filepath.Join(run, runLock), nil, 0o600)
			if err := idshift.Mark(run, root, base); err != nil {
				t.Fatal(err)
			}
			if err := idshift.In(root, base); err != nil {
				t.Fatal(err)
			}
			if _, err := e.GC(); err != nil {
				t.Fatal(err)
			}
			if u, g := owner(t, f); u != tc.owner || g != tc.owner {
				t.Errorf("after GC the file is owned by %d:%d, want %d", u, g, tc.owner)
			}
			if u, _ := owner(t, root); u != 0 {
				t.Errorf("after GC the tree's root is owned by %d", u)
			}
			if _, err := os.Stat(run); err == nil {
				t.Error("the dead run's directory is left")
			}
		})
	}
}

// TestWriteRefusals: what a build step's output says about the
// destinations the egress proxy refused it: one line per destination and
// reason, with the flag that grants a reserved address, at most
// maxRefusalLines of them; nothing for what was let through.
func TestWriteRefusals(t *testing.T) {
	refused := func(host string, port int, reason, addr string) result.NetworkAttempt {
		return result.NetworkAttempt{Host: host, Port: port, Reason: reason, Address: addr}
	}
	var many []result.NetworkAttempt
	for i := range maxRefusalLines + 2 {
		many = append(many, refused(fmt.Sprintf("h%d.example", i), 443, "not-allowlisted", ""))
	}
	tests := []struct {
		name     string
		attempts []result.NetworkAttempt
		want     string
	}{
		{name: "nothing refused", attempts: []result.NetworkAttempt{{Host: "registry.npmjs.org", Port: 443, Allowed: true, Reason: "allowed"}}, want: ""},
		{name: "a reserved address names the flag and the address",
			attempts: []result.NetworkAttempt{refused("registry.npmjs.org", 443, "private-address", "203.0.113.80"), refused("registry.npmjs.org", 443, "private-address", "203.0.113.80")},
			want:     "moat: the egress proxy refused registry.npmjs.org port 443 (private-address); it resolves to 203.0.113.80, a reserved address: if that is really your index (or a TLS-intercepting proxy's), grant it with moat image build --allow-address 203.0.113.80 (BuildStep.AllowAddresses)\n"},
		{name: "a host the file does not name",
			attempts: []result.NetworkAttempt{refused("evil.example", 443, "not-allowlisted", "")},
			want:     "moat: the egress proxy refused evil.example port 443 (not-allowlisted); this step may reach only registry.npmjs.org, the indexes its build file names\n"},
		{name: "other reasons are named as they are",
			attempts: []result.NetworkAttempt{refused("registry.npmjs.org", 443, "dns-failure", "")},
			want:     "moat: the egress proxy refused registry.npmjs.org port 443 (dns-failure)\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var b strings.Builder
			writeRefusals(&b, tc.attempts, []string{"registry.npmjs.org"})
			if b.String() != tc.want {
				t.Errorf("wrote %q\nwant  %q", b.String(), tc.want)
			}
		})
	}
	t.Run("bounded", func(t *testing.T) {
		var b strings.Builder
		writeRefusals(&b, many, []string{"registry.npmjs.org"})
		lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
		if len(lines) != maxRefusalLines+1 || lines[maxRefusalLines] != "moat: ... and more refused destinations" {
			t.Errorf("wrote %d lines:\n%s", len(lines), b.String())
		}
	})
}
