package microvm

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/moat-sandbox/moat/tier"
)

// This file is the workspace transfer: the host workspace goes to the guest
// as a tar, and comes back as one, extracted without trusting its names.

// sendWorkspace tars the host workspace (the engine's copied inputs).
func sendWorkspace(dir string, w io.Writer) error {
	tw := tar.NewWriter(w)
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	err = fs.WalkDir(root.FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == "." {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			if link, err = root.Readlink(p); err != nil {
				return err
			}
		} else if !fi.Mode().IsRegular() && !fi.IsDir() {
			return nil
		}
		h, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		h.Name, h.Uid, h.Gid, h.Uname, h.Gname = p, 0, 0, "", ""
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			f, err := root.Open(p)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = io.CopyN(tw, f, fi.Size())
			return err
		}
		return nil
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

var errWorkspaceLimit = errors.New("workspace over its limit")

// extractWorkspace replaces the host workspace with the guest's tar,
// resolving every path inside dir (os.Root: no .., no symlink escapes),
// creating only directories, regular files and symlinks, and stopping at
// the workspace limits (the engine's diff then reports what is there).
func extractWorkspace(r io.Reader, dir string, lim tier.Limits) error {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	maxBytes, maxFiles := lim.WorkspaceBytes, lim.WorkspaceFiles
	if maxBytes <= 0 {
		maxBytes = 1 << 30
	}
	if maxFiles <= 0 {
		maxFiles = 100000
	}
	var total int64
	var files int
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		name := filepath.Clean(h.Name)
		if !filepath.IsLocal(name) {
			return fmt.Errorf("entry %q is outside the workspace", sanitize([]byte(h.Name)))
		}
		files++
		if files > maxFiles+1 || h.Size > maxBytes-total {
			return errWorkspaceLimit
		}
		perm := fs.FileMode(h.Mode) & 0o777
		switch h.Typeflag {
		case tar.TypeDir:
			if err := root.MkdirAll(name, 0o755); err != nil {
				return err
			}
			root.Chmod(name, perm|0o700)
		case tar.TypeReg:
			f, err := root.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_WRONLY, perm)
			if err != nil {
				return err
			}
			n, err := io.Copy(f, io.LimitReader(tr, h.Size))
			f.Close()
			total += n
			if err != nil {
				return err
			}
			root.Chtimes(name, h.ModTime, h.ModTime)
		case tar.TypeSymlink:
			if err := root.Symlink(h.Linkname, name); err != nil {
				return err
			}
		}
	}
}
