package workspace

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"sort"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/result"
)

// CopyOutReport says what CopyOut did with each candidate entry.
type CopyOutReport struct {
	// Copied lists the entries written to outDir, in path order.
	Copied []Copied
	// Skipped lists the candidates not written, and why.
	Skipped []Skipped
	// Bytes is the total of regular-file bytes written.
	Bytes int64
	// Violations records the limits that made CopyOut skip entries.
	Violations []result.Violation
}

// Copied is one entry written by CopyOut.
type Copied struct {
	Path string
	Type string // "file" or "dir"
	Size int64
	// Mode is the mode given to the copy ("%04o"), special bits stripped.
	Mode   string
	SHA256 string // of the bytes written, files only
}

// Skipped is one candidate CopyOut refused.
type Skipped struct {
	Path   string
	Type   string
	Reason string
}

// CopyOut copies the added and modified regular files (and directories)
// from the workspace into outDir (created if missing) safely.
//
// The change list and the workspace are both treated as hostile:
//   - outDir must not exist or be an empty directory (ErrOutDirNotEmpty
//     otherwise), so no host file is ever overwritten or merged with;
//     files are created with O_CREAT|O_EXCL through os.Root on outDir.
//   - Each workspace path is opened component by component with
//     O_NOFOLLOW (directories are opened, then fstat-checked), so a
//     directory swapped for a symlink after the diff (CVE-2024-45310-style
//     races) fails that entry closed. Paths must be clean and relative.
//   - Symlinks are never copied (skipped, reported); devices, FIFOs and
//     sockets are never copied. Setuid, setgid and sticky bits, and
//     group and other write, are stripped (copyOutStrip): nothing copied
//     out is writable by anyone but its owner; directories get at least
//     owner rwx so the user can manage the output.
//   - lim.FileBytes caps each file, lim.Bytes the total, lim.Files the
//     entries created (including parent directories). Entries past a cap
//     are skipped and reported; the rest still copy.
//   - A file whose content no longer matches the diff's SHA256 is skipped.
//   - Deleted entries are not applied.
//
// An error means Moat failed (outDir unusable, a write to it failed); what
// the sandbox did is in the report.
func CopyOut(wsDir string, changes []result.FileChange, outDir string, lim Limits) (CopyOutReport, error) {
	var rep CopyOutReport
	lim = lim.withDefaults()
	if err := prepareOutDir(outDir); err != nil {
		return rep, fmt.Errorf("copy-out: %w", err)
	}
	out, err := os.OpenRoot(outDir)
	if err != nil {
		return rep, fmt.Errorf("copy-out: %w", err)
	}
	defer out.Close()
	wsfd, wsst, err := openTop(wsDir)
	if err != nil {
		return rep, fmt.Errorf("copy-out: open workspace: %w", err)
	}
	defer unix.Close(wsfd)

	cands := make([]result.FileChange, 0, len(changes))
	for _, c := range changes {
		if c.Change == result.Added || c.Change == result.Modified {
			cands = append(cands, c)
		}
	}
	// Sorting puts a directory before its contents ("a" < "a/b").
	sort.SliceStable(cands, func(i, j int) bool { return cands[i].Path < cands[j].Path })

	co := &copyOut{out: out, wsfd: wsfd, dev: wsst.Dev, lim: lim, rep: &rep, dirs: map[string]uint32{}, buf: make([]byte, 128<<10)}
	for i, c := range cands {
		if i > 0 && cands[i-1].Path == c.Path {
			co.skip(c, "duplicate path in the change list")
			continue
		}
		if err := co.one(c); err != nil {
			return rep, fmt.Errorf("copy-out %q: %w", c.Path, err)
		}
	}
	// Directory modes last, deepest first, so a read-only directory could
	// still be filled.
	paths := make([]string, 0, len(co.dirs))
	for p := range co.dirs {
		paths = append(paths, p)
	}
	sort.Slice(paths, func(i, j int) bool { return paths[i] > paths[j] })
	for _, p := range paths {
		if err := out.Chmod(p, fs.FileMode(co.dirs[p])); err != nil {
			return rep, fmt.Errorf("copy-out: chmod %q: %w", p, err)
		}
	}
	co.violations()
	return rep, nil
}

// CheckOutDir reports whether CopyOut would accept outDir (absent, or an
// empty directory), without creating it, so callers can refuse a bad
// --output before running anything.
func CheckOutDir(outDir string) error {
	if _, err := os.Lstat(outDir); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return checkOutDir(outDir)
}

// prepareOutDir creates outDir or checks it is an empty directory. outDir
// is the user's host path, never derived from sandbox output.
func prepareOutDir(outDir string) error {
	if _, err := os.Lstat(outDir); errors.Is(err, fs.ErrNotExist) {
		return os.MkdirAll(outDir, 0o755)
	}
	return checkOutDir(outDir)
}

func checkOutDir(outDir string) error {
	fi, err := os.Lstat(outDir)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("output directory %s is not a directory (a symlink is not followed)", outDir)
	}
	d, err := os.Open(outDir)
	if err != nil {
		return err
	}
	defer d.Close()
	empty, err := isEmpty(d)
	if err != nil {
		return err
	}
	if !empty {
		return fmt.Errorf("%s: %w: give a new or empty directory", outDir, ErrOutDirNotEmpty)
	}
	return nil
}

type copyOut struct {
	out   *os.Root
	wsfd  int
	dev   uint64
	lim   Limits
	rep   *CopyOutReport
	dirs  map[string]uint32 // directories created in outDir -> final mode
	files int
	buf   []byte

	overFile, overBytes, overFiles bool
}

func (co *copyOut) skip(c result.FileChange, why string) {
	co.rep.Skipped = append(co.rep.Skipped, Skipped{Path: c.Path, Type: c.Type, Reason: why})
}

func (co *copyOut) violations() {
	if co.overFile {
		co.rep.Violations = append(co.rep.Violations, result.Violation{Kind: "file-size",
			Detail: "copy-out skipped files larger than the per-file limit", Limit: fmt.Sprintf("resources.file_size=%d", co.lim.FileBytes)})
	}
	if co.overBytes {
		co.rep.Violations = append(co.rep.Violations, result.Violation{Kind: "disk",
			Detail: "copy-out skipped files past the total byte limit", Limit: fmt.Sprintf("workspace.size=%d", co.lim.Bytes)})
	}
	if co.overFiles {
		co.rep.Violations = append(co.rep.Violations, result.Violation{Kind: "files",
			Detail: "copy-out skipped entries past the entry limit", Limit: fmt.Sprintf("workspace.files=%d", co.lim.Files)})
	}
}

// testHookAfterStat, when set by a test, runs between the fstatat of an
// entry and its open: the window a live sandbox would race.
var testHookAfterStat func(path string)

// copyOutStrip is what copy-out takes off every mode it reproduces on the
// host: setuid and setgid (a sandbox-written binary must not run with the
// copier's privileges), sticky, and group and other write. The copies
// belong to the user who ran moat (root, often), in a directory other
// users may traverse: a sandbox's 01777 /workspace/tmp copied as 0777 would
// let any local user plant files into the results the user is about to
// review (or swap them for their own). Read and execute bits are kept, so
// the output reads as the sandbox left it.
const copyOutStrip = 0o7022

// fileMode is the mode a file copy gets.
func fileMode(m uint32) uint32 { return m & 0o777 &^ copyOutStrip }

// dirMode is the mode a directory copy gets: as a file's, and at least
// owner rwx so the user can manage the output.
func dirMode(m uint32) uint32 { return fileMode(m) | 0o700 }

// one copies one candidate. It returns an error only for failures on the
// host side; anything about the workspace is a skip.
func (co *copyOut) one(c result.FileChange) error {
	comps, err := splitRel(c.Path)
	if err != nil {
		co.skip(c, "invalid path: "+err.Error())
		return nil
	}
	switch c.Type {
	case "file", "dir":
	case "symlink":
		co.skip(c, "symlink: never copied out (its target is recorded in the diff, never followed)")
		return nil
	case "other":
		co.skip(c, "not a regular file or directory (device, FIFO or socket): never copied out")
		return nil
	default:
		co.skip(c, fmt.Sprintf("unknown type %q", c.Type))
		return nil
	}
	parentfd, sts, err := openChain(co.wsfd, co.dev, comps[:len(comps)-1])
	if err != nil {
		co.skip(c, "in the workspace, "+err.Error())
		return nil
	}
	defer unix.Close(parentfd)
	name := comps[len(comps)-1]
	st, err := lstatat(parentfd, name)
	if err != nil {
		co.skip(c, fmt.Sprintf("in the workspace: %v (vanished since the diff?)", err))
		return nil
	}
	if testHookAfterStat != nil {
		testHookAfterStat(c.Path)
	}
	if got := fileType(st.Mode); got != c.Type {
		co.skip(c, fmt.Sprintf("in the workspace it is now a %s, not a %s: not copied", describeType(st.Mode), c.Type))
		return nil
	}

	// Parents in outDir, mirroring the workspace's modes.
	for i := range sts {
		why, err := co.mkdir(strings.Join(comps[:i+1], "/"), sts[i].Mode)
		if err != nil {
			return err
		}
		if why != "" {
			co.skip(c, why)
			return nil
		}
	}
	rel := strings.Join(comps, "/")

	if c.Type == "dir" {
		// Open, then fstat: only a real directory, the same one the
		// fstatat saw, on the workspace's filesystem, gets copied.
		dfd, err := openat(parentfd, name, dirFlags)
		if err != nil {
			co.skip(c, fmt.Sprintf("in the workspace: open: %v (swapped since the diff?)", err))
			return nil
		}
		ost, err := fstat(dfd)
		unix.Close(dfd)
		switch {
		case err != nil:
			co.skip(c, fmt.Sprintf("in the workspace: fstat: %v", err))
			return nil
		case ost.Dev != st.Dev || ost.Ino != st.Ino:
			co.skip(c, "in the workspace: replaced while being opened")
			return nil
		case ost.Dev != co.dev:
			co.skip(c, "on another filesystem than the workspace: not copied")
			return nil
		}
		why, err := co.mkdir(rel, ost.Mode)
		if err != nil {
			return err
		}
		if why != "" {
			co.skip(c, why)
			return nil
		}
		co.rep.Copied = append(co.rep.Copied, Copied{Path: c.Path, Type: "dir", Mode: fmt.Sprintf("%04o", dirMode(ost.Mode))})
		return nil
	}
	return co.file(c, parentfd, name, rel, &st)
}

// mkdir creates directory rel in outDir unless this copy-out already did.
// It returns a reason when the entry must be skipped: the entry limit, or a
// file this copy-out wrote at rel earlier (a workspace entry that changed
// type between two entries of the list).
func (co *copyOut) mkdir(rel string, mode uint32) (string, error) {
	if _, ok := co.dirs[rel]; ok {
		return "", nil
	}
	if co.files >= co.lim.Files {
		co.overFiles = true
		return fmt.Sprintf("entry limit workspace.files=%d reached", co.lim.Files), nil
	}
	// 0700 until the end: the final mode is applied after the contents.
	err := co.out.Mkdir(rel, 0o700)
	if errors.Is(err, fs.ErrExist) {
		return fmt.Sprintf("%q was already copied out as a file", rel), nil
	}
	if err != nil {
		return "", err
	}
	co.files++
	co.dirs[rel] = dirMode(mode)
	return "", nil
}

func (co *copyOut) file(c result.FileChange, parentfd int, name, rel string, st *unix.Stat_t) error {
	if co.files >= co.lim.Files {
		co.overFiles = true
		co.skip(c, fmt.Sprintf("entry limit workspace.files=%d reached", co.lim.Files))
		return nil
	}
	if st.Size > co.lim.FileBytes {
		co.overFile = true
		co.skip(c, fmt.Sprintf("size %d exceeds the per-file limit resources.file_size=%d", st.Size, co.lim.FileBytes))
		return nil
	}
	budget := co.lim.Bytes - co.rep.Bytes
	if st.Size > budget {
		co.overBytes = true
		co.skip(c, fmt.Sprintf("size %d exceeds the %d bytes left of the copy-out limit workspace.size=%d", st.Size, budget, co.lim.Bytes))
		return nil
	}
	src, sst, err := openRegular(parentfd, name, st)
	if err != nil {
		co.skip(c, "in the workspace: "+err.Error())
		return nil
	}
	defer src.Close()

	dst, err := co.out.OpenFile(rel, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if errors.Is(err, fs.ErrExist) {
		co.skip(c, "already exists in the output directory")
		return nil
	}
	if err != nil {
		return err
	}
	co.files++
	discard := func(why string) error {
		dst.Close()
		if err := co.out.Remove(rel); err != nil {
			return err
		}
		co.files--
		co.skip(c, why)
		return nil
	}
	allowed := min(co.lim.FileBytes, budget)
	h := sha256.New()
	// One byte past the cap detects a file still growing.
	rd := &readErr{r: io.LimitReader(src, allowed+1)}
	n, err := io.CopyBuffer(io.MultiWriter(dst, h), rd, co.buf)
	if err != nil {
		if rd.err == nil {
			dst.Close()
			return err // writing to the host failed
		}
		return discard(fmt.Sprintf("in the workspace: read: %v", rd.err))
	}
	if n > allowed {
		co.overFile = co.overFile || n > co.lim.FileBytes
		co.overBytes = co.overBytes || n > budget
		return discard(fmt.Sprintf("grew past the limit (%d bytes) while being copied", allowed))
	}
	sum := hex.EncodeToString(h.Sum(nil))
	if c.SHA256 != "" && c.SHA256 != sum {
		return discard("content changed since the diff: not copied")
	}
	mode := fileMode(sst.Mode)
	if err := dst.Chmod(fs.FileMode(mode)); err != nil {
		dst.Close()
		return err
	}
	if err := dst.Close(); err != nil {
		return err
	}
	co.rep.Bytes += n
	co.rep.Copied = append(co.rep.Copied, Copied{Path: c.Path, Type: "file", Size: n, Mode: fmt.Sprintf("%04o", mode), SHA256: sum})
	return nil
}

// readErr remembers a read error, so a failed copy can be blamed on the
// workspace (skip the entry) or on the host (fail the copy-out).
type readErr struct {
	r   io.Reader
	err error
}

func (r *readErr) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	if err != nil && err != io.EOF {
		r.err = err
	}
	return n, err
}
