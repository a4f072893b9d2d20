package workspace

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"sort"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/result"
)

// DiffLimits bounds a walk of the (hostile) workspace. A zero field means
// the default.
type DiffLimits struct {
	// MaxEntries caps the entries examined (default 100000). Past it the
	// walk stops: the diff is partial and a *LimitError says so.
	MaxEntries int
	// MaxHashBytes caps the bytes read for hashing, in total (default
	// 1 GiB). A file past the budget is not hashed: if it was in the
	// snapshot it is reported modified with no SHA256, since it cannot be
	// shown unchanged.
	MaxHashBytes int64
	// MaxDepth caps directory nesting (default 128); deeper directories
	// are listed but not entered. The walk holds one fd per level.
	MaxDepth int
}

// The DiffLimits defaults.
const (
	DefaultMaxEntries   = 100000
	DefaultMaxHashBytes = 1 << 30
	DefaultMaxDepth     = 128
)

func (l DiffLimits) withDefaults() DiffLimits {
	if l.MaxEntries <= 0 {
		l.MaxEntries = DefaultMaxEntries
	}
	if l.MaxHashBytes <= 0 {
		l.MaxHashBytes = DefaultMaxHashBytes
	}
	if l.MaxDepth <= 0 {
		l.MaxDepth = DefaultMaxDepth
	}
	return l
}

// Diff walks the workspace (hostile) and compares it with the snapshot:
// added, modified (content, type, mode or symlink target changed), deleted.
// Sorted by path.
//
// Symlinks are never followed, only recorded with their target; only
// regular files are hashed; directories appear when added, deleted or when
// their mode changed. Entries that vanish during the walk are treated as
// absent.
//
// When a DiffLimits bound is hit, Diff returns the partial diff together
// with a non-nil error made of *LimitError values (use errors.As, or
// Violations to record them all). A partial walk reports a snapshot entry
// as deleted only when its parent directory was listed completely or is
// itself gone. Any other error means the walk could not start.
func Diff(wsDir string, snap *Snapshot, lim DiffLimits) ([]result.FileChange, error) {
	if snap == nil {
		snap = &Snapshot{}
	}
	lim = lim.withDefaults()
	fd, st, err := openTop(wsDir)
	if err != nil {
		return nil, fmt.Errorf("diff: %w", err)
	}
	w := &walker{
		lim:      lim,
		dev:      st.Dev,
		seen:     map[string]Entry{},
		complete: map[string]bool{},
		buf:      make([]byte, 64<<10),
	}
	w.walk(fd, "", 0) // closes fd

	var changes []result.FileChange
	for p, cur := range w.seen {
		old, ok := snap.entries[p]
		switch {
		case !ok:
			changes = append(changes, change(p, result.Added, cur))
		case differs(old, cur):
			changes = append(changes, change(p, result.Modified, cur))
		}
	}
	// Deletions, parents first so "gone" propagates down.
	gone := map[string]bool{}
	for _, p := range snap.Paths() {
		old := snap.entries[p]
		cur, ok := w.seen[p]
		if ok {
			if old.Type == "dir" && cur.Type != "dir" {
				gone[p] = true
			}
			continue
		}
		parent := path.Dir(p)
		if parent == "." {
			parent = ""
		}
		if w.complete[parent] || gone[parent] {
			gone[p] = true
			changes = append(changes, change(p, result.Deleted, old))
		}
	}
	sort.Slice(changes, func(i, j int) bool { return changes[i].Path < changes[j].Path })
	return changes, errors.Join(w.limitErrs()...)
}

func change(p string, c result.Change, e Entry) result.FileChange {
	return result.FileChange{
		Path:   p,
		Change: c,
		Type:   e.Type,
		Size:   e.Size,
		SHA256: e.SHA256,
		Mode:   fmt.Sprintf("%04o", e.Mode),
		Target: e.Target,
	}
}

func differs(old, cur Entry) bool {
	if old.Type != cur.Type {
		return true
	}
	switch cur.Type {
	case "file":
		return old.Mode != cur.Mode || old.Size != cur.Size || cur.SHA256 == "" || old.SHA256 != cur.SHA256
	case "dir":
		return old.Mode != cur.Mode
	case "symlink":
		return old.Target != cur.Target
	}
	return true
}

type walker struct {
	lim      DiffLimits
	dev      uint64
	seen     map[string]Entry
	complete map[string]bool // directories listed to the end
	entries  int
	hashed   int64
	buf      []byte

	tooMany, unhashed, tooDeep, mounts int
}

func (w *walker) limitErrs() []error {
	var errs []error
	if w.tooMany > 0 {
		errs = append(errs, &LimitError{Field: "DiffLimits.MaxEntries", Limit: int64(w.lim.MaxEntries), Kind: "diff",
			Detail: fmt.Sprintf("workspace has more than %d entries; the file diff is partial", w.lim.MaxEntries)})
	}
	if w.unhashed > 0 {
		errs = append(errs, &LimitError{Field: "DiffLimits.MaxHashBytes", Limit: w.lim.MaxHashBytes, Kind: "diff",
			Detail: fmt.Sprintf("%d files were not hashed: the hashing budget of %d bytes was spent", w.unhashed, w.lim.MaxHashBytes)})
	}
	if w.tooDeep > 0 {
		errs = append(errs, &LimitError{Field: "DiffLimits.MaxDepth", Limit: int64(w.lim.MaxDepth), Kind: "diff",
			Detail: fmt.Sprintf("%d directories nested deeper than %d levels were not entered; the file diff is partial", w.tooDeep, w.lim.MaxDepth)})
	}
	if w.mounts > 0 {
		errs = append(errs, &LimitError{Field: "diff.same_filesystem", Limit: 0, Kind: "diff",
			Detail: fmt.Sprintf("%d directories on another filesystem than the workspace were not entered", w.mounts)})
	}
	return errs
}

// walk lists the directory open at fd (path rel, "" for the root) and
// recurses; it closes fd.
func (w *walker) walk(fd int, rel string, depth int) {
	d := os.NewFile(uintptr(fd), rel)
	defer d.Close()
	for {
		// Batches keep a directory with a million entries from being
		// read into memory at once.
		names, err := d.Readdirnames(256)
		for _, name := range names {
			if w.entries >= w.lim.MaxEntries {
				w.tooMany++
				return
			}
			w.entries++
			w.entry(fd, rel, name, depth)
		}
		if err == io.EOF {
			w.complete[rel] = true
			return
		}
		if err != nil || len(names) == 0 {
			return // unreadable: not complete, so no deletions inferred
		}
	}
}

func (w *walker) entry(dirfd int, rel, name string, depth int) {
	p := name
	if rel != "" {
		p = rel + "/" + name
	}
	st, err := lstatat(dirfd, name)
	if err != nil {
		return // vanished
	}
	e := Entry{Type: fileType(st.Mode), Mode: st.Mode & 0o7777}
	switch e.Type {
	case "file":
		e.Size = st.Size
		e.SHA256 = w.hash(dirfd, name, &st, &e)
	case "symlink":
		t, err := readlinkat(dirfd, name)
		if err != nil {
			return // vanished or swapped
		}
		e.Target, e.Size = t, int64(len(t))
	case "dir":
		w.seen[p] = e
		switch {
		case depth+1 > w.lim.MaxDepth:
			w.tooDeep++
		case st.Dev != w.dev:
			w.mounts++
		default:
			cfd, err := openat(dirfd, name, dirFlags)
			if err != nil {
				return // vanished or swapped for a symlink: not entered
			}
			ost, err := fstat(cfd)
			if err != nil || ost.Dev != st.Dev || ost.Ino != st.Ino {
				unix.Close(cfd)
				return
			}
			w.walk(cfd, p, depth+1)
		}
		return
	}
	w.seen[p] = e
}

// hash returns the hex SHA-256 of a regular file, or "" when it is past
// the budget or cannot be read; it updates e.Size to the bytes hashed.
func (w *walker) hash(dirfd int, name string, st *unix.Stat_t, e *Entry) string {
	budget := w.lim.MaxHashBytes - w.hashed
	if st.Size > budget {
		w.unhashed++
		return ""
	}
	f, _, err := openRegular(dirfd, name, st)
	if err != nil {
		return ""
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.CopyBuffer(h, io.LimitReader(f, budget+1), w.buf)
	w.hashed += n
	if err != nil {
		return ""
	}
	if n > budget {
		w.unhashed++
		return ""
	}
	e.Size = n
	return hex.EncodeToString(h.Sum(nil))
}
