package image

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"
)

// removeTree deletes dir after making sure nothing is mounted beneath it.
//
// mmdebstrap bind-mounts the host's /dev, /proc and /sys into the tree while
// it runs. If it is killed before unmounting, os.RemoveAll would walk into
// those mounts and delete host device nodes or fail half-way on /proc. So we
// first detach every mount under dir (deepest first) and refuse to delete if
// any remains.
func removeTree(dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("remove %s: %w", dir, err)
	}
	mounts, err := mountsUnder(abs)
	if err != nil {
		return fmt.Errorf("remove %s: %w", dir, err)
	}
	for _, m := range mounts {
		// MNT_DETACH: the mount may still be busy with a dying child of
		// mmdebstrap; lazily detaching it is enough to make it unreachable
		// from the tree we are about to delete.
		if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) {
			return fmt.Errorf("remove %s: unmount leftover %s: %w", dir, m, err)
		}
	}
	if mounts, err = mountsUnder(abs); err != nil {
		return fmt.Errorf("remove %s: %w", dir, err)
	}
	if len(mounts) > 0 {
		return fmt.Errorf("remove %s: still mounted beneath it: %s; unmount them and retry", dir, strings.Join(mounts, ", "))
	}
	// A build process killed a moment ago may still finish one last
	// syscall and create an entry while RemoveAll runs ("directory not
	// empty"); a retry after a short pause gets it.
	for attempt := 0; ; attempt++ {
		err = os.RemoveAll(abs)
		if err == nil {
			return nil
		}
		if attempt == 2 {
			return fmt.Errorf("remove %s: %w", dir, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// mountsUnder returns the mount points at or below dir, deepest first.
func mountsUnder(dir string) ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("read mount table: %w", err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		// Field 5 is the mount point, with space, tab, newline and
		// backslash octal-escaped (proc(5)).
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMountinfo(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read mount table: %w", err)
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out, nil
}

func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			c := (s[i+1]-'0')<<6 | (s[i+2]-'0')<<3 | (s[i+3] - '0')
			b.WriteByte(c)
			i += 3
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// Keeping a stored build from being removed while a sandbox uses it.
//
// A run mounts Image.Root read-only, but a read-only bind mount does not
// stop the files being unlinked through the store path, and the microVM
// tier reads the tree again when it makes its disk. So whoever runs a
// sandbox on a stored build holds <name>/.use-<hex> with a shared flock
// for the sandbox's whole life (Use), warm pool sandboxes included; and
// whoever removes the build takes it exclusively without waiting
// (RemoveName, Prune), refusing or skipping a build that is in use.
// flock, like the build lock: the kernel drops it when the holder dies, so
// a killed moat never pins an image for ever.
//
//	Use     open-or-create .use-<hex>; LOCK_SH (waiting out a removal);
//	        the build still there? keep the lock : fail
//	remove  LOCK_EX|LOCK_NB(.use-<hex>) refused: in use;
//	        taken: remove the tree, unlink .use-<hex>, close
//
// A Use that opened the file before the removal unlinked it gets its lock
// after the removal closes it and then finds the build gone; one that
// opens after the unlink makes a new file and finds the same.

// usePrefix names the use locks in a name's directory.
const usePrefix = ".use-"

// Use marks img as in use until release is called, so that `moat image rm`
// and `moat image gc` leave it alone. It waits while a removal of the same
// build runs, and fails if that removal took the build. An image whose
// root is not inside this store (a test's tree) cannot be removed through
// it and needs no mark: Use then returns a release that does nothing.
func (s *Store) Use(ctx context.Context, img *Image) (release func(), err error) {
	dir, err := filepath.Abs(s.Dir)
	if err != nil {
		return nil, fmt.Errorf("use image %s: %w", img.Name, err)
	}
	if rel, err := filepath.Rel(dir, img.Root); err != nil || rel == ".." || strings.HasPrefix(rel, "../") || filepath.IsAbs(rel) {
		return func() {}, nil
	}
	if err := validName(img.Name); err != nil {
		return nil, fmt.Errorf("use image: %w", err)
	}
	hexDigest := strings.TrimPrefix(img.Digest, digestPrefix)
	if !validHex(hexDigest) {
		return nil, fmt.Errorf("use image %s: digest %q is not sha256:<64 hex>", img.Name, img.Digest)
	}
	path := filepath.Join(s.Dir, img.Name, usePrefix+hexDigest)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("use image %s@%s: it was removed from %s; run again to use what the store has now", img.Name, img.Digest, s.Dir)
	}
	if err != nil {
		return nil, fmt.Errorf("use image %s@%s: %w", img.Name, img.Digest, err)
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB)
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			break
		}
		// A removal holds it: wait for it to end, then look again.
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("use image %s@%s: wait for a removal to end: %w", img.Name, img.Digest, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("use image %s@%s: flock %s: %w", img.Name, img.Digest, path, err)
	}
	if _, err := os.Lstat(filepath.Join(s.Dir, img.Name, hexDigest, metadataFile)); err != nil {
		f.Close()
		return nil, fmt.Errorf("use image %s@%s: it was removed from %s while the run started (%w); run again to use what the store has now", img.Name, img.Digest, s.Dir, err)
	}
	return func() { f.Close() }, nil
}

// ErrInUse means a build cannot be removed because a live sandbox uses it.
var ErrInUse = errors.New("in use by a live sandbox")

// RemoveName deletes every stored build of name, the current one included,
// and returns what it removed. It removes all or nothing: it refuses,
// removing nothing, while a build or import of name runs or while any of
// its builds is in use by a live sandbox (a run, a session or a warm pool
// of `moat serve`; the error wraps ErrInUse). Whether an image is too
// precious to remove (the default one) is the caller's call.
func (s *Store) RemoveName(name string) ([]*Image, error) {
	if err := validName(name); err != nil {
		return nil, err
	}
	nameDir := filepath.Join(s.Dir, name)
	versions, err := storedVersions(nameDir)
	if err != nil {
		return nil, fmt.Errorf("remove image %s: %w", name, err)
	}
	if len(versions) == 0 {
		return nil, fmt.Errorf("remove image %s: %w: the store %s has no build of it (stored images: %s)",
			name, ErrNotBuilt, s.Dir, strings.Join(s.storedNames(), ", "))
	}
	if err := s.checkPrivate(); err != nil {
		return nil, fmt.Errorf("remove image %s: %w", name, err)
	}
	lock, err := lockNonBlocking(filepath.Join(nameDir, lockName))
	if err != nil {
		return nil, fmt.Errorf("remove image %s: a build or import of it is running (%w); retry when it ends", name, err)
	}
	defer lock.Close()
	var locks []*os.File
	defer func() {
		for _, l := range locks {
			l.Close()
		}
	}()
	for _, v := range versions {
		l, err := lockNonBlocking(filepath.Join(nameDir, usePrefix+v))
		if errors.Is(err, errLocked) {
			return nil, fmt.Errorf("remove image %s: build %s%s is %w (a run, a session or a warm pool of `moat serve`); stop it and retry",
				name, digestPrefix, v, ErrInUse)
		}
		if err != nil {
			return nil, fmt.Errorf("remove image %s: %w", name, err)
		}
		locks = append(locks, l)
	}
	// The link goes first: from here on Lookup no longer offers the
	// image, so nothing new starts on a tree being deleted.
	if err := os.Remove(filepath.Join(nameDir, currentLink)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("remove image %s: %w", name, err)
	}
	var removed []*Image
	var errs []error
	for _, v := range versions {
		img := s.describe(name, v)
		if err := removeTree(filepath.Join(nameDir, v)); err != nil {
			errs = append(errs, fmt.Errorf("remove image %s@%s%s: %w", name, digestPrefix, v, err))
			continue
		}
		os.Remove(filepath.Join(nameDir, usePrefix+v))
		removed = append(removed, img)
	}
	// The name's directory and its build lock stay: deleting a lock file
	// another process may be waiting on would let two builds run at once.
	return removed, errors.Join(errs...)
}

// Prune deletes the builds that no name points to (not current) and that
// no live sandbox uses, and returns them; their Size says how many bytes
// each freed. Names whose build lock is held (a build or import running)
// are skipped, as are builds in use. Abandoned build directories are GC's.
func (s *Store) Prune() ([]*Image, error) {
	names, err := os.ReadDir(s.Dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("prune images: %w", err)
	}
	if err := s.checkPrivate(); err != nil {
		return nil, fmt.Errorf("prune images: %w", err)
	}
	var removed []*Image
	var errs []error
	for _, n := range names {
		if !n.IsDir() || validName(n.Name()) != nil {
			continue
		}
		r, err := s.pruneName(n.Name())
		removed = append(removed, r...)
		if err != nil {
			errs = append(errs, err)
		}
	}
	return removed, errors.Join(errs...)
}

// pruneName prunes one name's directory under its build lock.
func (s *Store) pruneName(name string) ([]*Image, error) {
	nameDir := filepath.Join(s.Dir, name)
	lock, err := lockNonBlocking(filepath.Join(nameDir, lockName))
	if errors.Is(err, errLocked) {
		return nil, nil // a build is running; it may be about to point current at one
	}
	if err != nil {
		return nil, fmt.Errorf("prune %s: %w", name, err)
	}
	defer lock.Close()
	versions, err := storedVersions(nameDir)
	if err != nil {
		return nil, fmt.Errorf("prune %s: %w", name, err)
	}
	current, _ := os.Readlink(filepath.Join(nameDir, currentLink))
	var removed []*Image
	var errs []error
	for _, v := range versions {
		if v == current {
			continue
		}
		use, err := lockNonBlocking(filepath.Join(nameDir, usePrefix+v))
		if errors.Is(err, errLocked) {
			continue // a live sandbox runs on it
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("prune %s: %w", name, err))
			continue
		}
		img := s.describe(name, v)
		if err := removeTree(filepath.Join(nameDir, v)); err != nil {
			errs = append(errs, fmt.Errorf("prune %s@%s%s: %w", name, digestPrefix, v, err))
		} else {
			os.Remove(filepath.Join(nameDir, usePrefix+v))
			removed = append(removed, img)
		}
		use.Close()
	}
	// Use locks whose build is gone (a Use that lost the race to a
	// removal leaves one behind) are removed when nobody holds them.
	ents, _ := os.ReadDir(nameDir)
	for _, e := range ents {
		v, ok := strings.CutPrefix(e.Name(), usePrefix)
		if !ok || !validHex(v) {
			continue
		}
		if _, err := os.Lstat(filepath.Join(nameDir, v)); !errors.Is(err, os.ErrNotExist) {
			continue
		}
		if use, err := lockNonBlocking(filepath.Join(nameDir, e.Name())); err == nil {
			os.Remove(filepath.Join(nameDir, e.Name()))
			use.Close()
		}
	}
	return removed, errors.Join(errs...)
}

// storedVersions returns the hex digests of the builds stored in nameDir
// (none when it does not exist).
func storedVersions(nameDir string) ([]string, error) {
	ents, err := os.ReadDir(nameDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() && validHex(e.Name()) {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// Digests returns the digests ("sha256:<hex>") of every build the store
// holds, under any name, current or not: what a cache made from builds
// (the microVM tier's disks) must keep. Builds still running have none
// yet. A store not made yet holds none; one that cannot be read is an
// error, so that no cache is pruned on a guess.
func (s *Store) Digests() (map[string]bool, error) {
	out := map[string]bool{}
	names, err := os.ReadDir(s.Dir)
	if errors.Is(err, os.ErrNotExist) {
		return out, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list stored digests: %w", err)
	}
	for _, n := range names {
		if !n.IsDir() || validName(n.Name()) != nil {
			continue
		}
		versions, err := storedVersions(filepath.Join(s.Dir, n.Name()))
		if err != nil {
			return nil, fmt.Errorf("list stored digests: %w", err)
		}
		for _, v := range versions {
			out[digestPrefix+v] = true
		}
	}
	return out, nil
}

// describe returns a build's metadata for a removal report, or as much as
// its directory name says when image.json cannot be read (a damaged build
// is removed all the same).
func (s *Store) describe(name, hexDigest string) *Image {
	if img, err := s.load(name, hexDigest); err == nil {
		return img
	}
	return &Image{Name: name, Digest: digestPrefix + hexDigest}
}

// storedNames lists the names with at least one stored build.
func (s *Store) storedNames() []string {
	var out []string
	ents, _ := os.ReadDir(s.Dir)
	for _, e := range ents {
		if !e.IsDir() || validName(e.Name()) != nil {
			continue
		}
		if v, _ := storedVersions(filepath.Join(s.Dir, e.Name())); len(v) > 0 {
			out = append(out, e.Name())
		}
	}
	if len(out) == 0 {
		return []string{"none"}
	}
	return out
}
