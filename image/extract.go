package image

import (
	"archive/tar"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"syscall"
)

// This file applies one image layer (a tar stream) to a root tree. It is
// Moat's own code, not a library's, because every line of it faces hostile
// input: an imported image is whatever its author wanted it to be. The rules:
//
//   - Every path is resolved beneath the root through an os.Root, and every
//     parent directory is lstat'ed first and must be a real directory: a
//     symlink in a parent is refused, never followed, even when it would
//     resolve inside the tree (CVE-2018-15664-style races and
//     CVE-2019-14271 show what following in-tree links while writing leads
//     to).
//   - Names with a ".." component, absolute names and names with NUL are
//     refused: there is no legitimate reason for them in a layer.
//   - Hard links may only name an entry already extracted inside the root,
//     and only a regular file.
//   - Every file and link is created exclusively (O_EXCL, symlinkat,
//     linkat); whatever is already at its name is removed first, so nothing
//     is ever written through a link or into a hard-linked inode. Only a
//     directory entry merges into a directory already there.
//   - Device nodes, FIFOs and sockets are dropped; setuid, setgid and all
//     xattrs (security.capability among them) are never applied.
//   - Bytes are counted as they are written, not as headers declare, so a
//     decompression bomb or a sparse file stops at the cap.

// ErrBadImage marks an import refused because of its input: a malformed or
// hostile archive, an entry that would escape the root, a cap exceeded.
// Callers map it to "bad input" (the CLI's exit 2).
var ErrBadImage = errors.New("image refused")

// whiteout prefixes from the OCI image spec (layer.md, "Whiteouts").
const (
	whiteoutPrefix = ".wh."
	opaqueWhiteout = ".wh..wh..opq"
)

// extractBudget is what the whole import may still write. It is shared by
// all layers: the caps are on the image, not per layer.
type extractBudget struct {
	bytesLeft int64
	filesLeft int64
	maxBytes  int64
	maxFiles  int64
}

// layerState is what one layer's application needs to remember.
type layerState struct {
	root    *os.Root
	label   string // names the layer in errors, e.g. "layer 2 (sha256:ab…)"
	budget  *extractBudget
	written map[string]bool // paths this layer created; opaque dirs keep them
	// dirModes are the modes directories get once all layers are applied:
	// while extracting, directories stay writable by their owner so a
	// later entry (or layer) can land in a directory the image marks 0555.
	dirModes map[string]fs.FileMode
	dropped  int // special files dropped
	// cwdPath is the directory the previous entry went into ("" for the
	// root; valid while haveCwd), and chain holds it and each directory
	// above it, open beneath the root: chain[i] is the directory of
	// cwdParts[:i+1]. A tar stream lists a directory's entries together,
	// then a subdirectory's, then goes back up, and every os.Root call on
	// a deep path walks it from the root again (an openat and a close per
	// component, for the check of each parent as well): resolving an
	// entry from its parent's handle, and a parent from the nearest
	// directory the chain already holds, is what keeps the import near
	// tar -x. An entry only removes what lies in its parent, the chain's
	// last directory, never a directory of the chain: an entry that
	// replaces one of them has its parent higher up, and switching to
	// that parent has closed the handles below it first. Whiteouts
	// forget the chain all the same.
	cwdPath  string
	cwdParts []string
	chain    []*os.Root
	haveCwd  bool
	// sums remembers each regular file's sha256, hash computes it
	// (filesums.go).
	sums *fileSums
	hash hash.Hash
	// wb starts each written file's writeback and closes it
	// (writeback.go).
	wb *writeback
	// buf carries every regular file's bytes, sum its hash.
	buf []byte
	sum [sha256.Size]byte
	// root0: we run as root and give entries the layer's owners.
	root0 bool
}

// entryError names the layer and the entry, as the issue asks, and marks
// the error as bad input.
func (l *layerState) entryError(name, format string, args ...any) error {
	return fmt.Errorf("%w: %s: entry %q: %s", ErrBadImage, l.label, name, fmt.Sprintf(format, args...))
}

// extractLayer applies the tar stream r to root. dirModes collects the
// final directory modes across layers (see applyDirModes), sums (nil:
// none) the regular files' hashes.
func extractLayer(root *os.Root, r io.Reader, label string, budget *extractBudget, dirModes map[string]fs.FileMode, sums *fileSums) (dropped int, err error) {
	l := &layerState{root: root, label: label, budget: budget, written: map[string]bool{}, dirModes: dirModes, sums: sums, hash: sha256.New(), wb: newWriteback(), buf: make([]byte, 128<<10), root0: os.Geteuid() == 0}
	defer l.forget()
	defer func() {
		// Every file is closed before the next layer (or finalize)
		// touches the tree.
		if werr := l.wb.wait(); werr != nil && err == nil {
			err = fmt.Errorf("%s: %w", label, werr)
		}
	}()
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return l.dropped, nil
		}
		if err != nil {
			return l.dropped, fmt.Errorf("%w: %s: read tar: %v", ErrBadImage, label, err)
		}
		if err := l.apply(hdr, tr); err != nil {
			return l.dropped, err
		}
	}
}

// cleanName turns a tar entry name into a slash-separated path relative to
// the root, "" for the root itself, or an error for names that try to leave
// it.
func cleanName(name string) (string, error) {
	if strings.IndexByte(name, 0) >= 0 {
		return "", errors.New("name contains NUL")
	}
	if strings.HasPrefix(name, "/") {
		return "", errors.New("absolute name; layer entries must be relative to the image root")
	}
	for _, part := range strings.Split(name, "/") {
		if part == ".." {
			return "", errors.New(`name has a ".." component, which would leave the image root`)
		}
	}
	p := path.Clean(name)
	if p == "." {
		return "", nil
	}
	return p, nil
}

// apply applies one tar entry.
func (l *layerState) apply(hdr *tar.Header, body io.Reader) error {
	name, err := cleanName(hdr.Name)
	if err != nil {
		return l.entryError(hdr.Name, "%v", err)
	}
	if name == "" {
		return nil // the root itself ("./"): its mode is finalize's business
	}
	dir, base := parentOf(name), path.Base(name)

	// Whiteouts delete what lower layers put there; they are not files.
	if base == opaqueWhiteout {
		if _, err := l.dir(hdr.Name, dir); err != nil {
			return err
		}
		l.forget()
		return l.opaque(hdr.Name, dir)
	}
	if strings.HasPrefix(base, whiteoutPrefix) {
		if _, err := l.dir(hdr.Name, dir); err != nil {
			return err
		}
		l.forget()
		hidden := strings.TrimPrefix(base, whiteoutPrefix)
		if hidden == "" || hidden == "." || hidden == ".." {
			return l.entryError(hdr.Name, "whiteout names no entry")
		}
		victim := path.Join(dir, hidden)
		if err := l.root.RemoveAll(victim); err != nil {
			return l.entryError(hdr.Name, "apply whiteout: %v", err)
		}
		return nil
	}

	switch hdr.Typeflag {
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		// An image is files; the sandbox brings its own /dev.
		l.dropped++
		return nil
	case tar.TypeDir, tar.TypeReg, tar.TypeSymlink, tar.TypeLink:
	case tar.TypeGNUSparse:
		// A GNU sparse file (tar --sparse): archive/tar reads it as a
		// regular file with its holes filled with zeros, so it is written
		// as one, and a sparse bomb meets the byte cap like any other
		// (PAX sparse files arrive as TypeReg already).
	default:
		// Sockets cannot be archived by tar; anything else (GNU volume
		// headers, unknown vendor types) has no place in a layer.
		return l.entryError(hdr.Name, "unsupported tar entry type %q", hdr.Typeflag)
	}
	if l.budget.filesLeft <= 0 {
		return l.entryError(hdr.Name, "image has more than %d files; raise the cap (ImportOptions.MaxFiles, --max-files) if it is genuine", l.budget.maxFiles)
	}
	l.budget.filesLeft--
	// d is the entry's parent directory: every call below names base in
	// it, one path component, instead of name from the root.
	d, err := l.dir(hdr.Name, dir)
	if err != nil {
		return err
	}

	// Only the permission bits and the sticky bit: setuid and setgid are
	// privileges an imported image does not get to grant.
	mode := fs.FileMode(hdr.Mode) & fs.ModePerm
	if hdr.Mode&0o1000 != 0 {
		mode |= fs.ModeSticky
	}

	if hdr.Typeflag == tar.TypeDir {
		fi, err := d.Lstat(base)
		switch {
		case err == nil && fi.IsDir():
			// Merge into the existing directory, as layers do.
		case err == nil || !errors.Is(err, fs.ErrNotExist):
			if err := l.replace(hdr.Name, d, base); err != nil {
				return err
			}
			fallthrough
		default:
			if err := d.Mkdir(base, 0o700); err != nil {
				return l.entryError(hdr.Name, "mkdir: %v", err)
			}
		}
		if err := d.Chmod(base, mode|0o700); err != nil {
			return l.entryError(hdr.Name, "chmod: %v", err)
		}
		l.dirModes[name] = mode
		l.written[name] = true
		return l.chown(hdr, d, base)
	}

	l.written[name] = true
	switch hdr.Typeflag {
	case tar.TypeSymlink:
		// The target is only a string stored in the tree: absolute or not,
		// it is resolved inside the sandbox's own root at run time, and
		// this code never writes through it.
		if err := l.create(hdr.Name, d, base, "symlink", func() error { return d.Symlink(hdr.Linkname, base) }); err != nil {
			return err
		}
		return l.chown(hdr, d, base)
	case tar.TypeLink:
		if err := l.replace(hdr.Name, d, base); err != nil {
			return err
		}
		target, err := cleanName(hdr.Linkname)
		if err != nil || target == "" {
			return l.entryError(hdr.Name, "hard link to %q: outside the image root or not a file", hdr.Linkname)
		}
		// This switches the chain to the target's directory (d may be
		// closed): the link itself is made from the root, both names
		// now known to lie under real directories.
		if _, err := l.dir(hdr.Name, parentOf(target)); err != nil {
			return err
		}
		fi, err := l.root.Lstat(target)
		if err != nil || !fi.Mode().IsRegular() {
			return l.entryError(hdr.Name, "hard link to %q: the target must be a regular file extracted earlier in the image", hdr.Linkname)
		}
		if err := l.root.Link(target, name); err != nil {
			return l.entryError(hdr.Name, "hard link: %v", err)
		}
		return nil
	}

	// A regular file, created with its mode less any write bit for
	// group and others (the umask may take more), so that no one but
	// its creator can write it while it is written; fill gives it its
	// exact mode after.
	var f *os.File
	err = l.create(hdr.Name, d, base, "create", func() (err error) {
		f, err = d.OpenFile(base, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode.Perm()&0o755)
		return err
	})
	if err != nil {
		return err
	}
	if err := l.fill(hdr, f, mode, body); err != nil {
		f.Close()
		return err
	}
	l.wb.add(f)
	return nil
}

// create runs mk (what names it in errors), which must create base in d
// exclusively: O_EXCL or symlinkat, failing with EEXIST whatever is there,
// a symlink included, never following it. If something is there (a lower
// layer's entry, or an earlier one of this layer) it is removed (replace)
// and mk runs again. Trying the create first spares a lookup of every new
// name, most of a layer's.
func (l *layerState) create(entry string, d *os.Root, base, what string, mk func() error) error {
	err := mk()
	if errors.Is(err, fs.ErrExist) {
		if err := l.replace(entry, d, base); err != nil {
			return err
		}
		err = mk()
	}
	if err != nil {
		return l.entryError(entry, "%s: %v", what, err)
	}
	return nil
}

// fill writes a regular file's content to f (just created), gives it its
// mode and owner, and remembers the content's sha256 for the tree digest
// (filesums.go): the bytes pass through here anyway, and the digest then
// need not read them back. Mode and owner are changed through f, not by
// name, and only where the fstat of the written file shows they differ:
// most files of an image already have the mode they were created with and
// root's owner, and an import of ten thousand files would otherwise spend
// two path lookups and two inode updates on each.
func (l *layerState) fill(hdr *tar.Header, f *os.File, mode fs.FileMode, body io.Reader) error {
	// Read one byte more than the budget allows: if it arrives, the cap is
	// exceeded, whatever the header claimed. One buffer serves every file
	// (io.Copy into an *os.File would allocate one per file, and a
	// collection every few hundred files).
	l.hash.Reset()
	src := io.TeeReader(io.LimitReader(body, l.budget.bytesLeft+1), l.hash)
	n, err := io.CopyBuffer(writerOnly{f}, src, l.buf)
	l.budget.bytesLeft -= n
	if l.budget.bytesLeft < 0 {
		return l.entryError(hdr.Name, "image is larger than %d bytes extracted; raise the cap (ImportOptions.MaxBytes, --max-bytes) if it is genuine", l.budget.maxBytes)
	}
	if err != nil {
		return l.entryError(hdr.Name, "write: %v", err)
	}
	uid, gid, err := l.owner(hdr)
	if err != nil {
		return err
	}
	st, err := fstat(f)
	if err != nil {
		return l.entryError(hdr.Name, "%v", err)
	}
	changed := false
	if fs.FileMode(st.Mode&0o777) != mode.Perm() || (st.Mode&syscall.S_ISVTX != 0) != (mode&fs.ModeSticky != 0) || st.Mode&(syscall.S_ISUID|syscall.S_ISGID) != 0 {
		if err := f.Chmod(mode); err != nil {
			return l.entryError(hdr.Name, "chmod: %v", err)
		}
		changed = true
	}
	if uid >= 0 && (int(st.Uid) != uid || int(st.Gid) != gid) {
		if err := f.Chown(uid, gid); err != nil {
			return l.entryError(hdr.Name, "chown: %v", err)
		}
		changed = true
	}
	if changed {
		// The record holds the ctime of the file's last change.
		if st, err = fstat(f); err != nil {
			return l.entryError(hdr.Name, "%v", err)
		}
	}
	l.sums.remember(st, l.hash.Sum(l.sum[:0]))
	return nil
}

// writerOnly hides an *os.File's ReadFrom, so io.CopyBuffer uses the
// buffer it is given.
type writerOnly struct{ io.Writer }

// dir returns the directory dir (a slash path relative to the root, ""
// for the root itself) open beneath the root, after making sure each of
// its components exists as a real directory: missing ones are created
// (0755, as OCI runtimes do), and a symlink is refused rather than
// followed. os.Root would already keep a resolution inside the tree; this
// check is stricter: the image decides where its links point. The
// components dir shares with the previous entry's directory are taken
// from the chain (see layerState.cwdPath), checked when they were opened;
// the rest are checked and opened now.
func (l *layerState) dir(entry, dir string) (*os.Root, error) {
	if l.haveCwd && l.cwdPath == dir {
		return l.cwd(), nil
	}
	var parts []string
	if dir != "" {
		parts = strings.Split(dir, "/")
	}
	keep := 0
	if l.haveCwd {
		for keep < len(l.chain) && keep < len(parts) && l.cwdParts[keep] == parts[keep] {
			keep++
		}
	}
	for _, d := range l.chain[keep:] {
		d.Close()
	}
	l.chain = l.chain[:keep]
	// Until the walk below succeeds, the chain names no directory.
	l.haveCwd, l.cwdParts = false, parts[:keep]
	d := l.cwd()
	cur := strings.Join(parts[:keep], "/")
	for _, p := range parts[keep:] {
		cur = path.Join(cur, p)
		fi, err := d.Lstat(p)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			if l.budget.filesLeft <= 0 {
				l.forget()
				return nil, l.entryError(entry, "image has more than %d files; raise the cap (ImportOptions.MaxFiles, --max-files) if it is genuine", l.budget.maxFiles)
			}
			l.budget.filesLeft--
			if err := d.Mkdir(p, 0o755); err != nil {
				l.forget()
				return nil, l.entryError(entry, "create parent %s: %v", cur, err)
			}
		case err != nil:
			l.forget()
			return nil, l.entryError(entry, "parent %s: %v", cur, err)
		case fi.Mode()&fs.ModeSymlink != 0:
			l.forget()
			return nil, l.entryError(entry, "parent %s is a symlink; refusing to write through it", cur)
		case !fi.IsDir():
			l.forget()
			return nil, l.entryError(entry, "parent %s is not a directory", cur)
		}
		next, err := d.OpenRoot(p)
		if err != nil {
			l.forget()
			return nil, l.entryError(entry, "parent %s: %v", cur, err)
		}
		l.chain = append(l.chain, next)
		d = next
	}
	l.cwdPath, l.cwdParts, l.haveCwd = dir, parts, true
	return d, nil
}

// cwd is the chain's last directory, the root when it holds none.
func (l *layerState) cwd() *os.Root {
	if len(l.chain) == 0 {
		return l.root
	}
	return l.chain[len(l.chain)-1]
}

// forget closes the chain of directory handles (see layerState.cwdPath).
func (l *layerState) forget() {
	for _, d := range l.chain {
		d.Close()
	}
	l.chain, l.cwdParts, l.cwdPath, l.haveCwd = nil, nil, "", false
}

// parentOf is name's directory, "" for an entry at the root.
func parentOf(name string) string {
	dir, _ := path.Split(name)
	return strings.TrimSuffix(dir, "/")
}

// replace removes whatever is at base in d (a lower layer's file, link or
// directory) so the new entry is created afresh. RemoveAll does not follow
// a link in its last component. What it removes lies inside d, so d (the
// chain's last directory) and the chain stay valid.
func (l *layerState) replace(entry string, d *os.Root, base string) error {
	if _, err := d.Lstat(base); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err := d.RemoveAll(base); err != nil {
		return l.entryError(entry, "replace existing entry: %v", err)
	}
	return nil
}

// opaque removes everything in dir that this layer did not create: the
// directory hides all lower-layer content (OCI's ".wh..wh..opq").
func (l *layerState) opaque(entry, dir string) error {
	target := dir
	if target == "" {
		target = "."
	}
	fi, err := l.root.Lstat(target)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil || !fi.IsDir() {
		return l.entryError(entry, "opaque whiteout in %q, which is not a directory", dir)
	}
	d, err := l.root.Open(target)
	if err != nil {
		return l.entryError(entry, "opaque whiteout: %v", err)
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return l.entryError(entry, "opaque whiteout: %v", err)
	}
	for _, n := range names {
		p := path.Join(dir, n)
		if !l.written[p] {
			if err := l.root.RemoveAll(p); err != nil {
				return l.entryError(entry, "opaque whiteout: %v", err)
			}
			continue
		}
		if fi, err := l.root.Lstat(p); err == nil && fi.IsDir() {
			// Written by this layer, but a lower layer may have put
			// entries inside it before this layer merged into it.
			if err := l.opaque(entry, p); err != nil {
				return err
			}
		}
	}
	return nil
}

// chown gives the entry the owner the layer names, when we can (root). The
// image is mounted read-only and runs as the sandbox user, so ownership
// grants nothing; it is kept so tools that check it (ssh, sudo-like
// programs) see what the image's author intended.
func (l *layerState) chown(hdr *tar.Header, d *os.Root, base string) error {
	uid, gid, err := l.owner(hdr)
	if err != nil || uid < 0 {
		return err
	}
	if err := d.Lchown(base, uid, gid); err != nil {
		return l.entryError(hdr.Name, "chown: %v", err)
	}
	return nil
}

// owner is the owner hdr names, or -1, -1 when we cannot give it (not
// root).
func (l *layerState) owner(hdr *tar.Header) (uid, gid int, err error) {
	if !l.root0 {
		return -1, -1, nil
	}
	if hdr.Uid < 0 || hdr.Gid < 0 || hdr.Uid > 1<<31-2 || hdr.Gid > 1<<31-2 {
		return -1, -1, l.entryError(hdr.Name, "owner %d:%d out of range", hdr.Uid, hdr.Gid)
	}
	return hdr.Uid, hdr.Gid, nil
}

// applyDirModes gives directories their final modes once every layer is
// applied. Directories a later layer removed are skipped.
func applyDirModes(root *os.Root, dirModes map[string]fs.FileMode) error {
	for name, mode := range dirModes {
		fi, err := root.Lstat(name)
		if errors.Is(err, fs.ErrNotExist) || (err == nil && !fi.IsDir()) {
			continue
		}
		if err != nil {
			return fmt.Errorf("directory mode of %s: %w", name, err)
		}
		if err := root.Chmod(name, mode); err != nil {
			return fmt.Errorf("directory mode of %s: %w", name, err)
		}
	}
	return nil
}
