package wasm

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"sync"
	"syscall"
	"time"

	experimentalsys "github.com/tetratelabs/wazero/experimental/sys"
	"github.com/tetratelabs/wazero/sys"
)

// rootFS is the guest's /workspace: a WASI file system whose every
// operation resolves through an os.Root, so no path the guest names (with
// "..", an absolute symlink, a symlink to "../..", a race between a check
// and a use) reaches outside the directory. wazero's own DirFS joins
// strings and lets the kernel follow symlinks (the wasmer CVE-2024-38358
// class); os.Root resolves component by component with openat and
// O_NOFOLLOW and refuses an escape with an error.
//
// It also enforces the workspace limits the kernel cannot (there is no
// tmpfs here): file size, total bytes and file count, counted from the
// workspace as it was when the program started.
type rootFS struct {
	experimentalsys.UnimplementedFS
	root *os.Root
	q    *quota
}

// errLimit is what a guest sees when a write would pass a limit. wazero's
// Errno set (the only errors its WASI layer can return) has no EFBIG,
// ENOSPC or EDQUOT, so the refusal is an I/O error; the Result's
// violations say which limit it was.
const errLimit = experimentalsys.EIO

// quota counts what the program adds to the workspace.
type quota struct {
	mu                 sync.Mutex
	bytes, files       int64
	maxBytes, maxFiles int64
	maxFile            int64
	hitDisk, hitFiles  bool
	hitFileSize        bool
	// open counts the guest's open files: each is a descriptor of Moat's
	// own process, so the open-files limit protects Moat, not the guest.
	open, maxOpen int
	hitOpen       bool
}

// opened accounts for one more open file.
func (q *quota) opened() experimentalsys.Errno {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.maxOpen > 0 && q.open >= q.maxOpen {
		q.hitOpen = true
		return errLimit
	}
	q.open++
	return 0
}

func (q *quota) closed() {
	q.mu.Lock()
	q.open--
	q.mu.Unlock()
}

func newQuota(dir string, maxBytes, maxFiles, maxFile int64) (*quota, error) {
	q := &quota{maxBytes: maxBytes, maxFiles: maxFiles, maxFile: maxFile}
	r, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	err = fs.WalkDir(r.FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == "." {
			return err
		}
		q.files++
		if d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				q.bytes += fi.Size()
			}
		}
		return nil
	})
	return q, err
}

// grow accounts for delta more bytes, refusing what passes the limit.
func (q *quota) grow(delta int64) experimentalsys.Errno {
	q.mu.Lock()
	defer q.mu.Unlock()
	if delta > 0 && q.maxBytes > 0 && q.bytes+delta > q.maxBytes {
		q.hitDisk = true
		return errLimit
	}
	q.bytes += delta
	return 0
}

// addFile accounts for one more directory entry.
func (q *quota) addFile() experimentalsys.Errno {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.maxFiles > 0 && q.files+1 > q.maxFiles {
		q.hitFiles = true
		return errLimit
	}
	q.files++
	return 0
}

func (q *quota) removed(size int64) {
	q.mu.Lock()
	q.files--
	q.bytes -= size
	q.mu.Unlock()
}

// rel turns a guest path (relative to the mount, maybe with a leading
// slash) into an os.Root name.
func rel(p string) string {
	p = strings.TrimLeft(p, "/")
	if p == "" {
		return "."
	}
	return p
}

func errno(err error) experimentalsys.Errno {
	if err == nil {
		return 0
	}
	var pe *fs.PathError
	var le *os.LinkError
	switch {
	case errors.As(err, &pe):
		err = pe.Err
	case errors.As(err, &le):
		err = le.Err
	}
	if strings.Contains(err.Error(), "path escapes from parent") {
		// os.Root's refusal of an escape: the guest sees "not capable".
		return experimentalsys.EPERM
	}
	return experimentalsys.UnwrapOSError(err)
}

func toOSFlag(flag experimentalsys.Oflag) int {
	f := 0
	switch flag & 3 {
	case experimentalsys.O_RDONLY:
		f = os.O_RDONLY
	case experimentalsys.O_RDWR:
		f = os.O_RDWR
	case experimentalsys.O_WRONLY:
		f = os.O_WRONLY
	}
	for _, m := range []struct {
		w experimentalsys.Oflag
		o int
	}{
		{experimentalsys.O_APPEND, os.O_APPEND}, {experimentalsys.O_CREAT, os.O_CREATE},
		{experimentalsys.O_EXCL, os.O_EXCL}, {experimentalsys.O_TRUNC, os.O_TRUNC},
		{experimentalsys.O_SYNC, os.O_SYNC}, {experimentalsys.O_DIRECTORY, syscall.O_DIRECTORY},
		{experimentalsys.O_NOFOLLOW, syscall.O_NOFOLLOW},
	} {
		if flag&m.w != 0 {
			f |= m.o
		}
	}
	return f
}

// OpenFile implements experimentalsys.FS.
func (r *rootFS) OpenFile(p string, flag experimentalsys.Oflag, perm fs.FileMode) (experimentalsys.File, experimentalsys.Errno) {
	name := rel(p)
	created := false
	var before int64
	if flag&experimentalsys.O_CREAT != 0 || flag&experimentalsys.O_TRUNC != 0 {
		fi, err := r.root.Lstat(name)
		created = err != nil
		if err == nil && fi.Mode().IsRegular() {
			before = fi.Size()
		}
		if created {
			if e := r.q.addFile(); e != 0 {
				return nil, e
			}
		}
	}
	if e := r.q.opened(); e != 0 {
		if created {
			r.q.removed(0)
		}
		return nil, e
	}
	f, err := r.root.OpenFile(name, toOSFlag(flag), perm&0o777)
	if err != nil {
		r.q.closed()
		if created {
			r.q.removed(0)
		}
		return nil, errno(err)
	}
	if flag&experimentalsys.O_TRUNC != 0 && before > 0 {
		r.q.grow(-before)
	}
	return &file{f: f, q: r.q, append: flag&experimentalsys.O_APPEND != 0}, 0
}

// Lstat implements experimentalsys.FS.
func (r *rootFS) Lstat(p string) (sys.Stat_t, experimentalsys.Errno) {
	fi, err := r.root.Lstat(rel(p))
	if err != nil {
		return sys.Stat_t{}, errno(err)
	}
	return sys.NewStat_t(fi), 0
}

// Stat implements experimentalsys.FS.
func (r *rootFS) Stat(p string) (sys.Stat_t, experimentalsys.Errno) {
	fi, err := r.root.Stat(rel(p))
	if err != nil {
		return sys.Stat_t{}, errno(err)
	}
	return sys.NewStat_t(fi), 0
}

// Mkdir implements experimentalsys.FS.
func (r *rootFS) Mkdir(p string, perm fs.FileMode) experimentalsys.Errno {
	if e := r.q.addFile(); e != 0 {
		return e
	}
	if err := r.root.Mkdir(rel(p), perm&0o777); err != nil {
		r.q.removed(0)
		return errno(err)
	}
	return 0
}

// Chmod implements experimentalsys.FS. Only permission bits, never setuid.
func (r *rootFS) Chmod(p string, perm fs.FileMode) experimentalsys.Errno {
	return errno(r.root.Chmod(rel(p), perm&0o777))
}

// Rename implements experimentalsys.FS.
func (r *rootFS) Rename(from, to string) experimentalsys.Errno {
	var size int64
	replaced := false
	if fi, err := r.root.Lstat(rel(to)); err == nil && !fi.IsDir() {
		replaced = true
		if fi.Mode().IsRegular() {
			size = fi.Size()
		}
	}
	if err := r.root.Rename(rel(from), rel(to)); err != nil {
		return errno(err)
	}
	if replaced {
		r.q.removed(size)
	}
	return 0
}

// Rmdir implements experimentalsys.FS.
func (r *rootFS) Rmdir(p string) experimentalsys.Errno {
	fi, err := r.root.Lstat(rel(p))
	if err != nil {
		return errno(err)
	}
	if !fi.IsDir() {
		return experimentalsys.ENOTDIR
	}
	if err := r.root.Remove(rel(p)); err != nil {
		return errno(err)
	}
	r.q.removed(0)
	return 0
}

// Unlink implements experimentalsys.FS.
func (r *rootFS) Unlink(p string) experimentalsys.Errno {
	fi, err := r.root.Lstat(rel(p))
	if err != nil {
		return errno(err)
	}
	if fi.IsDir() {
		return experimentalsys.EISDIR
	}
	if err := r.root.Remove(rel(p)); err != nil {
		return errno(err)
	}
	var size int64
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Nlink <= 1 && fi.Mode().IsRegular() {
		size = fi.Size()
	}
	r.q.removed(size)
	return 0
}

// Link implements experimentalsys.FS.
func (r *rootFS) Link(oldPath, newPath string) experimentalsys.Errno {
	if e := r.q.addFile(); e != 0 {
		return e
	}
	if err := r.root.Link(rel(oldPath), rel(newPath)); err != nil {
		r.q.removed(0)
		return errno(err)
	}
	return 0
}

// Symlink implements experimentalsys.FS. The link is created as the guest
// wrote it (resolution through os.Root keeps it inside when followed), but
// an absolute target is refused, as WASI's path resolution rules say.
func (r *rootFS) Symlink(oldPath, linkName string) experimentalsys.Errno {
	if path.IsAbs(oldPath) {
		return experimentalsys.EPERM
	}
	if e := r.q.addFile(); e != 0 {
		return e
	}
	if err := r.root.Symlink(oldPath, rel(linkName)); err != nil {
		r.q.removed(0)
		return errno(err)
	}
	return 0
}

// Readlink implements experimentalsys.FS.
func (r *rootFS) Readlink(p string) (string, experimentalsys.Errno) {
	s, err := r.root.Readlink(rel(p))
	return s, errno(err)
}

// Utimens implements experimentalsys.FS.
func (r *rootFS) Utimens(p string, atim, mtim int64) experimentalsys.Errno {
	fi, err := r.root.Stat(rel(p))
	if err != nil {
		return errno(err)
	}
	a, m := times(fi, atim, mtim)
	return errno(r.root.Chtimes(rel(p), a, m))
}

func times(fi fs.FileInfo, atim, mtim int64) (time.Time, time.Time) {
	a, m := fi.ModTime(), fi.ModTime()
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		a = time.Unix(st.Atim.Sec, st.Atim.Nsec)
	}
	if atim != experimentalsys.UTIME_OMIT {
		a = time.Unix(0, atim)
	}
	if mtim != experimentalsys.UTIME_OMIT {
		m = time.Unix(0, mtim)
	}
	return a, m
}

// file is an open file of rootFS: an *os.File opened through the root,
// whose writes are bounded by the quota.
type file struct {
	experimentalsys.UnimplementedFile
	f      *os.File
	q      *quota
	append bool
	closed bool
}

func (f *file) Dev() (uint64, experimentalsys.Errno) {
	st, e := f.Stat()
	return st.Dev, e
}

func (f *file) Ino() (sys.Inode, experimentalsys.Errno) {
	st, e := f.Stat()
	return st.Ino, e
}

func (f *file) IsDir() (bool, experimentalsys.Errno) {
	st, e := f.Stat()
	return st.Mode.IsDir(), e
}

func (f *file) IsAppend() bool { return f.append }

func (f *file) SetAppend(enable bool) experimentalsys.Errno {
	// Reopening by name could race a rename into something else: refuse.
	if enable != f.append {
		return experimentalsys.ENOSYS
	}
	return 0
}

func (f *file) Stat() (sys.Stat_t, experimentalsys.Errno) {
	fi, err := f.f.Stat()
	if err != nil {
		return sys.Stat_t{}, errno(err)
	}
	return sys.NewStat_t(fi), 0
}

func (f *file) Read(buf []byte) (int, experimentalsys.Errno) {
	n, err := f.f.Read(buf)
	if err == io.EOF {
		err = nil
	}
	return n, errno(err)
}

func (f *file) Pread(buf []byte, off int64) (int, experimentalsys.Errno) {
	n, err := f.f.ReadAt(buf, off)
	if err == io.EOF {
		err = nil
	}
	return n, errno(err)
}

// seekOffset is int64 under another name: Seek here is WASI's (it returns
// an Errno, not an error), which go vet's stdmethods check would take for
// a misspelt io.Seeker.
type seekOffset = int64

func (f *file) Seek(offset seekOffset, whence int) (int64, experimentalsys.Errno) {
	n, err := f.f.Seek(offset, whence)
	return n, errno(err)
}

func (f *file) Readdir(n int) ([]experimentalsys.Dirent, experimentalsys.Errno) {
	ents, err := f.f.ReadDir(n)
	if err == io.EOF {
		err = nil
	}
	out := make([]experimentalsys.Dirent, 0, len(ents))
	for _, e := range ents {
		out = append(out, experimentalsys.Dirent{Name: e.Name(), Type: e.Type()})
	}
	return out, errno(err)
}

// reserve checks a write of n bytes at off against the file-size and
// workspace limits and accounts for the growth.
func (f *file) reserve(off int64, n int) experimentalsys.Errno {
	fi, err := f.f.Stat()
	if err != nil {
		return errno(err)
	}
	size := fi.Size()
	if off < 0 {
		off = size // append
	}
	end := off + int64(n)
	if f.q.maxFile > 0 && end > f.q.maxFile {
		f.q.mu.Lock()
		f.q.hitFileSize = true
		f.q.mu.Unlock()
		return errLimit
	}
	if end > size {
		return f.q.grow(end - size)
	}
	return 0
}

func (f *file) Write(buf []byte) (int, experimentalsys.Errno) {
	if len(buf) == 0 {
		return 0, 0
	}
	off := int64(-1)
	if !f.append {
		cur, err := f.f.Seek(0, io.SeekCurrent)
		if err != nil {
			return 0, errno(err)
		}
		off = cur
	}
	if e := f.reserve(off, len(buf)); e != 0 {
		return 0, e
	}
	n, err := f.f.Write(buf)
	return n, errno(err)
}

func (f *file) Pwrite(buf []byte, off int64) (int, experimentalsys.Errno) {
	if len(buf) == 0 {
		return 0, 0
	}
	if e := f.reserve(off, len(buf)); e != 0 {
		return 0, e
	}
	n, err := f.f.WriteAt(buf, off)
	return n, errno(err)
}

func (f *file) Truncate(size int64) experimentalsys.Errno {
	fi, err := f.f.Stat()
	if err != nil {
		return errno(err)
	}
	if size > fi.Size() {
		if e := f.reserve(size, 0); e != 0 {
			return e
		}
		if e := f.q.grow(size - fi.Size()); e != 0 {
			return e
		}
	} else {
		f.q.grow(size - fi.Size())
	}
	return errno(f.f.Truncate(size))
}

func (f *file) Sync() experimentalsys.Errno     { return errno(f.f.Sync()) }
func (f *file) Datasync() experimentalsys.Errno { return errno(f.f.Sync()) }

func (f *file) Utimens(atim, mtim int64) experimentalsys.Errno {
	fi, err := f.f.Stat()
	if err != nil {
		return errno(err)
	}
	a, m := times(fi, atim, mtim)
	// By name would race a rename: through /proc/self/fd of our own fd.
	return errno(os.Chtimes("/proc/self/fd/"+itoa(int(f.f.Fd())), a, m))
}

func (f *file) Close() experimentalsys.Errno {
	if f.closed {
		return 0
	}
	f.closed = true
	f.q.closed()
	return errno(f.f.Close())
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var b [20]byte
	i := len(b)
	for n > 0 {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
	}
	return string(b[i:])
}
