package image

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"
)

// The image's own account database. Nothing is copied from the host: the
// sandbox must not learn the host's user names, and a uid that means
// "admin" on the host must mean nothing here. The password field "*" never
// matches any password, and there is no shadow file.
const (
	imagePasswd = "root:*:0:0:root:/root:/bin/bash\n" +
		"sandbox:*:1000:1000:sandbox:/workspace:/bin/bash\n" +
		"nobody:*:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
	// 65534 is "nogroup" on Debian, as on the host and in every package's
	// expectations.
	imageGroup = "root:x:0:\n" +
		"sandbox:x:1000:\n" +
		"nogroup:x:65534:\n"
	imageHosts = "127.0.0.1\tlocalhost\n" +
		"::1\tlocalhost ip6-localhost ip6-loopback\n"
	imageHostname = "sandbox\n"
)

// mountPoints must exist, empty, for the sandbox to mount over. Their modes
// are what the kernel and FHS expect; /tmp is world-writable with the sticky
// bit so users cannot delete each other's files.
var mountPoints = []struct {
	path string
	mode os.FileMode
}{
	{"workspace", 0o755},
	{"proc", 0o555},
	{"sys", 0o555},
	{"dev", 0o755},
	{"run", 0o755},
	{"tmp", 0o777 | os.ModeSticky},
}

// scrubbed are removed from the tree. Most were written during the build and
// would make two builds differ (logs, caches, backups of files we replace);
// the shadow files belong to accounts we just replaced.
var scrubbed = []string{
	"etc/machine-id", // identifies the build host to D-Bus/systemd consumers
	"var/lib/dbus/machine-id",
	"etc/passwd-", "etc/group-",
	"etc/shadow", "etc/shadow-", "etc/gshadow", "etc/gshadow-",
	"etc/subuid", "etc/subgid", "etc/subuid-", "etc/subgid-",
	"var/lib/dpkg/status-old", "var/lib/dpkg/diversions-old",
	"var/lib/dpkg/statoverride-old", "var/lib/dpkg/available-old",
}

// emptied keep their directory but lose all contents: build logs and caches
// (timestamps, apt indexes, ldconfig aux-cache) and whatever the build left
// in the mount points, which the sandbox covers anyway. /dev is emptied so
// no device node ships in an image, even though the sandbox mounts nodev.
var emptied = []string{
	"var/log", "var/cache", "var/lib/apt/lists", "var/backups", "var/tmp",
	"dev", "proc", "sys", "run", "tmp",
}

// finalize turns a freshly bootstrapped tree into an image tree. All file
// operations go through an os.Root opened on the tree: the tree's own
// symlinks (e.g. an absolute /etc/resolv.conf -> /run/...) would otherwise
// redirect our writes to the host's files. The files it writes are
// forgotten in sums (nil: none), which an import's extractor filled
// (filesums.go).
func finalize(rootPath string, sums *fileSums) error {
	root, err := os.OpenRoot(rootPath)
	if err != nil {
		return fmt.Errorf("finalize: %w", err)
	}
	defer root.Close()

	// An imported image decides what its parents are: a /var that is a
	// symlink (out of the tree, which os.Root refuses to follow) has no
	// var/log of the image's own to scrub, and a shadow file may be a
	// directory. Neither is a reason to fail the import.
	for _, p := range scrubbed {
		if !underRealDirs(root, p) {
			continue
		}
		if err := root.RemoveAll(p); err != nil {
			return fmt.Errorf("finalize: remove %s: %w", p, err)
		}
	}
	for _, p := range emptied {
		if !underRealDirs(root, p) {
			continue
		}
		if err := emptyDir(root, p); err != nil {
			return fmt.Errorf("finalize: empty %s: %w", p, err)
		}
	}
	files := []struct {
		path, content string
	}{
		{"etc/passwd", imagePasswd},
		{"etc/group", imageGroup},
		{"etc/hosts", imageHosts},
		{"etc/hostname", imageHostname},
		// mmdebstrap copies the host's resolv.conf in. The sandbox has no
		// DNS, but the file stays (empty) as a mount point in case a tier
		// wants to provide a resolver later.
		{"etc/resolv.conf", ""},
	}
	for _, f := range files {
		if err := replaceFile(root, f.path, f.content, sums); err != nil {
			return fmt.Errorf("finalize: %w", err)
		}
	}
	for _, mp := range mountPoints {
		// An imported image may have put a file or a symlink (to /etc,
		// or out of the tree) where a mount point goes; every run
		// mounts over these paths, so nothing of it would be seen:
		// replace it with the directory, as emptied does for the rest.
		if fi, err := root.Lstat(mp.path); err == nil && !fi.IsDir() {
			if err := root.Remove(mp.path); err != nil {
				return fmt.Errorf("finalize: replace mount point /%s (a %s): %w", mp.path, fi.Mode().Type(), err)
			}
		}
		if err := root.MkdirAll(mp.path, 0o755); err != nil {
			return fmt.Errorf("finalize: mount point /%s: %w", mp.path, err)
		}
		fi, err := root.Lstat(mp.path)
		if err != nil {
			return fmt.Errorf("finalize: mount point /%s: %w", mp.path, err)
		}
		if !fi.IsDir() {
			return fmt.Errorf("finalize: mount point /%s is not a directory", mp.path)
		}
		// Chmod explicitly: MkdirAll is subject to umask and does not
		// change an existing directory.
		if err := root.Chmod(mp.path, mp.mode); err != nil {
			return fmt.Errorf("finalize: mount point /%s: %w", mp.path, err)
		}
	}
	if err := scrubTree(root, rootPath, sums); err != nil {
		return fmt.Errorf("finalize: %w", err)
	}
	return nil
}

// underRealDirs reports whether every parent directory of p (a slash
// path relative to root) is a real directory, not a symlink: only then is
// p the tree's own entry rather than one a link points at.
func underRealDirs(root *os.Root, p string) bool {
	parts := strings.Split(p, "/")
	cur := ""
	for _, part := range parts[:len(parts)-1] {
		cur = path.Join(cur, part)
		fi, err := root.Lstat(cur)
		if err != nil || !fi.IsDir() {
			return false
		}
	}
	return true
}

// replaceFile removes path (whatever it is, possibly a symlink) and creates
// it afresh with content, mode 0644, so we never write through a link. The
// new file may have the inode number of one the extractor remembered a
// moment ago: sums forgets it.
func replaceFile(root *os.Root, path, content string, sums *fileSums) error {
	if err := root.RemoveAll(path); err != nil {
		return fmt.Errorf("replace %s: %w", path, err)
	}
	f, err := root.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return fmt.Errorf("replace %s: %w", path, err)
	}
	if err := sums.forget(f); err != nil {
		f.Close()
		return fmt.Errorf("replace %s: %w", path, err)
	}
	if _, err := f.WriteString(content); err != nil {
		f.Close()
		return fmt.Errorf("replace %s: %w", path, err)
	}
	// Set the mode explicitly, independent of the process umask.
	if err := f.Chmod(0o644); err != nil {
		f.Close()
		return fmt.Errorf("replace %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("replace %s: %w", path, err)
	}
	return nil
}

// emptyDir removes everything inside dir, if dir exists as a real directory.
func emptyDir(root *os.Root, dir string) error {
	fi, err := root.Lstat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		// e.g. /var/run -> /run style links: replace with nothing; the
		// mount-point pass recreates the ones we need as directories.
		return root.Remove(dir)
	}
	d, err := root.Open(dir)
	if err != nil {
		return err
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return err
	}
	for _, n := range names {
		if err := root.RemoveAll(dir + "/" + n); err != nil {
			return err
		}
	}
	return nil
}

// scrubTree walks the tree once and removes privileges and special files:
//
//   - setuid and setgid bits are cleared on every file and directory. The
//     sandbox mounts the image nosuid anyway; this is defence in depth, so a
//     tier that forgets nosuid still has no setuid binary (su, newgrp,
//     unix_chkpwd) to attack.
//   - security.capability xattrs (file capabilities, setuid's finer-grained
//     cousin) are removed for the same reason.
//   - device nodes, FIFOs and sockets are deleted: an image is a tree of
//     files; the sandbox provides its own /dev.
//
// A regular file an import's extractor wrote and nothing has changed since
// (sums vouches for its inode, size, mtime and ctime: filesums.go) keeps
// its xattrs untouched: it has none to remove. The extractor creates every
// file with O_EXCL and sets no xattr, a new file gets none but an LSM label
// or an ACL its directory hands down, and a setxattr since would have
// changed its ctime. That spares one path lookup and syscall per file of
// an import.
//
// Python's __pycache__ stays: with SOURCE_DATE_EPOCH set, py_compile writes
// hash-checked .pyc files, which came out byte-identical across builds, and
// on a read-only root Python could not cache them later (import numpy would
// recompile on every run).
func scrubTree(root *os.Root, rootPath string, sums *fileSums) error {
	return filepath.WalkDir(rootPath, func(path string, d fs.DirEntry, walkErr error) error {
		if walkErr != nil {
			return walkErr
		}
		rel, err := filepath.Rel(rootPath, path)
		if err != nil {
			return err
		}
		if rel == "." {
			return nil
		}
		rel = filepath.ToSlash(rel)
		// The walk's own lstat of path: its parents are real
		// directories (WalkDir never descends links), and root.Lstat
		// would walk them again from the root, an openat and a close
		// per component of every entry. What is changed goes through
		// root.
		fi, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			return nil // links carry no mode bits or capabilities
		case fi.Mode()&(fs.ModeDevice|fs.ModeCharDevice|fs.ModeNamedPipe|fs.ModeSocket) != 0:
			if err := root.Remove(rel); err != nil {
				return fmt.Errorf("remove special file %s: %w", rel, err)
			}
			return nil
		}
		if fi.Mode()&(fs.ModeSetuid|fs.ModeSetgid) != 0 {
			// os.Root.Chmod takes Go mode bits; keep the sticky bit.
			mode := fi.Mode().Perm() | fi.Mode()&fs.ModeSticky
			if err := root.Chmod(rel, mode); err != nil {
				return fmt.Errorf("clear setuid/setgid on %s: %w", rel, err)
			}
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && fi.Mode().IsRegular() && sums.vouches(st) {
			return nil
		}
		// The syscall package's xattr calls follow links; rel is not a
		// link (checked above) and its parents are real directories
		// (WalkDir never descends links), so this acts on rel itself.
		err = syscall.Removexattr(path, "security.capability")
		if err != nil && !errors.Is(err, syscall.ENODATA) && !errors.Is(err, syscall.ENOTSUP) {
			return fmt.Errorf("remove file capabilities of %s: %w", rel, err)
		}
		return nil
	})
}
