package microvm

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// fakeDigest is a digest made of one repeated hex byte: "a" gives
// sha256:aaaa….
func fakeDigest(b string) string { return digestPrefix + strings.Repeat(b, 64) }

// fakeDisk writes HOME/microvm/images/<hex>.ext4 (not an ext4: only its
// name and its lock matter here) and returns its path.
func fakeDisk(t *testing.T, home, digest string) string {
	t.Helper()
	dir := filepath.Join(homeCache(home), disksDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, strings.TrimPrefix(digest, digestPrefix)+diskExt)
	if err := os.WriteFile(p, []byte(strings.Repeat("x", 8192)), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestPruneDisks(t *testing.T) {
	a, b, c := fakeDigest("a"), fakeDigest("b"), fakeDigest("c")
	storedOf := func(ds ...string) func() (map[string]bool, error) {
		return func() (map[string]bool, error) {
			m := map[string]bool{}
			for _, d := range ds {
				m[d] = true
			}
			return m, nil
		}
	}
	tests := []struct {
		name   string
		disks  []string // digests with a disk in the cache
		held   []string // disks a sandbox holds (buildRootDisk)
		others []string // other names in the disks' directory (files)
		only   []string
		stored func() (map[string]bool, error)
		noDir  bool // no cache directory at all
		// removed and kept are digests.
		removed, kept []string
		wantErr       string
	}{
		{name: "disks of images no longer stored go, stored ones stay", disks: []string{a, b, c}, stored: storedOf(a),
			removed: []string{b, c}, kept: []string{a}},
		{name: "only limits what may go", disks: []string{a, b}, only: []string{b}, stored: storedOf(),
			removed: []string{b}, kept: []string{a}},
		{name: "only: a digest still stored stays", disks: []string{a}, only: []string{a}, stored: storedOf(a),
			kept: []string{a}},
		{name: "a disk a sandbox holds stays", disks: []string{a, b}, held: []string{a}, stored: storedOf(),
			removed: []string{b}, kept: []string{a}},
		{name: "names that are not disks are left alone", disks: []string{a},
			others: []string{"notes.txt", "abc.ext4", strings.Repeat("A", 64) + ".ext4", "initramfs-x.cpio"}, stored: storedOf(),
			removed: []string{a}},
		{name: "no cache directory", noDir: true, stored: storedOf()},
		{name: "a store that cannot be read removes nothing", disks: []string{a, b},
			stored:  func() (map[string]bool, error) { return nil, errors.New("images: permission denied") },
			wantErr: "which images are stored: images: permission denied", kept: []string{a, b}},
		{name: "the store is not read when no disk could go", disks: []string{a}, only: []string{},
			stored: func() (map[string]bool, error) { return nil, errors.New("stored was called") }, kept: []string{a}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			home := t.TempDir()
			for _, d := range tc.disks {
				fakeDisk(t, home, d)
			}
			dir := filepath.Join(homeCache(home), disksDir)
			for _, n := range tc.others {
				if err := os.WriteFile(filepath.Join(dir, n), nil, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			for _, d := range tc.held {
				_, f, err := buildRootDisk(homeCache(home), d, "/nonexistent: an existing disk is not built")
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { f.Close() })
			}
			if tc.noDir {
				os.RemoveAll(homeCache(home))
			}
			removed, err := PruneDisks(home, tc.only, tc.stored)
			if tc.wantErr == "" && err != nil {
				t.Fatalf("PruneDisks: %v", err)
			}
			if tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("PruneDisks error %v, want one saying %q", err, tc.wantErr)
			}
			var got []string
			for _, d := range removed {
				got = append(got, d.Digest)
				if d.Size <= 0 {
					t.Errorf("removed %s with size %d, want what it took", d.Digest, d.Size)
				}
				if _, err := os.Lstat(d.Path); !os.IsNotExist(err) {
					t.Errorf("removed %s but %s is still there (%v)", d.Digest, d.Path, err)
				}
			}
			slices.Sort(got)
			if !slices.Equal(got, tc.removed) {
				t.Errorf("removed %v, want %v", got, tc.removed)
			}
			for _, d := range tc.kept {
				if _, err := os.Stat(filepath.Join(dir, strings.TrimPrefix(d, digestPrefix)+diskExt)); err != nil {
					t.Errorf("disk of %s gone: %v", d, err)
				}
			}
			for _, n := range tc.others {
				if _, err := os.Lstat(filepath.Join(dir, n)); err != nil {
					t.Errorf("%s gone: %v", n, err)
				}
			}
		})
	}
}

// TestPruneDisksThenHold: a disk pruned after a sandbox opened it, before
// it had the lock, is not held: buildRootDisk makes it again, and the
// path names the file held.
func TestPruneDisksThenHold(t *testing.T) {
	home := t.TempDir()
	p := fakeDisk(t, home, fakeDigest("a"))
	opened, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer opened.Close()
	if _, err := PruneDisks(home, nil, func() (map[string]bool, error) { return nil, nil }); err != nil {
		t.Fatal(err)
	}
	// What holdDisk checks once it has the lock on what it opened.
	if stillNamed(opened, p) {
		t.Fatalf("%s still names the pruned file", p)
	}
	if _, err := holdDisk(p); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("holdDisk of a pruned disk: %v, want ErrNotExist", err)
	}
}

// TestBuildRootDiskRacesPrune: while PruneDisks runs again and again as if
// no image were stored, every build still returns a disk that its path
// names for as long as it is held, and a whole ext4.
func TestBuildRootDiskRacesPrune(t *testing.T) {
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		t.Skip("needs mkfs.ext4 (e2fsprogs): " + err.Error())
	}
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "hello"), []byte("hello\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	home := t.TempDir()
	digest := fakeDigest("c")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := PruneDisks(home, nil, func() (map[string]bool, error) { return nil, nil }); err != nil {
				t.Errorf("PruneDisks: %v", err)
				return
			}
		}
	}()
	for i := range 5 {
		out, f, err := buildRootDisk(homeCache(home), digest, root)
		if err != nil {
			t.Fatalf("build %d: %v", i, err)
		}
		time.Sleep(10 * time.Millisecond) // prunes run meanwhile
		if !stillNamed(f, out) {
			t.Errorf("build %d: %s no longer names the held disk", i, out)
		}
		if b, err := exec.Command("e2fsck", "-fn", out).CombinedOutput(); err != nil {
			t.Errorf("build %d: e2fsck %s: %v\n%s", i, out, err, b)
		}
		f.Close()
	}
	close(stop)
	wg.Wait()
}

func TestGCDiskBuilds(t *testing.T) {
	old := time.Now().Add(-2 * abandonedDiskBuildAge)
	tests := []struct {
		name    string
		young   bool // modified just now
		locked  bool // a build holds its lock
		file    bool // a file, not a directory
		prefix  string
		removed bool
	}{
		{name: "an old directory no build holds goes", prefix: diskBuildPrefix, removed: true},
		{name: "a directory a build holds stays", prefix: diskBuildPrefix, locked: true},
		{name: "a young directory stays", prefix: diskBuildPrefix, young: true},
		{name: "a file stays", prefix: diskBuildPrefix, file: true},
		{name: "other directories stay", prefix: "keep-"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			home := t.TempDir()
			dir := filepath.Join(homeCache(home), disksDir)
			if err := os.MkdirAll(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			p := filepath.Join(dir, tc.prefix+"aaaaaaaaaaaaaaaa-123")
			if tc.file {
				if err := os.WriteFile(p, nil, 0o600); err != nil {
					t.Fatal(err)
				}
			} else {
				if err := os.Mkdir(p, 0o700); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(p, "root.ext4"), []byte("half"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if tc.locked {
				l, err := os.Open(p)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { l.Close() })
				if err := syscall.Flock(int(l.Fd()), syscall.LOCK_EX); err != nil {
					t.Fatal(err)
				}
			}
			if !tc.young {
				if err := os.Chtimes(p, old, old); err != nil {
					t.Fatal(err)
				}
			}
			removed, err := GCDiskBuilds(home)
			if err != nil {
				t.Fatalf("GCDiskBuilds: %v", err)
			}
			_, statErr := os.Lstat(p)
			if gone := os.IsNotExist(statErr); gone != tc.removed {
				t.Errorf("%s gone = %v, want %v (%v)", p, gone, tc.removed, statErr)
			}
			if want := tc.removed; (len(removed) == 1 && removed[0] == p) != want {
				t.Errorf("GCDiskBuilds returned %v, want %s listed: %v", removed, p, want)
			}
		})
	}
	t.Run("no cache directory", func(t *testing.T) {
		if removed, err := GCDiskBuilds(t.TempDir()); err != nil || removed != nil {
			t.Errorf("GCDiskBuilds = %v, %v; want nothing", removed, err)
		}
	})
}
