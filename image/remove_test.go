package image

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// storeImage puts a build of name whose tree holds one file with content
// into s, as a build or an import would leave it, and points current at it
// when current is true.
func storeImage(t *testing.T, s *Store, name, content string, current bool) *Image {
	t.Helper()
	tmp := filepath.Join(s.Dir, name, buildPrefix+"test")
	mustWrite(t, filepath.Join(tmp, rootfsDir, "usr", "bin", "tool"), content, 0o755)
	digest, size, err := TreeDigest(filepath.Join(tmp, rootfsDir))
	if err != nil {
		t.Fatal(err)
	}
	img := &Image{Name: name, Digest: digest, Size: size, Env: []string{"PATH=/usr/bin"}, Built: time.Now().UTC()}
	data, err := json.Marshal(img)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tmp, metadataFile), data, 0o644); err != nil {
		t.Fatal(err)
	}
	hexDigest := strings.TrimPrefix(digest, digestPrefix)
	if err := os.Rename(tmp, filepath.Join(s.Dir, name, hexDigest)); err != nil {
		t.Fatal(err)
	}
	if current {
		link := filepath.Join(s.Dir, name, currentLink)
		os.Remove(link)
		if err := os.Symlink(hexDigest, link); err != nil {
			t.Fatal(err)
		}
	}
	img.Root = filepath.Join(s.Dir, name, hexDigest, rootfsDir)
	return img
}

func newEmptyStore(t *testing.T) *Store {
	t.Helper()
	s := newFakeStore(t, &fakeTools{})
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestNamesAndLookupOfStoredImages(t *testing.T) {
	s := newEmptyStore(t)
	nodeapp := storeImage(t, s, "nodeapp", "v1", true)
	storeImage(t, s, "orphan", "x", false) // no current: not offered
	if got, want := s.Names(), []string{"base", "code-interpreter", "node", "nodeapp", "python"}; !slices.Equal(got, want) {
		t.Errorf("Names() = %v, want %v", got, want)
	}
	tests := []struct {
		name, image string
		wantDigest  string
		wantIs      error
		wantMsg     []string
	}{
		{name: "stored image without a definition", image: "nodeapp", wantDigest: nodeapp.Digest},
		{name: "unknown name lists stored and built-in images", image: "cobol", wantIs: ErrUnknown, wantMsg: []string{`"cobol"`, "known images: base, code-interpreter, node, nodeapp, python"}},
		{name: "stored but never made current", image: "orphan", wantIs: ErrUnknown, wantMsg: []string{`"orphan"`}},
		{name: "reference syntax the store cannot hold", image: "python:3.12", wantIs: ErrUnknown, wantMsg: []string{"must match"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			img, err := s.Lookup(tc.image)
			if tc.wantIs == nil {
				if err != nil || img.Digest != tc.wantDigest || !img.Current {
					t.Fatalf("Lookup(%q) = %+v, %v; want %s", tc.image, img, err, tc.wantDigest)
				}
				return
			}
			if !errors.Is(err, tc.wantIs) {
				t.Fatalf("Lookup(%q) = %v, want error wrapping %v", tc.image, err, tc.wantIs)
			}
			for _, w := range tc.wantMsg {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Lookup(%q) error %q does not mention %q", tc.image, err, w)
				}
			}
		})
	}
}

func TestRemoveName(t *testing.T) {
	tests := []struct {
		name string
		// hold runs before RemoveName and returns what to release after.
		hold        func(t *testing.T, s *Store, cur, old *Image) func()
		image       string
		wantRemoved int
		wantIs      error
		wantMsg     string
	}{
		{name: "every build, current included", image: "nodeapp", wantRemoved: 2},
		{
			name: "current build in use", image: "nodeapp", wantIs: ErrInUse, wantMsg: "in use",
			hold: func(t *testing.T, s *Store, cur, _ *Image) func() { return use(t, s, cur) },
		},
		{
			name: "old build in use", image: "nodeapp", wantIs: ErrInUse, wantMsg: "in use",
			hold: func(t *testing.T, s *Store, _, old *Image) func() { return use(t, s, old) },
		},
		{
			name: "build running", image: "nodeapp", wantMsg: "build or import of it is running",
			hold: func(t *testing.T, s *Store, _, _ *Image) func() {
				l, err := lockNonBlocking(filepath.Join(s.Dir, "nodeapp", lockName))
				if err != nil {
					t.Fatal(err)
				}
				return func() { l.Close() }
			},
		},
		{name: "not stored", image: "ruby", wantIs: ErrNotBuilt, wantMsg: "stored images: nodeapp"},
		{name: "bad name", image: "../nodeapp", wantMsg: "must match"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newEmptyStore(t)
			old := storeImage(t, s, "nodeapp", "v1", false)
			cur := storeImage(t, s, "nodeapp", "v2", true)
			if tc.hold != nil {
				defer tc.hold(t, s, cur, old)()
			}
			removed, err := s.RemoveName(tc.image)
			if tc.wantMsg != "" || tc.wantIs != nil {
				if err == nil || !strings.Contains(err.Error(), tc.wantMsg) || (tc.wantIs != nil && !errors.Is(err, tc.wantIs)) {
					t.Fatalf("RemoveName(%q) = %v, %v; want error %v mentioning %q", tc.image, removed, err, tc.wantIs, tc.wantMsg)
				}
				// Refused means nothing removed.
				assertStoreClean(t, s, "nodeapp", 2)
				if img, err := s.Lookup("nodeapp"); err != nil || img.Digest != cur.Digest {
					t.Errorf("after a refused removal Lookup(nodeapp) = %v, %v", img, err)
				}
				return
			}
			if err != nil || len(removed) != tc.wantRemoved {
				t.Fatalf("RemoveName(%q) = %d removed, %v; want %d", tc.image, len(removed), err, tc.wantRemoved)
			}
			assertStoreClean(t, s, "nodeapp", 0)
			if _, err := s.Lookup("nodeapp"); !errors.Is(err, ErrUnknown) {
				t.Errorf("Lookup after RemoveName = %v, want ErrUnknown", err)
			}
			if _, err := s.Use(context.Background(), cur); err == nil {
				t.Error("Use of a removed build succeeded")
			}
		})
	}
}

// use marks img in use as a run would, and returns the release.
func use(t *testing.T, s *Store, img *Image) func() {
	t.Helper()
	release, err := s.Use(context.Background(), img)
	if err != nil {
		t.Fatalf("Use(%s): %v", img.Digest, err)
	}
	return release
}

func TestPrune(t *testing.T) {
	tests := []struct {
		name       string
		inUse      bool
		buildLock  bool
		wantPruned bool
	}{
		{name: "old build nobody uses", wantPruned: true},
		{name: "old build a live sandbox uses", inUse: true},
		{name: "build running under the name", buildLock: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newEmptyStore(t)
			old := storeImage(t, s, "nodeapp", "v1", false)
			cur := storeImage(t, s, "nodeapp", "v2", true)
			orphan := storeImage(t, s, "scratch", "x", false) // no current at all
			if tc.inUse {
				defer use(t, s, old)()
			}
			if tc.buildLock {
				l, err := lockNonBlocking(filepath.Join(s.Dir, "nodeapp", lockName))
				if err != nil {
					t.Fatal(err)
				}
				defer l.Close()
			}
			removed, err := s.Prune()
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, r := range removed {
				got = append(got, r.Digest)
				if r.Size <= 0 {
					t.Errorf("pruned %s reports size %d", r.Digest, r.Size)
				}
			}
			want := []string{orphan.Digest}
			if tc.wantPruned {
				want = append([]string{old.Digest}, want...)
			}
			if !slices.Equal(got, want) {
				t.Errorf("Prune removed %v, want %v", got, want)
			}
			if img, err := s.Lookup("nodeapp"); err != nil || img.Digest != cur.Digest {
				t.Errorf("Prune broke the current build: %v, %v", img, err)
			}
			if _, err := os.Stat(old.Root); (err == nil) == tc.wantPruned {
				t.Errorf("old build's tree exists = %v after Prune, want %v", err == nil, !tc.wantPruned)
			}
		})
	}
}

func TestDigests(t *testing.T) {
	tests := []struct {
		name string
		// setup stores builds and returns the digests Digests must give.
		setup func(t *testing.T, s *Store) []string
	}{
		{name: "no store yet", setup: func(t *testing.T, s *Store) []string {
			os.RemoveAll(s.Dir)
			return nil
		}},
		{name: "every build of every name, current or not", setup: func(t *testing.T, s *Store) []string {
			return []string{
				storeImage(t, s, "nodeapp", "v1", false).Digest,
				storeImage(t, s, "nodeapp", "v2", true).Digest,
				storeImage(t, s, "scratch", "x", false).Digest,
			}
		}},
		{name: "a build still running has no digest yet", setup: func(t *testing.T, s *Store) []string {
			mustWrite(t, filepath.Join(s.Dir, "nodeapp", buildPrefix+"running", rootfsDir, "f"), "x", 0o644)
			return nil
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newEmptyStore(t)
			want := tc.setup(t, s)
			got, err := s.Digests()
			if err != nil {
				t.Fatal(err)
			}
			var gotList []string
			for d := range got {
				gotList = append(gotList, d)
			}
			slices.Sort(gotList)
			slices.Sort(want)
			if !slices.Equal(gotList, want) {
				t.Errorf("Digests() = %v, want %v", gotList, want)
			}
		})
	}
}

func TestUse(t *testing.T) {
	s := newEmptyStore(t)
	img := storeImage(t, s, "nodeapp", "v1", true)

	// Outside the store: nothing to guard, nothing to fail.
	outside := &Image{Name: "nodeapp", Digest: img.Digest, Root: t.TempDir()}
	release, err := s.Use(context.Background(), outside)
	if err != nil {
		t.Fatalf("Use of an image outside the store: %v", err)
	}
	release()

	// A Use waits while a removal holds the build, and fails when the
	// removal took it.
	hexDigest := strings.TrimPrefix(img.Digest, digestPrefix)
	l, err := lockNonBlocking(filepath.Join(s.Dir, "nodeapp", usePrefix+hexDigest))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := s.Use(ctx, img); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Use during a removal = %v, want it to wait until ctx ends", err)
	}
	if err := os.RemoveAll(filepath.Join(s.Dir, "nodeapp", hexDigest)); err != nil {
		t.Fatal(err)
	}
	l.Close()
	if _, err := s.Use(context.Background(), img); err == nil || !strings.Contains(err.Error(), "removed") {
		t.Errorf("Use of a build removed meanwhile = %v, want refusal", err)
	}
}

func TestRemoveRefusesBuildInUse(t *testing.T) {
	s := newEmptyStore(t)
	old := storeImage(t, s, "nodeapp", "v1", false)
	storeImage(t, s, "nodeapp", "v2", true)
	release := use(t, s, old)
	if err := s.Remove("nodeapp", old.Digest); !errors.Is(err, ErrInUse) {
		t.Errorf("Remove of a build in use = %v, want ErrInUse", err)
	}
	release()
	if err := s.Remove("nodeapp", old.Digest); err != nil {
		t.Errorf("Remove once released: %v", err)
	}
	assertStoreClean(t, s, "nodeapp", 1)
}
