// Package idshift moves the ownership of a directory tree into a user
// namespace's host id range and back: how an image build step's tree,
// owned by the host's ids, becomes writable by the step's uid 0 (the
// range's first id), and how the files the step wrote come out owned by
// the ids they had inside.
//
// It must never follow a symbolic link or leave the tree: the tree was
// written by untrusted code. Every change is an lchown of an entry found
// by a walk that does not follow links, and the walk runs only while no
// process of the sandbox is alive (the caller's duty), so nothing can
// swap a directory for a link under it.
package idshift

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"
)

// Range is the number of ids a user namespace maps (0..Range-1).
const Range = 65536

// In maps every owner and group x of the tree at root to base+x. An id
// at or above Range has no id inside the namespace: refused, naming the
// entry, before the tree is changed further (Out undoes what was done).
func In(root string, base int) error {
	return walk(root, func(path string, id int) (int, error) {
		if id < 0 || id >= Range {
			return 0, fmt.Errorf("%s is owned by id %d, which a build step's user namespace cannot map (ids 0-%d): fix the image's ownership first", path, id, Range-1)
		}
		return base + id, nil
	})
}

// Out maps every owner and group base+x of the tree at root back to x.
// Ids outside the range are left as they are: the sandbox could not have
// set them, and a file already mapped back (a second hard link to it, an
// earlier Out) is among them.
func Out(root string, base int) error {
	return walk(root, func(_ string, id int) (int, error) {
		if id >= base && id < base+Range {
			return id - base, nil
		}
		return id, nil
	})
}

// walk lchowns every entry of root, root included, to what mapID says.
// Hard links are visited once (by device and inode), so that no id is
// mapped twice. A set-user-ID or set-group-ID bit, which chown clears on
// a regular file, is put back: the shift must not change the image.
func walk(root string, mapID func(path string, id int) (int, error)) error {
	fi, err := os.Lstat(root)
	if err != nil {
		return fmt.Errorf("shift ownership of %s: %w", root, err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("shift ownership of %s: not a directory (%s)", root, fi.Mode().Type())
	}
	type inode struct{ dev, ino uint64 }
	seen := map[inode]bool{}
	return filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("shift ownership: %w", err)
		}
		info, err := d.Info() // lstat: WalkDir never follows links
		if err != nil {
			return fmt.Errorf("shift ownership: %w", err)
		}
		st, ok := info.Sys().(*syscall.Stat_t)
		if !ok {
			return fmt.Errorf("shift ownership of %s: no owner", path)
		}
		if !info.IsDir() && st.Nlink > 1 {
			k := inode{uint64(st.Dev), st.Ino}
			if seen[k] {
				return nil
			}
			seen[k] = true
		}
		uid, err := mapID(path, int(st.Uid))
		if err != nil {
			return err
		}
		gid, err := mapID(path, int(st.Gid))
		if err != nil {
			return err
		}
		if uid == int(st.Uid) && gid == int(st.Gid) {
			return nil
		}
		if err := unix.Lchown(path, uid, gid); err != nil {
			return fmt.Errorf("shift ownership of %s: %w", path, err)
		}
		if mode := info.Mode(); mode.IsRegular() && mode&(fs.ModeSetuid|fs.ModeSetgid) != 0 {
			// A regular file, not a link: chmod cannot be redirected.
			if err := unix.Fchmodat(unix.AT_FDCWD, path, uint32(st.Mode&07777), unix.AT_SYMLINK_NOFOLLOW); err != nil && !errors.Is(err, unix.EOPNOTSUPP) {
				return fmt.Errorf("restore the mode of %s after shifting its owner: %w", path, err)
			}
		}
		return nil
	})
}

// markerName is the file in a run's private directory that says a tree
// is shifted: written before In starts, removed after Out succeeded.
const markerName = "shifted-tree.json"

type marker struct {
	Root string `json:"root"`
	Base int    `json:"base"`
}

// Mark records in stateDir (a run's private directory) that root is being
// shifted to base, so that the garbage collection of a run whose moat
// died puts the tree back (Restore).
func Mark(stateDir, root string, base int) error {
	b, err := json.Marshal(marker{Root: root, Base: base})
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(stateDir, markerName), b, 0o600); err != nil {
		return fmt.Errorf("record the build tree's shifted ownership: %w", err)
	}
	return nil
}

// Unmark removes stateDir's record once the tree is back.
func Unmark(stateDir string) error {
	if err := os.Remove(filepath.Join(stateDir, markerName)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// Restore puts back the tree a dead run's stateDir says is shifted, and
// removes the record; without a record it does nothing. Call it only once
// every process of that run is gone. A tree that no longer exists (the
// builder removed it) is nothing to restore.
func Restore(stateDir string) (root string, err error) {
	b, err := os.ReadFile(filepath.Join(stateDir, markerName))
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	var m marker
	if err := json.Unmarshal(b, &m); err != nil || !filepath.IsAbs(m.Root) || m.Base < Range {
		return "", fmt.Errorf("%s: not a shifted-tree record (%v)", filepath.Join(stateDir, markerName), err)
	}
	if _, err := os.Lstat(m.Root); errors.Is(err, fs.ErrNotExist) {
		return m.Root, Unmark(stateDir)
	}
	if err := Out(m.Root, m.Base); err != nil {
		return m.Root, err
	}
	return m.Root, Unmark(stateDir)
}
