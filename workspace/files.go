package workspace

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
)

// Files gives the host safe access to a live sandbox's workspace, for an
// API caller's uploads and downloads. Everything below the workspace is
// hostile: paths resolve through os.Root, so no symlink leads outside it,
// and only regular files are read or written (a FIFO or device is refused,
// never opened for blocking I/O).
type Files struct {
	root  *os.Root
	owner Owner
	lim   Limits
}

// OpenFiles opens the workspace at wsDir. lim.FileBytes bounds one upload.
func OpenFiles(wsDir string, owner Owner, lim Limits) (*Files, error) {
	root, err := os.OpenRoot(wsDir)
	if err != nil {
		return nil, fmt.Errorf("open workspace: %w", err)
	}
	return &Files{root: root, owner: owner, lim: lim.withDefaults()}, nil
}

// Close releases the workspace.
func (f *Files) Close() error { return f.root.Close() }

// ErrBadPath marks a path the caller may not use (wrapped with the reason).
var ErrBadPath = errors.New("invalid workspace path")

// rootErr marks os.Root's refusals of a path as the caller's mistake
// (ErrBadPath), not the host failing: a path that leads out of the
// workspace through a symbolic link the sandbox made, and one through too
// many links (ELOOP). os.Root does not export its "path escapes from
// parent" error, so it is recognised by its text; TestFilesSymlinkEscape
// pins it.
func rootErr(p string, err error) error {
	if err == nil || errors.Is(err, ErrBadPath) {
		return err
	}
	var pe *fs.PathError
	if errors.As(err, &pe) && pe.Err != nil && pe.Err.Error() == "path escapes from parent" {
		return fmt.Errorf("%w: %s leads out of the workspace through a symbolic link; links are resolved inside /workspace only", ErrBadPath, p)
	}
	if errors.Is(err, unix.ELOOP) {
		return fmt.Errorf("%w: %s goes through a symbolic link that is not followed here (%v)", ErrBadPath, p, err)
	}
	return err
}

// CleanPath validates a caller's path below /workspace: relative (a leading
// "/workspace/" is accepted and removed), no NUL, no "..", not empty. "."
// names the workspace itself only when allowRoot is set.
func CleanPath(p string, allowRoot bool) (string, error) {
	if rest, ok := strings.CutPrefix(p, "/workspace"); ok && (rest == "" || rest[0] == '/') {
		p = strings.TrimPrefix(rest, "/")
		if p == "" {
			p = "."
		}
	}
	if allowRoot && (p == "." || p == "") {
		return ".", nil
	}
	d, err := cleanDst(p)
	if err != nil {
		return "", fmt.Errorf("%w: %q %v", ErrBadPath, p, err)
	}
	return d, nil
}

// Info describes one workspace entry.
type Info struct {
	Name    string
	Path    string
	Type    string // file, dir, symlink, other
	Size    int64
	Mode    fs.FileMode
	ModTime int64 // unix nanoseconds
	Target  string
	// Metadata is a file's or directory's metadata (SetMetadata), nil
	// when it has none.
	Metadata map[string]string
}

func info(p string, fi fs.FileInfo, target string) Info {
	t := "other"
	switch {
	case fi.Mode().IsRegular():
		t = "file"
	case fi.IsDir():
		t = "dir"
	case fi.Mode()&fs.ModeSymlink != 0:
		t = "symlink"
	}
	return Info{Name: path.Base(p), Path: p, Type: t, Size: fi.Size(), Mode: fi.Mode().Perm(), ModTime: fi.ModTime().UnixNano(), Target: target}
}

// Stat describes p without following a final symlink.
func (f *Files) Stat(p string) (Info, error) {
	in, err := f.stat(p)
	return in, rootErr(p, err)
}

func (f *Files) stat(p string) (Info, error) {
	p, err := CleanPath(p, true)
	if err != nil {
		return Info{}, err
	}
	fi, err := f.root.Lstat(p)
	if err != nil {
		return Info{}, err
	}
	var target string
	if fi.Mode()&fs.ModeSymlink != 0 {
		target, _ = f.root.Readlink(p)
	}
	in := info(p, fi, target)
	in.Metadata = f.metadata(in)
	return in, nil
}

// MaxListEntries bounds one directory listing.
const MaxListEntries = 10000

// ReadDir lists directory p (at most MaxListEntries entries), sorted.
func (f *Files) ReadDir(p string) ([]Info, error) {
	ins, err := f.readDir(p)
	return ins, rootErr(p, err)
}

func (f *Files) readDir(p string) ([]Info, error) {
	p, err := CleanPath(p, true)
	if err != nil {
		return nil, err
	}
	d, err := f.root.OpenFile(p, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	names, err := d.Readdirnames(MaxListEntries)
	if err != nil && err != io.EOF {
		return nil, err
	}
	sort.Strings(names)
	out := make([]Info, 0, len(names))
	for _, n := range names {
		child := path.Join(p, n)
		if p == "." {
			child = n
		}
		if in, err := f.Stat(child); err == nil {
			out = append(out, in)
		}
	}
	return out, nil
}

// Open opens regular file p for reading; its Info carries the metadata.
func (f *Files) Open(p string) (*os.File, Info, error) {
	fh, in, err := f.open(p)
	return fh, in, rootErr(p, err)
}

func (f *Files) open(p string) (*os.File, Info, error) {
	p, err := CleanPath(p, false)
	if err != nil {
		return nil, Info{}, err
	}
	// O_NONBLOCK: a FIFO planted by the sandbox must not hang the host.
	fh, err := f.root.OpenFile(p, os.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, Info{}, err
	}
	fi, err := fh.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		fh.Close()
		if err == nil {
			err = fmt.Errorf("%w: %s is a %s, not a regular file", ErrBadPath, p, info(p, fi, "").Type)
		}
		return nil, Info{}, err
	}
	in := info(p, fi, "")
	// From the open handle: the metadata of the very file being read (a
	// snapshot keeps both).
	in.Metadata, _ = ReadMetadata(fh)
	return fh, in, nil
}

// WriteFile writes r to p (replacing a regular file there), creating the
// parents, all owned by the sandbox's user. At most lim.FileBytes are
// accepted: a larger upload is an error and leaves no partial file.
func (f *Files) WriteFile(p string, r io.Reader, mode fs.FileMode) (int64, error) {
	n, err := f.writeFile(p, r, mode)
	return n, rootErr(p, err)
}

func (f *Files) writeFile(p string, r io.Reader, mode fs.FileMode) (int64, error) {
	p, err := CleanPath(p, false)
	if err != nil {
		return 0, err
	}
	if mode == 0 {
		mode = 0o644
	}
	mode &= 0o777 // no setuid, setgid or sticky bits from a caller
	if err := f.MakeDir(path.Dir(p)); err != nil {
		return 0, err
	}
	fh, err := f.root.OpenFile(p, os.O_WRONLY|os.O_CREATE|unix.O_NONBLOCK|unix.O_NOCTTY, mode)
	if err != nil {
		return 0, err
	}
	fi, err := fh.Stat()
	if err == nil && !fi.Mode().IsRegular() {
		err = fmt.Errorf("%w: %s exists and is not a regular file", ErrBadPath, p)
	}
	if err == nil {
		err = fh.Truncate(0)
	}
	var n int64
	if err == nil {
		n, err = io.Copy(fh, io.LimitReader(r, f.lim.FileBytes+1))
		if err == nil && n > f.lim.FileBytes {
			err = &LimitError{Field: "resources.file_size", Limit: f.lim.FileBytes, Kind: "file-size", Detail: fmt.Sprintf("upload %s is larger than %d bytes", p, f.lim.FileBytes)}
		}
	}
	if err == nil {
		err = fh.Chown(f.owner.UID, f.owner.GID)
	}
	if err == nil {
		err = fh.Chmod(mode)
	}
	if cerr := fh.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		if fi != nil && fi.Mode().IsRegular() {
			f.root.Remove(p)
		}
		return 0, err
	}
	return n, nil
}

// MakeDir creates directory p and its missing parents, owned by the
// sandbox's user.
func (f *Files) MakeDir(p string) error {
	return rootErr(p, f.makeDir(p))
}

func (f *Files) makeDir(p string) error {
	p, err := CleanPath(p, true)
	if err != nil || p == "." {
		return err
	}
	cur := ""
	for _, c := range strings.Split(p, "/") {
		cur = path.Join(cur, c)
		err := f.root.Mkdir(cur, 0o755)
		if errors.Is(err, fs.ErrExist) {
			fi, serr := f.root.Lstat(cur)
			if serr == nil && fi.IsDir() {
				continue
			}
			return fmt.Errorf("%w: %s exists and is not a directory", ErrBadPath, cur)
		}
		if err != nil {
			return err
		}
		if err := f.root.Lchown(cur, f.owner.UID, f.owner.GID); err != nil {
			return err
		}
	}
	return nil
}

// Rename moves from to to (both inside the workspace).
func (f *Files) Rename(from, to string) error {
	return rootErr(from+" or "+to, f.rename(from, to))
}

func (f *Files) rename(from, to string) error {
	from, err := CleanPath(from, false)
	if err != nil {
		return err
	}
	to, err = CleanPath(to, false)
	if err != nil {
		return err
	}
	if err := f.MakeDir(path.Dir(to)); err != nil {
		return err
	}
	return f.root.Rename(from, to)
}

// Remove removes p, a directory with everything below it.
func (f *Files) Remove(p string) error {
	return rootErr(p, f.remove(p))
}

func (f *Files) remove(p string) error {
	p, err := CleanPath(p, false)
	if err != nil {
		return err
	}
	if _, err := f.root.Lstat(p); err != nil {
		return err
	}
	return f.root.RemoveAll(p)
}

// Scan records the workspace's current state, for a later Diff: what a
// session's command changed.
func Scan(wsDir string, lim DiffLimits) (*Snapshot, error) {
	lim = lim.withDefaults()
	fd, st, err := openTop(wsDir)
	if err != nil {
		return nil, fmt.Errorf("scan: %w", err)
	}
	w := &walker{lim: lim, dev: st.Dev, seen: map[string]Entry{}, complete: map[string]bool{}, buf: make([]byte, 64<<10)}
	w.walk(fd, "", 0)
	return &Snapshot{entries: w.seen}, errors.Join(w.limitErrs()...)
}
