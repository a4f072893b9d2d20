package image

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestFileSumsLookup: a remembered sum answers only for the same inode
// with the same size, mtime and ctime, to the nanosecond.
func TestFileSumsLookup(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	f.WriteString("content")
	sum := sha256.Sum256([]byte("content"))
	s := newFileSums()
	st, err := fstat(f)
	if err != nil {
		t.Fatal(err)
	}
	s.remember(st, sum[:])
	tests := []struct {
		name   string
		change func(st *syscall.Stat_t)
		want   bool
	}{
		{"unchanged", func(*syscall.Stat_t) {}, true},
		{"other inode", func(st *syscall.Stat_t) { st.Ino++ }, false},
		{"other device", func(st *syscall.Stat_t) { st.Dev++ }, false},
		{"other size", func(st *syscall.Stat_t) { st.Size++ }, false},
		{"mtime a nanosecond later", func(st *syscall.Stat_t) { st.Mtim.Nsec++ }, false},
		{"ctime a nanosecond later", func(st *syscall.Stat_t) { st.Ctim.Nsec++ }, false},
		{"ctime a second earlier", func(st *syscall.Stat_t) { st.Ctim.Sec-- }, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := *st
			tc.change(&c)
			got, ok := s.lookup(&c)
			if ok != tc.want {
				t.Fatalf("lookup found %v, want %v", ok, tc.want)
			}
			if ok && got != fmt.Sprintf("%x", sum) {
				t.Errorf("lookup = %s, want %x", got, sum)
			}
		})
	}
	if err := s.forget(f); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.lookup(st); ok {
		t.Error("lookup after forget found the sum")
	}
	var none *fileSums
	if _, ok := none.lookup(st); ok {
		t.Error("a nil fileSums found a sum")
	}
}

// rewriteInPlace writes content into the existing file at p (same inode)
// and repeats until its ctime differs from what it was: a writer a clock
// tick after the extractor, which does not remember what it wrote.
func rewriteInPlace(t *testing.T, p, content string) {
	t.Helper()
	var before syscall.Stat_t
	if err := syscall.Lstat(p, &before); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; {
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_TRUNC, 0)
		if err != nil {
			t.Fatal(err)
		}
		f.WriteString(content)
		f.Close()
		var after syscall.Stat_t
		if err := syscall.Lstat(p, &after); err != nil {
			t.Fatal(err)
		}
		if after.Ino != before.Ino {
			t.Fatalf("rewrite of %s made a new inode", p)
		}
		if after.Ctim != before.Ctim {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("ctime of %s did not change in 5 s", p)
		}
		time.Sleep(time.Millisecond)
	}
}

// listingLines maps each path of writeListing's output to its line.
func listingLines(t *testing.T, root string, sums *fileSums) map[string]string {
	t.Helper()
	var buf bytes.Buffer
	if _, err := writeListing(&buf, root, sums); err != nil {
		t.Fatal(err)
	}
	lines := map[string]string{}
	for _, line := range strings.SplitAfter(buf.String(), "\n") {
		if line == "" {
			continue
		}
		q, err := strconv.QuotedPrefix(line)
		if err != nil {
			t.Fatalf("listing line %q: %v", line, err)
		}
		p, _ := strconv.Unquote(q)
		lines[p] = line
	}
	return lines
}

// TestRememberedSumsGiveTheTreeDigest applies layers as Import does
// (extraction remembering each file's sum, finalisation), then checks that
// the digest from the remembered sums is the digest of a fresh read of the
// tree, whatever later layers, finalize or another writer did to the
// files. A second listing, with every remembered sum replaced by a wrong
// one, shows which files the sums answered for: the untouched ones
// (cached) must have been, the ones written after extraction (fresh)
// must not.
func TestRememberedSumsGiveTheTreeDigest(t *testing.T) {
	hard := func(name, to string) tarEntry { return tarEntry{name: name, typ: tar.TypeLink, link: to} }
	passwdSized := strings.Repeat("p", len(imagePasswd)) // as long as finalize's own
	tests := []struct {
		name   string
		layers [][]tarEntry
		after  func(t *testing.T, root string) // after extraction, before finalize
		cached []string
		fresh  []string
		// forgotten: files finalize wrote. Their inodes must have no
		// record at all: on a filesystem that reuses a freed inode
		// number at once (ext4 does), a record of the file they
		// replaced would otherwise be kept, and only the clock tick
		// between the two would tell them apart.
		forgotten []string
	}{
		{
			name:   "one layer",
			layers: [][]tarEntry{{dir("app/"), file("app/a", "aaaa"), file("app/b", ""), tarEntry{name: "bin/tool", typ: tar.TypeReg, body: "#!/bin/sh\n", mode: 0o4755}, symlink("bin/link", "tool")}},
			cached: []string{"app/a", "app/b", "bin/tool"},
		},
		{
			name:   "a later layer rewrites a file, same size",
			layers: [][]tarEntry{{file("app/a", "old1"), file("app/b", "bbbb")}, {file("app/a", "new2")}},
			cached: []string{"app/a", "app/b"},
		},
		{
			name:   "one layer writes the same name twice",
			layers: [][]tarEntry{{file("a", "xxxx"), file("a", "yyyy")}},
			cached: []string{"a"},
		},
		{
			name:   "whiteout, then the same name again",
			layers: [][]tarEntry{{file("d/a", "1111")}, {file("d/.wh.a", "")}, {file("d/a", "2222")}},
			cached: []string{"d/a"},
		},
		{
			name:   "opaque directory",
			layers: [][]tarEntry{{file("d/a", "aaaa"), file("d/b", "bbbb")}, {dir("d/"), file("d/.wh..wh..opq", ""), file("d/a", "AAAA")}},
			cached: []string{"d/a"},
		},
		{
			name:   "hard link, then its first name rewritten",
			layers: [][]tarEntry{{file("a", "aaaa"), hard("h", "a")}, {file("a", "bbbb")}},
			cached: []string{"a"},
		},
		{
			name:   "hard link added by a later layer",
			layers: [][]tarEntry{{file("a", "aaaa")}, {hard("h", "a")}},
		},
		{
			name:   "a directory replaced by a file and back",
			layers: [][]tarEntry{{file("d/x", "xxxx")}, {file("d", "dddd")}, {dir("d/"), file("d/x", "yyyy")}},
			cached: []string{"d/x"},
		},
		{
			name:      "finalize replaces the account files",
			layers:    [][]tarEntry{{file("etc/passwd", passwdSized), file("etc/hosts", strings.Repeat("h", len(imageHosts))), file("etc/keep", "kkkk")}},
			cached:    []string{"etc/keep"},
			fresh:     []string{"etc/passwd", "etc/hosts", "etc/group", "etc/hostname"},
			forgotten: []string{"etc/passwd", "etc/hosts", "etc/group", "etc/hostname", "etc/resolv.conf"},
		},
		{
			name:   "finalize empties a directory",
			layers: [][]tarEntry{{file("var/log/x", "xxxx"), file("tmp/y", "yyyy"), file("etc/passwd-", "pppp")}},
		},
		{
			name:   "a file rewritten in place after extraction",
			layers: [][]tarEntry{{file("app/a", "aaaa"), file("app/b", "bbbb")}},
			after:  func(t *testing.T, root string) { rewriteInPlace(t, filepath.Join(root, "app/a"), "AAAA") },
			cached: []string{"app/b"},
			fresh:  []string{"app/a"},
		},
		{
			name:   "a file's hard link rewritten in place after extraction",
			layers: [][]tarEntry{{file("a", "aaaa"), hard("h", "a")}},
			after:  func(t *testing.T, root string) { rewriteInPlace(t, filepath.Join(root, "h"), "AAAA") },
			fresh:  []string{"a", "h"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rootfs := filepath.Join(t.TempDir(), "rootfs")
			if err := os.Mkdir(rootfs, 0o755); err != nil {
				t.Fatal(err)
			}
			root := openTestRoot(t, rootfs)
			sums := newFileSums()
			budget := testBudget(100)
			dirModes := map[string]fs.FileMode{}
			for i, entries := range tc.layers {
				if _, err := extractLayer(root, bytes.NewReader(makeTar(t, entries...)), fmt.Sprintf("layer %d", i+1), budget, dirModes, sums); err != nil {
					t.Fatal(err)
				}
			}
			if err := applyDirModes(root, dirModes); err != nil {
				t.Fatal(err)
			}
			if tc.after != nil {
				tc.after(t, rootfs)
			}
			if err := ensureEtc(rootfs); err != nil {
				t.Fatal(err)
			}
			if err := finalize(rootfs, sums); err != nil {
				t.Fatal(err)
			}

			want, wantSize, err := TreeDigest(rootfs)
			if err != nil {
				t.Fatal(err)
			}
			got, gotSize, err := treeDigest(rootfs, sums)
			if err != nil {
				t.Fatal(err)
			}
			if got != want || gotSize != wantSize {
				t.Errorf("digest with remembered sums %s (%d bytes), fresh %s (%d bytes)\nwith sums:\n%v\nfresh:\n%v",
					got, gotSize, want, wantSize, listingLines(t, rootfs, sums), listingLines(t, rootfs, nil))
			}

			for _, p := range tc.forgotten {
				var st syscall.Stat_t
				if err := syscall.Lstat(filepath.Join(rootfs, p), &st); err != nil {
					t.Fatal(err)
				}
				if _, ok := sums.sums[fileID{st.Dev, st.Ino}]; ok {
					t.Errorf("%s: finalize wrote it, but its inode (%d) has a record", p, st.Ino)
				}
			}

			wrong := newFileSums()
			for id, rec := range sums.sums {
				rec.sum = [32]byte{0xba, 0xd}
				wrong.sums[id] = rec
			}
			fresh, poisoned := listingLines(t, rootfs, nil), listingLines(t, rootfs, wrong)
			for _, p := range tc.cached {
				if fresh[p] == "" || poisoned[p] == fresh[p] {
					t.Errorf("%s: its remembered sum was not used:\n%s", p, fresh[p])
				}
			}
			for _, p := range tc.fresh {
				if fresh[p] == "" || poisoned[p] != fresh[p] {
					t.Errorf("%s: a remembered sum was used for content written after it:\n%s%s", p, poisoned[p], fresh[p])
				}
			}
		})
	}
}

// TestScrubRemovesCapabilitiesAddedAfterExtraction: finalize leaves alone
// the xattrs of files the extractor wrote and nothing changed since, but a
// file capability set on one afterwards changes its ctime, so the sums no
// longer vouch for it and finalize removes the capability.
func TestScrubRemovesCapabilitiesAddedAfterExtraction(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: setting security.capability needs CAP_SETFCAP")
	}
	rootfs := filepath.Join(t.TempDir(), "rootfs")
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		t.Fatal(err)
	}
	root := openTestRoot(t, rootfs)
	sums := newFileSums()
	layer := makeTar(t, tarEntry{name: "bin/ping", typ: tar.TypeReg, body: "x", mode: 0o755}, file("bin/other", "y"))
	if _, err := extractLayer(root, bytes.NewReader(layer), "layer 1", testBudget(100), map[string]fs.FileMode{}, sums); err != nil {
		t.Fatal(err)
	}
	ping := filepath.Join(rootfs, "bin/ping")
	// cap_net_raw, permitted and effective (VFS_CAP_REVISION_2).
	capNetRaw := []byte{0x01, 0x00, 0x00, 0x02, 0x00, 0x20, 0x00, 0x00, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
	if err := syscall.Setxattr(ping, "security.capability", capNetRaw, 0); err != nil {
		t.Skipf("cannot set security.capability on this filesystem: %v", err)
	}
	if err := ensureEtc(rootfs); err != nil {
		t.Fatal(err)
	}
	if err := finalize(rootfs, sums); err != nil {
		t.Fatal(err)
	}
	if _, err := syscall.Getxattr(ping, "security.capability", make([]byte, 64)); !errors.Is(err, syscall.ENODATA) {
		t.Errorf("bin/ping kept the capability set after extraction (getxattr: %v)", err)
	}
}
