package workspace

import (
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/moat-sandbox/moat/manifest"
)

// InputFile is one regular file of a manifest's inputs as a run on a
// server receives it: its path under /workspace, its bytes and its
// permission bits.
type InputFile struct {
	Path    string
	Content []byte
	Mode    fs.FileMode
}

// InputWarningKind says what of the inputs a server will not receive as
// it is on this host.
type InputWarningKind int

const (
	// EmptyDirNotSent: an empty directory; the HTTP API carries files
	// only, so it cannot be sent.
	EmptyDirNotSent InputWarningKind = iota + 1
	// ModeZeroSentAsDefault: a file with mode 0000; the API's default for
	// a file without a mode is 0644 and it cannot say "no permissions",
	// so the server gives the file 0644.
	ModeZeroSentAsDefault
	// CopyNotRemoved: the temporary copy of the inputs could not be
	// removed (Err says why); the files were read all the same.
	CopyNotRemoved
)

// InputWarning is one thing InputFiles reports without failing. Path is
// the input's path under /workspace (for CopyNotRemoved, the temporary
// directory); it may hold any bytes a file name can, so a caller printing
// it to a terminal escapes it.
type InputWarning struct {
	Kind InputWarningKind
	Path string
	Err  error
}

// InputFiles reads m's inputs into files for a run on a server, which
// receives files and never host paths. The inputs are first copied into a
// private temporary directory by CopyIn, the very code a local run uses,
// so the same rules hold (no top-level symlink, symlinks only if they
// resolve inside their input, regular files, directories and symlinks
// only, setuid bits stripped, the manifest's workspace.size,
// workspace.files and resources.file_size limits) and the files returned
// are the snapshot that was checked, not a second read of a tree that may
// have changed.
//
// The API carries regular files only: a symlink is sent as a copy of the
// regular file it resolves to within its input (ResolveInputLink); one
// that leads to a directory or to nothing is refused. Empty directories
// cannot be sent and are reported among the warnings, in path order, as
// are files of mode 0000. The warnings come back with an error too: they
// were true up to it. Files come sorted by path.
func InputFiles(m *manifest.Manifest) (files []InputFile, warnings []InputWarning, err error) {
	if len(m.Inputs) == 0 {
		return nil, nil, nil
	}
	tmp, err := os.MkdirTemp("", "moat-inputs-")
	if err != nil {
		return nil, nil, fmt.Errorf("copy inputs: %w", err)
	}
	defer func() {
		if err := removeTree(tmp); err != nil {
			warnings = append(warnings, InputWarning{Kind: CopyNotRemoved, Path: tmp, Err: err})
		}
	}()
	owner := Owner{UID: os.Getuid(), GID: os.Getgid()}
	lim := Limits{Bytes: int64(m.Workspace.Size), Files: m.Workspace.Files, FileBytes: int64(m.Resources.FileSize)}
	snap, err := CopyIn(tmp, m.Inputs, owner, lim)
	if err != nil {
		return nil, nil, fmt.Errorf("copy inputs: %w", err)
	}
	root, err := os.OpenRoot(tmp)
	if err != nil {
		return nil, nil, fmt.Errorf("copy inputs: %w", err)
	}
	defer root.Close()
	paths := snap.Paths()
	// The copy keeps the inputs' modes (a 0000 file, a 0500 directory);
	// it is ours, so open it up to read it. The modes sent come from the
	// snapshot.
	for _, p := range paths {
		switch e, _ := snap.Lookup(p); e.Type {
		case "dir":
			err = root.Chmod(p, 0o700)
		case "file":
			err = root.Chmod(p, 0o600)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("copy inputs: %w", err)
		}
	}
	hasChild := map[string]bool{}
	for _, p := range paths {
		hasChild[path.Dir(p)] = true
	}
	for _, p := range paths {
		e, _ := snap.Lookup(p)
		src, entry := p, e
		switch e.Type {
		case "dir":
			if !hasChild[p] {
				warnings = append(warnings, InputWarning{Kind: EmptyDirNotSent, Path: p})
			}
			continue
		case "symlink":
			if src, entry, err = ResolveInputLink(snap, inputRoot(m.Inputs, p), p); err != nil {
				return nil, warnings, fmt.Errorf("copy inputs: %w", err)
			}
		case "file":
		default:
			return nil, warnings, fmt.Errorf("copy inputs: %s is a %s: only regular files, directories and symlinks can be inputs", p, e.Type)
		}
		data, err := root.ReadFile(src)
		if err != nil {
			return nil, warnings, fmt.Errorf("copy inputs: %w", err)
		}
		mode := fs.FileMode(entry.Mode & 0o777)
		if mode == 0 {
			warnings = append(warnings, InputWarning{Kind: ModeZeroSentAsDefault, Path: p})
		}
		files = append(files, InputFile{Path: p, Content: data, Mode: mode})
	}
	return files, warnings, nil
}

// inputRoot returns the dst of the input p belongs to.
func inputRoot(inputs []manifest.Input, p string) string {
	for _, in := range inputs {
		if p == in.Dst || strings.HasPrefix(p, in.Dst+"/") {
			return in.Dst
		}
	}
	return p
}

// ResolveInputLink follows the symlink at p through snap, as the kernel
// would, without leaving the input rooted at root (the Dst of the input p
// belongs to; CopyIn has checked that already, and this holds on its own
// all the same), and returns the path and entry of the regular file it
// leads to. A link that leads outside its input, to nothing, to a
// directory, through a file, to anything but a regular file or through
// more than 40 links is an error naming the link, its target and the fix.
func ResolveInputLink(snap *Snapshot, root, p string) (string, Entry, error) {
	e, _ := snap.Lookup(p)
	refuse := func(why string) (string, Entry, error) {
		return "", Entry{}, fmt.Errorf("symlink %s -> %q %s: a run on a server receives regular files only; replace the link with the file", p, e.Target, why)
	}
	if path.IsAbs(e.Target) {
		// Split below, "/x" would start with an empty component and be
		// walked from p's directory: not where the kernel would go.
		// CopyIn never keeps such a link; refuse it here all the same.
		return refuse("leads outside its input")
	}
	base := len(strings.Split(root, "/"))
	stack := strings.Split(path.Dir(p), "/")
	pending := strings.Split(e.Target, "/")
	for hops := 1; len(pending) > 0; {
		comp := pending[0]
		pending = pending[1:]
		switch comp {
		case "", ".":
			continue
		case "..":
			if len(stack) <= base {
				return refuse("leads outside its input")
			}
			stack = stack[:len(stack)-1]
			continue
		}
		stack = append(stack, comp)
		cur, ok := snap.Lookup(strings.Join(stack, "/"))
		switch {
		case !ok:
			return refuse("leads to nothing")
		case cur.Type == "symlink":
			if hops++; hops > 40 {
				return refuse("has too many levels of symlinks")
			}
			if path.IsAbs(cur.Target) {
				return refuse("leads outside its input")
			}
			stack = stack[:len(stack)-1]
			pending = append(strings.Split(cur.Target, "/"), pending...)
		case cur.Type != "dir" && len(pending) > 0:
			return refuse("leads through a file")
		}
	}
	if len(stack) < base {
		return refuse("leads outside its input")
	}
	target := strings.Join(stack, "/")
	te, ok := snap.Lookup(target)
	switch {
	case !ok:
		return refuse("leads to nothing")
	case te.Type == "dir":
		return refuse("leads to a directory")
	case te.Type != "file":
		return refuse("does not lead to a regular file")
	}
	return target, te, nil
}

// removeTree removes the temporary copy of the inputs, opening up the
// directories the inputs' modes closed (a 0500 directory cannot be
// emptied).
func removeTree(dir string) error {
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			os.Chmod(p, 0o700)
		}
		return nil
	})
	return os.RemoveAll(dir)
}
