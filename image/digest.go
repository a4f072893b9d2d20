package image

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
)

// digestPrefix is the algorithm tag in front of every digest, as in OCI.
const digestPrefix = "sha256:"

// TreeDigest returns the content digest ("sha256:<hex>") of the tree rooted
// at root, and the total size in bytes of its regular files. See WriteListing
// for what the digest covers.
func TreeDigest(root string) (digest string, size int64, err error) {
	return treeDigest(root, nil)
}

// treeDigest is TreeDigest, using the sums an import remembered for files
// it has not changed since (filesums.go) instead of reading them.
func treeDigest(root string, sums *fileSums) (digest string, size int64, err error) {
	h := sha256.New()
	size, err = writeListing(h, root, sums)
	if err != nil {
		return "", 0, err
	}
	return digestPrefix + hex.EncodeToString(h.Sum(nil)), size, nil
}

// WriteListing writes the canonical listing of the tree rooted at root to w:
// one line per entry, sorted by path, so the sha256 of the listing is the
// tree's digest and two listings can be compared with diff(1) to see why two
// builds differ. It returns the total size of regular files.
//
// Each line is
//
//	"<relative path>" <type> <mode> <uid> <gid> <size> <payload> [xattrs]
//
// where path is Go-quoted (so no name can forge a line break), type is one of
// d f l c b p s, mode is the octal permission bits including setuid, setgid
// and sticky, size is the length of a regular file (0 otherwise: a
// directory's size depends on the filesystem, not on its content), and
// payload is the sha256 of a regular file's content, a symlink's target, or a
// device's major:minor. Modification times are deliberately left out: they
// say when a build ran, not what it contains.
//
// Symlinks are never followed, neither while walking nor while hashing: a
// link is recorded as its target string. The tree may come from package
// maintainer scripts we do not control, and following an absolute link such
// as /etc/resolv.conf -> /run/... would hash (or leak) the host's file.
func WriteListing(w io.Writer, root string) (int64, error) {
	return writeListing(w, root, nil)
}

// writeListing is WriteListing, taking a regular file's sha256 from sums
// when it vouches for the file (filesums.go).
func writeListing(w io.Writer, root string, sums *fileSums) (int64, error) {
	// The walk is in lexical order (WalkDir does not descend into
	// symlinked directories, which is the canonical order we want); the
	// lines are computed by a few workers, since hashing every file is
	// most of a digest's time and independent per file, and written in
	// the walk's order.
	type entry struct {
		path, rel string
		line      string
		size      int64
		err       error
		done      chan struct{}
	}
	stop := make(chan struct{})
	defer close(stop)
	order := make(chan *entry, 256) // to the writer, in walk order
	todo := make(chan *entry, 256)  // to the workers
	var walkErr error
	go func() {
		defer close(todo)
		defer close(order)
		walkErr = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return fmt.Errorf("walk %s: %w", path, err)
			}
			rel, err := filepath.Rel(root, path)
			if err != nil {
				return fmt.Errorf("relative path of %s: %w", path, err)
			}
			e := &entry{path: path, rel: filepath.ToSlash(rel), done: make(chan struct{})}
			// order first: an entry the writer waits for is always
			// already queued for a worker.
			for _, ch := range []chan *entry{order, todo} {
				select {
				case ch <- e:
				case <-stop:
					return fs.SkipAll
				}
			}
			return nil
		})
	}()
	workers := min(runtime.GOMAXPROCS(0), 8)
	for range workers {
		go func() {
			for e := range todo {
				e.line, e.size, e.err = listingLine(e.path, e.rel, sums)
				close(e.done)
			}
		}()
	}
	bw := bufio.NewWriter(w)
	var total int64
	for e := range order {
		<-e.done
		if e.err != nil {
			return 0, fmt.Errorf("list tree %s: %w", root, e.err)
		}
		total += e.size
		if _, err := bw.WriteString(e.line); err != nil {
			return 0, fmt.Errorf("list tree %s: %w", root, err)
		}
	}
	// order is closed: the walk has ended and walkErr is set.
	if walkErr != nil {
		return 0, fmt.Errorf("list tree %s: %w", root, walkErr)
	}
	if err := bw.Flush(); err != nil {
		return 0, fmt.Errorf("list tree %s: %w", root, err)
	}
	return total, nil
}

// listingLine returns the canonical line for one entry and its content
// size; sums (nil: none) may know a regular file's hash.
func listingLine(path, rel string, sums *fileSums) (string, int64, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return "", 0, fmt.Errorf("lstat %s: %w", path, err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return "", 0, fmt.Errorf("lstat %s: no unix stat data", path)
	}
	var (
		typ     string
		size    int64
		payload = "-"
	)
	switch st.Mode & syscall.S_IFMT {
	case syscall.S_IFDIR:
		typ = "d"
	case syscall.S_IFREG:
		typ = "f"
		size = st.Size
		sum, ok := sums.lookup(st)
		if !ok {
			if sum, err = hashRegular(path, st); err != nil {
				return "", 0, err
			}
		}
		payload = sum
	case syscall.S_IFLNK:
		typ = "l"
		target, err := os.Readlink(path)
		if err != nil {
			return "", 0, fmt.Errorf("readlink %s: %w", path, err)
		}
		payload = strconv.Quote(target)
	case syscall.S_IFCHR, syscall.S_IFBLK:
		typ = "c"
		if st.Mode&syscall.S_IFMT == syscall.S_IFBLK {
			typ = "b"
		}
		payload = fmt.Sprintf("%d:%d", devMajor(st.Rdev), devMinor(st.Rdev))
	case syscall.S_IFIFO:
		typ = "p"
	case syscall.S_IFSOCK:
		typ = "s"
	default:
		return "", 0, fmt.Errorf("lstat %s: unknown file type %o", path, st.Mode&syscall.S_IFMT)
	}
	// Linux allows only trusted.* and security.* xattrs on symlinks, and
	// the stdlib xattr calls follow links, so links contribute none.
	xattrs := ""
	if typ != "l" {
		if xattrs, err = listXattrs(path); err != nil {
			return "", 0, err
		}
	}
	line := fmt.Sprintf("%s %s %04o %d %d %d %s%s\n",
		strconv.Quote(rel), typ, st.Mode&0o7777, st.Uid, st.Gid, size, payload, xattrs)
	return line, size, nil
}

// hashRegular returns the hex sha256 of a regular file's content. It opens
// with O_NOFOLLOW and checks the descriptor is still the inode we lstat'ed,
// so a path swapped for a symlink between the two calls is an error rather
// than a silent hash of something else.
func hashRegular(path string, want *syscall.Stat_t) (string, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return "", fmt.Errorf("open %s: %w", path, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", fmt.Errorf("fstat %s: %w", path, err)
	}
	got, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || got.Ino != want.Ino || got.Dev != want.Dev || !fi.Mode().IsRegular() {
		return "", fmt.Errorf("hash %s: file changed while hashing", path)
	}
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// listXattrs returns " xattr=<name>:<hex value>,..." for the entry's extended
// attributes, sorted, or "" when it has none. File capabilities
// (security.capability) are privileges just like setuid bits, so they must
// change the digest. security.selinux is skipped: the host's labelling
// policy assigns it, not the image, and it would make the same tree hash
// differently on differently configured hosts.
func listXattrs(path string) (string, error) {
	names, err := listxattrNames(path)
	if err != nil {
		return "", err
	}
	var parts []string
	for _, name := range names {
		if name == "security.selinux" {
			continue
		}
		val, err := getxattr(path, name)
		if err != nil {
			return "", err
		}
		parts = append(parts, strconv.Quote(name)+":"+hex.EncodeToString(val))
	}
	if len(parts) == 0 {
		return "", nil
	}
	sort.Strings(parts)
	return " xattr=" + strings.Join(parts, ","), nil
}

// listxattrNames lists extended attribute names of a non-symlink. The
// syscall package's calls follow symlinks, so callers must never pass one:
// the walk only hands us paths whose directories are real (WalkDir does not
// descend links) and whose last component we just lstat'ed.
func listxattrNames(path string) ([]string, error) {
	for {
		size, err := syscall.Listxattr(path, nil)
		if err != nil {
			if errors.Is(err, syscall.ENOTSUP) {
				return nil, nil // filesystem without xattrs: nothing to hash
			}
			return nil, fmt.Errorf("list xattrs of %s: %w", path, err)
		}
		if size == 0 {
			return nil, nil
		}
		buf := make([]byte, size)
		size, err = syscall.Listxattr(path, buf)
		if errors.Is(err, syscall.ERANGE) {
			continue // grew between the two calls
		}
		if err != nil {
			return nil, fmt.Errorf("list xattrs of %s: %w", path, err)
		}
		var names []string
		for _, n := range strings.Split(string(buf[:size]), "\x00") {
			if n != "" {
				names = append(names, n)
			}
		}
		return names, nil
	}
}

// getxattr reads one extended attribute of a non-symlink (see
// listxattrNames).
func getxattr(path, name string) ([]byte, error) {
	for {
		size, err := syscall.Getxattr(path, name, nil)
		if err != nil {
			return nil, fmt.Errorf("read xattr %s of %s: %w", name, path, err)
		}
		buf := make([]byte, size)
		size, err = syscall.Getxattr(path, name, buf)
		if errors.Is(err, syscall.ERANGE) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read xattr %s of %s: %w", name, path, err)
		}
		return buf[:size], nil
	}
}

// devMajor and devMinor decode Linux's dev_t (glibc's gnu_dev_major/minor).
func devMajor(dev uint64) uint64 { return (dev>>8)&0xfff | (dev>>32)&0xfffff000 }
func devMinor(dev uint64) uint64 { return dev&0xff | (dev>>12)&0xffffff00 }
