package workspace

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/manifest"
)

// Entry is one path of a Snapshot.
type Entry struct {
	// Type is "file", "dir" or "symlink" (as in result.FileChange).
	Type string
	// Size is a regular file's length, a symlink's target length, 0 for a
	// directory.
	Size int64
	// Mode is the permission bits plus setuid/setgid/sticky (mode & 07777).
	Mode uint32
	// SHA256 is the hex digest of a regular file's content. In a Diff it is
	// empty when the file could not be hashed within DiffLimits.MaxHashBytes.
	SHA256 string
	// Target is a symlink's target.
	Target string
}

// Snapshot is the state of the workspace right after copy-in, used for the
// diff. Paths are relative to the workspace and use forward slashes.
type Snapshot struct {
	entries map[string]Entry
}

// Len returns the number of entries in s.
func (s *Snapshot) Len() int { return len(s.entries) }

// Lookup returns the entry at path p.
func (s *Snapshot) Lookup(p string) (Entry, bool) {
	e, ok := s.entries[p]
	return e, ok
}

// Paths returns every path of s, sorted.
func (s *Snapshot) Paths() []string {
	ps := make([]string, 0, len(s.entries))
	for p := range s.entries {
		ps = append(ps, p)
	}
	sort.Strings(ps)
	return ps
}

// CopyIn copies each input (Src absolute host path, Dst relative path under
// the workspace) into the workspace root at wsDir, chowns everything to
// owner, and returns the snapshot. Inputs are copied, never linked or
// mounted.
//
// Rules:
//   - The workspace must be empty (ErrWorkspaceNotEmpty otherwise).
//   - Src must be absolute and must not itself be a symlink: the user names
//     the real path. Following a top-level link would make what is copied
//     depend on a link the manifest does not show.
//   - A directory is copied recursively. Regular files, directories and
//     symlinks only; a FIFO, socket or device is an error naming the path.
//   - A symlink is copied as a symlink only if it resolves inside its input
//     root (resolution follows links within the input, like the kernel
//     would; an absolute target counts as outside). Otherwise it is an error
//     naming the path and the target.
//   - Hardlinks become independent copies. Setuid, setgid and sticky bits
//     are stripped; other permission bits are kept.
//   - lim.Bytes and lim.Files bound the total (a *LimitError naming
//     workspace.size or workspace.files). Parent directories created for a
//     Dst count as files.
//
// On error the workspace holds a partial copy: the caller discards the
// sandbox.
func CopyIn(wsDir string, inputs []manifest.Input, owner Owner, lim Limits) (*Snapshot, error) {
	lim = lim.withDefaults()
	if owner.UID < 0 || owner.GID < 0 {
		return nil, fmt.Errorf("copy-in: invalid owner %d:%d", owner.UID, owner.GID)
	}
	root, err := os.OpenRoot(wsDir)
	if err != nil {
		return nil, fmt.Errorf("copy-in: open workspace: %w", err)
	}
	defer root.Close()
	if err := checkEmpty(root); err != nil {
		return nil, fmt.Errorf("copy-in: %s: %w", wsDir, err)
	}
	c := &copier{root: root, owner: owner, lim: lim, snap: &Snapshot{entries: map[string]Entry{}}, buf: make([]byte, 128<<10)}
	for i, in := range inputs {
		if err := c.input(i, in); err != nil {
			return nil, fmt.Errorf("copy-in: %w", err)
		}
	}
	return c.snap, nil
}

func checkEmpty(root *os.Root) error {
	d, err := root.Open(".")
	if err != nil {
		return err
	}
	defer d.Close()
	empty, err := isEmpty(d)
	if err != nil {
		return err
	}
	if !empty {
		return ErrWorkspaceNotEmpty
	}
	return nil
}

type copier struct {
	root  *os.Root
	owner Owner
	lim   Limits
	snap  *Snapshot
	bytes int64
	files int
	buf   []byte
}

// cleanDst validates an input's Dst: relative, beneath the workspace.
func cleanDst(dst string) (string, error) {
	if dst == "" {
		return "", errors.New("is empty")
	}
	if strings.IndexByte(dst, 0) >= 0 {
		return "", errors.New("contains a NUL byte")
	}
	if path.IsAbs(dst) {
		return "", errors.New("must be relative to /workspace")
	}
	d := path.Clean(dst)
	if d == "." || d == ".." || strings.HasPrefix(d, "../") {
		return "", errors.New("must name a path beneath /workspace")
	}
	if _, err := splitRel(d); err != nil {
		return "", err
	}
	return d, nil
}

func (c *copier) input(i int, in manifest.Input) error {
	if !filepath.IsAbs(in.Src) {
		return fmt.Errorf("inputs[%d].src %q is not absolute: relative sources are resolved when the manifest is loaded", i, in.Src)
	}
	src := filepath.Clean(in.Src)
	dst, err := cleanDst(in.Dst)
	if err != nil {
		return fmt.Errorf("inputs[%d].dst %q %v", i, in.Dst, err)
	}
	fi, err := os.Lstat(src)
	if err != nil {
		return fmt.Errorf("inputs[%d].src: %w", i, err)
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		return fmt.Errorf("inputs[%d].src %q is a symlink: name the path it points to (top-level symlinks are not followed)", i, src)
	}
	if err := c.makeParents(dst); err != nil {
		return fmt.Errorf("inputs[%d].dst %q: %w", i, dst, err)
	}
	if _, err := c.root.Lstat(dst); err == nil {
		return fmt.Errorf("inputs[%d].dst %q already exists in the workspace (two inputs overlap)", i, dst)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("inputs[%d].dst %q: %w", i, dst, err)
	}

	// O_NOFOLLOW: if Src became a symlink since the Lstat, refuse.
	fd, err := openat(unix.AT_FDCWD, src, fileFlags)
	if err != nil {
		return fmt.Errorf("inputs[%d].src %q: %w", i, src, err)
	}
	st, err := fstat(fd)
	if err != nil {
		unix.Close(fd)
		return fmt.Errorf("inputs[%d].src %q: %w", i, src, err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		t := &srcTree{rootfd: fd, dev: st.Dev, display: src}
		defer unix.Close(fd)
		return c.dir(t, fd, nil, dst, st)
	case unix.S_IFREG:
		f := os.NewFile(uintptr(fd), src)
		defer f.Close()
		return c.file(f, st, src, dst)
	default:
		unix.Close(fd)
		return fmt.Errorf("inputs[%d].src %q is a %s: only regular files, directories and symlinks can be inputs", i, src, describeType(st.Mode))
	}
}

// makeParents creates the missing directories above dst, each checked to be
// a real directory (an earlier input may have put a symlink there).
func (c *copier) makeParents(dst string) error {
	comps := strings.Split(dst, "/")
	for i := 1; i < len(comps); i++ {
		p := strings.Join(comps[:i], "/")
		fi, err := c.root.Lstat(p)
		if err == nil {
			if !fi.IsDir() {
				return fmt.Errorf("parent %q exists and is not a directory", p)
			}
			continue
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		if err := c.count(p); err != nil {
			return err
		}
		if err := c.root.Mkdir(p, 0o700); err != nil {
			return err
		}
		if err := c.finishDir(p, 0o755); err != nil {
			return err
		}
	}
	return nil
}

func (c *copier) count(p string) error {
	if c.files >= c.lim.Files {
		return &LimitError{Field: "workspace.files", Limit: int64(c.lim.Files), Kind: "files",
			Detail: fmt.Sprintf("inputs need more than %d files and directories (at %q); raise workspace.files in the manifest or copy fewer inputs", c.lim.Files, p)}
	}
	c.files++
	return nil
}

// finishDir sets a directory's owner and final mode through an fd, and
// records it.
func (c *copier) finishDir(p string, mode uint32) error {
	d, err := c.root.OpenFile(p, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Chown(c.owner.UID, c.owner.GID); err != nil {
		return err
	}
	if err := d.Chmod(fs.FileMode(mode)); err != nil {
		return err
	}
	c.snap.entries[p] = Entry{Type: "dir", Mode: mode}
	return nil
}

// srcTree is one input directory being copied.
type srcTree struct {
	rootfd  int
	dev     uint64
	display string // host path, for messages
}

func (t *srcTree) show(rel []string) string {
	return filepath.Join(append([]string{t.display}, rel...)...)
}

// dir copies the source directory open at fd (rel beneath the input root)
// to dst, then its entries, then sets its mode (last, so a read-only
// directory can still be filled).
func (c *copier) dir(t *srcTree, fd int, rel []string, dst string, st unix.Stat_t) error {
	if err := c.count(dst); err != nil {
		return err
	}
	if err := c.root.Mkdir(dst, 0o700); err != nil {
		return err
	}
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return err
	}
	d := os.NewFile(uintptr(dup), t.show(rel))
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return fmt.Errorf("read %s: %w", t.show(rel), err)
	}
	sort.Strings(names)
	for _, name := range names {
		crel := append(rel[:len(rel):len(rel)], name)
		cdst := dst + "/" + name
		cst, err := lstatat(fd, name)
		if errors.Is(err, unix.ENOENT) {
			continue // removed while we copy: the user's own tree, not an attack
		}
		if err != nil {
			return fmt.Errorf("stat %s: %w", t.show(crel), err)
		}
		switch cst.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			cfd, err := openat(fd, name, dirFlags)
			if err != nil {
				return fmt.Errorf("open %s: %w", t.show(crel), err)
			}
			ost, err := fstat(cfd)
			if err == nil && (ost.Dev != cst.Dev || ost.Ino != cst.Ino) {
				err = errors.New("was replaced while being opened")
			}
			if err == nil {
				err = c.dir(t, cfd, crel, cdst, ost)
			}
			unix.Close(cfd)
			if err != nil {
				return err
			}
		case unix.S_IFREG:
			f, ost, err := openRegular(fd, name, &cst)
			if err != nil {
				return fmt.Errorf("open %s: %w", t.show(crel), err)
			}
			err = c.file(f, ost, t.show(crel), cdst)
			f.Close()
			if err != nil {
				return err
			}
		case unix.S_IFLNK:
			if err := c.symlink(t, fd, rel, name, cdst); err != nil {
				return err
			}
		default:
			return fmt.Errorf("%s is a %s: only regular files, directories and symlinks can be inputs", t.show(crel), describeType(cst.Mode))
		}
	}
	return c.finishDir(dst, st.Mode&0o777)
}

// file copies one regular file, hashing it in the same pass.
func (c *copier) file(src *os.File, st unix.Stat_t, show, dst string) error {
	if err := c.count(dst); err != nil {
		return err
	}
	budget := c.lim.Bytes - c.bytes
	if st.Size > budget {
		return c.bytesErr(show)
	}
	out, err := c.root.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	defer out.Close()
	h := sha256.New()
	// Read at most one byte past the budget: a file growing while we copy
	// is caught without reading it all.
	n, err := io.CopyBuffer(io.MultiWriter(out, h), io.LimitReader(src, budget+1), c.buf)
	if err != nil {
		return fmt.Errorf("copy %s: %w", show, err)
	}
	if n > budget {
		return c.bytesErr(show)
	}
	c.bytes += n
	// chown before chmod: chown clears setuid bits anyway, and the final
	// mode never has them (stripped so an input cannot become a setuid
	// binary for the sandbox user).
	if err := out.Chown(c.owner.UID, c.owner.GID); err != nil {
		return err
	}
	mode := st.Mode & 0o777
	if err := out.Chmod(fs.FileMode(mode)); err != nil {
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	c.snap.entries[dst] = Entry{Type: "file", Size: n, Mode: mode, SHA256: hex.EncodeToString(h.Sum(nil))}
	return nil
}

func (c *copier) bytesErr(show string) error {
	return &LimitError{Field: "workspace.size", Limit: c.lim.Bytes, Kind: "disk",
		Detail: fmt.Sprintf("inputs need more than %d bytes (at %s); raise workspace.size in the manifest or copy fewer inputs", c.lim.Bytes, show)}
}

func (c *copier) symlink(t *srcTree, dirfd int, rel []string, name, dst string) error {
	show := t.show(append(rel[:len(rel):len(rel)], name))
	target, err := readlinkat(dirfd, name)
	if err != nil {
		return fmt.Errorf("readlink %s: %w", show, err)
	}
	inside, err := t.resolvesInside(rel, target)
	if err != nil {
		return fmt.Errorf("symlink %s -> %q: %w", show, target, err)
	}
	if !inside {
		return fmt.Errorf("symlink %s -> %q leads outside its input %s: inputs may only hold symlinks that stay inside the input", show, target, t.display)
	}
	if err := c.count(dst); err != nil {
		return err
	}
	if err := c.root.Symlink(target, dst); err != nil {
		return err
	}
	if err := c.root.Lchown(dst, c.owner.UID, c.owner.GID); err != nil {
		return err
	}
	c.snap.entries[dst] = Entry{Type: "symlink", Size: int64(len(target)), Mode: 0o777, Target: target}
	return nil
}

// resolvesInside reports whether target, a symlink in directory dir (beneath
// the input root), resolves inside the input root. It resolves the way the
// kernel does, following symlinks met on the way (each within the input,
// at most maxLinkHops), because a purely lexical check is fooled by a chain
// such as `d -> .` and `l -> d/..`. Once a component does not exist, the
// rest is judged lexically. An absolute target is outside.
func (t *srcTree) resolvesInside(dir []string, target string) (bool, error) {
	if target == "" || path.IsAbs(target) {
		return false, nil
	}
	stack := append([]string(nil), dir...)
	pending := strings.Split(target, "/")
	hops := 0
	lexical := false
	for len(pending) > 0 {
		comp := pending[0]
		pending = pending[1:]
		switch comp {
		case "", ".":
			continue
		case "..":
			if len(stack) == 0 {
				return false, nil
			}
			stack = stack[:len(stack)-1]
			continue
		}
		stack = append(stack, comp)
		if lexical {
			continue
		}
		// Every element of stack but the last is a real directory (links
		// are replaced by their targets below), so openChain may refuse
		// to follow.
		pfd, _, err := openChain(t.rootfd, t.dev, stack[:len(stack)-1])
		if err != nil {
			lexical = true
			continue
		}
		st, err := lstatat(pfd, comp)
		if err != nil {
			unix.Close(pfd)
			lexical = true
			continue
		}
		if st.Mode&unix.S_IFMT != unix.S_IFLNK {
			unix.Close(pfd)
			continue
		}
		hops++
		if hops > maxLinkHops {
			unix.Close(pfd)
			return false, errors.New("too many levels of symlinks")
		}
		next, err := readlinkat(pfd, comp)
		unix.Close(pfd)
		if err != nil {
			return false, err
		}
		if next == "" || path.IsAbs(next) {
			return false, nil
		}
		stack = stack[:len(stack)-1]
		pending = append(strings.Split(next, "/"), pending...)
	}
	return true, nil
}

// isEmpty reports whether the open directory d has no entries.
func isEmpty(d *os.File) (bool, error) {
	names, err := d.Readdirnames(1)
	if err != nil && err != io.EOF {
		return false, err
	}
	return len(names) == 0, nil
}
