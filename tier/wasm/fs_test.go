package wasm

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	experimentalsys "github.com/tetratelabs/wazero/experimental/sys"
)

// newTestFS returns a rootFS on a fresh workspace inside a directory that
// also holds a host secret next to it.
func newTestFS(t *testing.T, maxBytes, maxFiles, maxFile int64) (*rootFS, string, string) {
	t.Helper()
	base := t.TempDir()
	ws := filepath.Join(base, "ws")
	if err := os.Mkdir(ws, 0o700); err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(base, "secret")
	if err := os.WriteFile(secret, []byte("host secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	root, err := os.OpenRoot(ws)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { root.Close() })
	q, err := newQuota(ws, maxBytes, maxFiles, maxFile)
	if err != nil {
		t.Fatal(err)
	}
	return &rootFS{root: root, q: q}, ws, secret
}

// TestRootFSConfinement is the CVE-2024-38358 class, without a guest: every
// way to name the secret beside the workspace must fail, whatever the
// path, and links the guest makes must not lead out when followed.
func TestRootFSConfinement(t *testing.T) {
	fsys, ws, secret := newTestFS(t, 0, 0, 0)
	// Links an earlier step of an attack would have made.
	os.Symlink("../secret", filepath.Join(ws, "rel"))
	os.Symlink(secret, filepath.Join(ws, "abs"))
	os.Symlink("..", filepath.Join(ws, "up"))
	os.Mkdir(filepath.Join(ws, "d"), 0o700)
	os.Symlink("../../secret", filepath.Join(ws, "d", "deep"))
	for _, p := range []string{
		"../secret", "/../secret", "d/../../secret", "rel", "abs", "up/secret", "d/deep",
		"up/ws/rel", "./././../secret", "d/../up/secret",
	} {
		for _, flag := range []experimentalsys.Oflag{experimentalsys.O_RDONLY, experimentalsys.O_RDWR, experimentalsys.O_WRONLY | experimentalsys.O_TRUNC} {
			f, errno := fsys.OpenFile(p, flag, 0)
			if errno == 0 {
				buf := make([]byte, 64)
				n, _ := f.Read(buf)
				f.Close()
				t.Errorf("OpenFile(%q, %v) succeeded (read %q)", p, flag, buf[:n])
			}
		}
		if st, errno := fsys.Stat(p); errno == 0 && st.Size == int64(len("host secret")) {
			t.Errorf("Stat(%q) reached the secret", p)
		}
	}
	// Creating through an escaping path must not create outside.
	for _, p := range []string{"../made", "up/made", "d/../../made"} {
		if f, errno := fsys.OpenFile(p, experimentalsys.O_CREAT|experimentalsys.O_WRONLY, 0o644); errno == 0 {
			f.Close()
			t.Errorf("created %q", p)
		}
		if errno := fsys.Mkdir(p+"dir", 0o755); errno == 0 {
			t.Errorf("made directory %q", p+"dir")
		}
		if errno := fsys.Rename("d", p); errno == 0 {
			t.Errorf("renamed into %q", p)
		}
		if errno := fsys.Link("d/deep", p); errno == 0 {
			t.Errorf("linked to %q", p)
		}
	}
	if errno := fsys.Unlink("../secret"); errno == 0 {
		t.Errorf("unlinked the secret")
	}
	if errno := fsys.Symlink("/etc/passwd", "abs2"); errno != experimentalsys.EPERM {
		t.Errorf("absolute symlink: errno %v, want EPERM", errno)
	}
	if errno := fsys.Chmod("rel", 0o777); errno == 0 {
		if fi, _ := os.Stat(secret); fi.Mode().Perm() != 0o600 {
			t.Errorf("chmod through a symlink changed the secret to %v", fi.Mode())
		}
	}
	if b, err := os.ReadFile(secret); err != nil || string(b) != "host secret" {
		t.Errorf("secret changed: %q %v", b, err)
	}
	m, _ := filepath.Glob(filepath.Join(filepath.Dir(ws), "made*"))
	if len(m) > 0 {
		t.Errorf("files made outside the workspace: %v", m)
	}
	// What is inside still works.
	f, errno := fsys.OpenFile("d/ok", experimentalsys.O_CREAT|experimentalsys.O_RDWR, 0o644)
	if errno != 0 {
		t.Fatalf("create inside: %v", errno)
	}
	if _, errno := f.Write([]byte("fine")); errno != 0 {
		t.Errorf("write inside: %v", errno)
	}
	f.Close()
	if b, _ := os.ReadFile(filepath.Join(ws, "d", "ok")); string(b) != "fine" {
		t.Errorf("d/ok = %q", b)
	}
}

func TestRootFSQuota(t *testing.T) {
	fsys, ws, _ := newTestFS(t, 1000, 5, 600)
	f, errno := fsys.OpenFile("a", experimentalsys.O_CREAT|experimentalsys.O_WRONLY, 0o644)
	if errno != 0 {
		t.Fatal(errno)
	}
	if _, errno := f.Write(make([]byte, 700)); errno != errLimit || !fsys.q.hitFileSize {
		t.Errorf("700-byte write past the 600-byte file limit: errno %v", errno)
	}
	if _, errno := f.Write(make([]byte, 500)); errno != 0 {
		t.Errorf("500-byte write: %v", errno)
	}
	if _, errno := f.Pwrite(make([]byte, 100), 550); errno != errLimit {
		t.Errorf("pwrite ending at 650: errno %v, want the file limit", errno)
	}
	f.Close()
	g, _ := fsys.OpenFile("b", experimentalsys.O_CREAT|experimentalsys.O_WRONLY, 0o644)
	if _, errno := g.Write(make([]byte, 501)); errno != errLimit || !fsys.q.hitDisk || fsys.q.hitFiles {
		t.Errorf("write past the 1000-byte workspace: errno %v", errno)
	}
	if _, errno := g.Write(make([]byte, 500)); errno != 0 {
		t.Errorf("write up to the workspace limit: %v", errno)
	}
	g.Close()
	if errno := fsys.Unlink("a"); errno != 0 {
		t.Fatal(errno)
	}
	if fsys.q.bytes != 500 {
		t.Errorf("after unlink, %d bytes counted, want 500", fsys.q.bytes)
	}
	for i := 0; i < 10; i++ {
		errno := fsys.Mkdir("d"+strings.Repeat("x", i), 0o755)
		if i < 4 && errno != 0 {
			t.Errorf("mkdir %d: %v", i, errno)
		}
		if i >= 4 && errno != errLimit {
			t.Errorf("mkdir %d past the 5-file limit: %v", i, errno)
		}
	}
	if !fsys.q.hitFiles {
		t.Errorf("the file-count refusal was not recorded")
	}
	ents, _ := os.ReadDir(ws)
	if len(ents) != 5 {
		t.Errorf("%d entries in the workspace, limit 5", len(ents))
	}
}

// TestNoGoroutineLeft: runs leave no goroutine behind (wazero's
// close-on-context-done watcher ends with the module).
func TestNoGoroutineLeft(t *testing.T) {
	testTier(t)
	exec(t, defaultLimits(), nil, "node", "-e", "1") // warm up compilation
	before := runtime.NumGoroutine()
	for i := 0; i < 5; i++ {
		exec(t, defaultLimits(), nil, "node", "-e", "console.log(1)")
	}
	for deadline := time.Now().Add(10 * time.Second); runtime.NumGoroutine() > before && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		t.Errorf("%d goroutines after 5 runs, %d before", n, before)
	}
}

func TestCacheDirMustBePrivate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "cache")
	if err := checkCacheDir(dir); err != nil {
		t.Fatalf("a fresh private directory: %v", err)
	}
	os.Chmod(dir, 0o777)
	if err := checkCacheDir(dir); err == nil || !strings.Contains(err.Error(), "chmod 0700") {
		t.Errorf("a world-writable cache was accepted (%v)", err)
	}
}
