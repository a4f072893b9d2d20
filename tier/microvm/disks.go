package microvm

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/moat-sandbox/moat/image"
)

// The cache of image root disks: HOME/microvm/images/<hex>.ext4, one
// read-only ext4 per image digest, made the first time a sandbox runs on
// the image. A sandbox holds its disk while it lives; `moat image gc` and
// `moat image rm` remove the disks of images no longer stored (PruneDisks)
// and what killed builds left (GCDiskBuilds).
//
// Holding and removing use flock on the disk file itself:
//
//	hold   open <hex>.ext4; LOCK_SH; does the path still name this file?
//	       yes: keep the descriptor until the sandbox is destroyed;
//	       no (pruned meanwhile): close, build it again
//	build  write it in a directory of its own (.tmp-*), holding that
//	       directory's LOCK_EX; open the new file, LOCK_SH; link it as
//	       <hex>.ext4, never over an existing one (EEXIST: another
//	       build won, hold that one)
//	prune  open <hex>.ext4; LOCK_EX|LOCK_NB refused: a sandbox holds
//	       it, skip; taken: does the path still name this file? unlink
//
// So a path that names a held file names it until every holder lets go:
// only prune unlinks, under LOCK_EX, and no build replaces a file. The
// VMM, which opens the path itself after Prepare, opens the file its
// sandbox holds; a VMM that outlives its sandbox keeps its open file
// (unlinking frees nothing that is open). flock, not a list of users: the
// kernel drops it when a moat dies, so a killed moat pins no disk.

const (
	// disksDir is the disks' directory in the tier's cache directory.
	disksDir = "images"
	diskExt  = ".ext4"
	// diskBuildPrefix names the directories builds of a disk write in.
	diskBuildPrefix = ".tmp-"
	digestPrefix    = "sha256:"
)

// abandonedDiskBuildAge is how old a build directory whose lock is free
// must be before GCDiskBuilds removes it: a build locks its directory a
// moment after making it.
const abandonedDiskBuildAge = 10 * time.Minute

// homeCache is the tier's cache directory under Moat's state directory.
func homeCache(home string) string { return filepath.Join(home, "microvm") }

func isHexDigest(s string) bool {
	return len(s) == 64 && strings.Trim(s, "0123456789abcdef") == ""
}

// buildRootDisk returns the root disk of the image digest, converted from
// the image's root (image.WriteExt4) the first time, and the disk held:
// PruneDisks leaves it alone until the caller closes the returned file.
func buildRootDisk(cacheDir, digest, root string) (string, *os.File, error) {
	hexd := strings.TrimPrefix(digest, digestPrefix)
	if !isHexDigest(hexd) {
		return "", nil, fmt.Errorf("image digest %q is not a sha256 digest", digest)
	}
	dir := filepath.Join(cacheDir, disksDir)
	out := filepath.Join(dir, hexd+diskExt)
	// Each round loses only to a prune, or a build, that ran meanwhile.
	for range 3 {
		f, err := holdDisk(out)
		if err == nil {
			return out, f, nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return "", nil, fmt.Errorf("root disk of image %s: %w", digest, err)
		}
		f, err = makeDisk(dir, out, hexd, root)
		if err == nil {
			return out, f, nil
		}
		if !errors.Is(err, fs.ErrExist) {
			return "", nil, fmt.Errorf("root disk of image %s: %w", digest, err)
		}
	}
	return "", nil, fmt.Errorf("root disk of image %s: %s was removed three times while it was opened or made; is `moat image gc` running in a loop?", digest, out)
}

// holdDisk opens path and takes its shared lock. The error wraps
// fs.ErrNotExist when there is no such file or it was pruned before the
// lock was had.
func holdDisk(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	if err := flock(f, syscall.LOCK_SH); err != nil {
		f.Close()
		return nil, fmt.Errorf("flock %s: %w", path, err)
	}
	if !stillNamed(f, path) {
		f.Close()
		return nil, fmt.Errorf("%s was removed while it was opened: %w", path, fs.ErrNotExist)
	}
	return f, nil
}

// makeDisk writes the disk of root and links it as out, held. The error
// wraps fs.ErrExist when another build linked its disk first.
func makeDisk(dir, out, hexd, root string) (*os.File, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	// A directory of its own per build: two builds of one image (two
	// runs of moat serve at once after a rebuild) must not write one
	// file. Its lock tells GCDiskBuilds the build is alive.
	tmpDir, err := os.MkdirTemp(dir, diskBuildPrefix+hexd[:16]+"-")
	if err != nil {
		return nil, err
	}
	lock, err := os.Open(tmpDir)
	if err != nil {
		os.RemoveAll(tmpDir)
		return nil, err
	}
	defer func() {
		os.RemoveAll(tmpDir)
		lock.Close()
	}()
	if err := flock(lock, syscall.LOCK_EX); err != nil {
		return nil, fmt.Errorf("flock %s: %w", tmpDir, err)
	}
	tmp := filepath.Join(tmpDir, "root.ext4")
	if err := image.WriteExt4(root, tmp); err != nil {
		return nil, err
	}
	if err := os.Chmod(tmp, 0o600); err != nil {
		return nil, err
	}
	// Held before it has its name, so no prune can take it between the
	// link and the lock.
	f, err := holdDisk(tmp)
	if err != nil {
		return nil, err
	}
	// A link, not a rename: a rename would replace a disk another
	// sandbox holds, and its VMM would then open this one.
	if err := os.Link(tmp, out); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// Disk is one image root disk in the microVM tier's cache.
type Disk struct {
	// Digest is the image's, "sha256:<hex>".
	Digest string
	// Path is where the disk was.
	Path string
	// Size is what the file took on the host's disk: its allocated
	// blocks.
	Size int64
}

// PruneDisks removes the image root disks cached under home (Moat's state
// directory, Options.Home) whose image the store no longer holds, and
// returns them. stored returns the digests ("sha256:<hex>") of every
// build the store holds; it is called once, after the cache is listed, so
// that a disk made for an image published meanwhile is not taken for
// stale. When only is not nil, only the disks of those digests may go
// (`moat image rm` removes its image's and leaves the rest to `moat image
// gc`). A disk a live sandbox holds is skipped. Nothing is removed when
// stored fails; errors name the disk.
func PruneDisks(home string, only []string, stored func() (map[string]bool, error)) ([]Disk, error) {
	dir := filepath.Join(homeCache(home), disksDir)
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("prune microVM disks: %w", err)
	}
	var candidates []string
	for _, e := range ents {
		hexd, ok := strings.CutSuffix(e.Name(), diskExt)
		if !ok || !isHexDigest(hexd) || !e.Type().IsRegular() {
			continue
		}
		if only != nil && !slices.Contains(only, digestPrefix+hexd) {
			continue
		}
		candidates = append(candidates, hexd)
	}
	if len(candidates) == 0 {
		return nil, nil
	}
	keep, err := stored()
	if err != nil {
		return nil, fmt.Errorf("prune microVM disks: which images are stored: %w", err)
	}
	var removed []Disk
	var errs []error
	for _, hexd := range candidates {
		digest := digestPrefix + hexd
		if keep[digest] {
			continue
		}
		d, err := pruneDisk(filepath.Join(dir, hexd+diskExt), digest)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("prune the microVM disk of %s: %w", digest, err))
		case d != nil:
			removed = append(removed, *d)
		}
	}
	return removed, errors.Join(errs...)
}

// pruneDisk unlinks the disk at path unless a sandbox holds it; nil and
// no error when it is held, or already gone.
func pruneDisk(path, digest string) (*Disk, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil // another prune was first
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if err := flock(f, syscall.LOCK_EX|syscall.LOCK_NB); errors.Is(err, syscall.EWOULDBLOCK) {
		return nil, nil // a live sandbox runs on it
	} else if err != nil {
		return nil, fmt.Errorf("flock %s: %w", path, err)
	}
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !stillNamed(f, path) {
		// Pruned by another and made again since we opened it: the new
		// file is a build's, held or about to be.
		return nil, nil
	}
	if err := os.Remove(path); err != nil {
		return nil, err
	}
	var size int64
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		size = st.Blocks * 512
	}
	return &Disk{Digest: digest, Path: path, Size: size}, nil
}

// GCDiskBuilds removes the directories that builds of a disk (under home,
// as for PruneDisks) left behind when they were killed before cleaning up,
// and returns their paths. A build holds its directory's lock for its
// whole life; directories younger than abandonedDiskBuildAge are left
// alone as well.
func GCDiskBuilds(home string) ([]string, error) {
	before := time.Now().Add(-abandonedDiskBuildAge)
	dir := filepath.Join(homeCache(home), disksDir)
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("gc microVM disk builds: %w", err)
	}
	var removed []string
	var errs []error
	for _, e := range ents {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), diskBuildPrefix) {
			continue
		}
		p := filepath.Join(dir, e.Name())
		gone, err := removeAbandoned(p, before)
		if err != nil {
			errs = append(errs, fmt.Errorf("gc microVM disk build %s: %w", p, err))
		}
		if gone {
			removed = append(removed, p)
		}
	}
	return removed, errors.Join(errs...)
}

// removeAbandoned removes the build directory p when it was last modified
// before before and no build holds its lock; true when it did.
func removeAbandoned(p string, before time.Time) (bool, error) {
	lock, err := os.OpenFile(p, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil // its build ended meanwhile
	}
	if err != nil {
		return false, err
	}
	defer lock.Close()
	fi, err := lock.Stat()
	if err != nil {
		return false, err
	}
	if !fi.ModTime().Before(before) {
		return false, nil
	}
	if err := flock(lock, syscall.LOCK_EX|syscall.LOCK_NB); errors.Is(err, syscall.EWOULDBLOCK) {
		return false, nil // a build is writing in it
	} else if err != nil {
		return false, fmt.Errorf("flock: %w", err)
	}
	if err := os.RemoveAll(p); err != nil {
		return false, err
	}
	return true, nil
}

// stillNamed reports whether path names the file f has open.
func stillNamed(f *os.File, path string) bool {
	fi, err := f.Stat()
	if err != nil {
		return false
	}
	pi, err := os.Lstat(path)
	return err == nil && os.SameFile(fi, pi)
}

// flock is flock(2) on f, again when a signal interrupts it.
func flock(f *os.File, how int) error {
	for {
		err := syscall.Flock(int(f.Fd()), how)
		if !errors.Is(err, syscall.EINTR) {
			return err
		}
	}
}
