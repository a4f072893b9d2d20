package incident

import (
	"archive/tar"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// Export writes bundle id as a tar.gz to file (entries under "ID/"),
// created 0600; it refuses to overwrite an existing file (or follow a
// symlink there). A failed export removes what it wrote.
func (s *Store) Export(id, file string) (err error) {
	p, err := s.Path(id)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(file, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("export incident %s: %s exists; choose a new file name (export never overwrites): %w", id, file, ErrExists)
	}
	if err != nil {
		return fmt.Errorf("export incident %s: %w", id, err)
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			os.Remove(file)
		}
	}()
	// The umask cannot widen 0600, but a pre-set ACL default could:
	// say exactly what the file is.
	if err := f.Chmod(0o600); err != nil {
		return err
	}
	gz := gzip.NewWriter(f)
	tw := tar.NewWriter(gz)
	err = filepath.WalkDir(p, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(p, path)
		if err != nil {
			return err
		}
		name := filepath.ToSlash(filepath.Join(id, rel))
		fi, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: 0o500, ModTime: fi.ModTime()})
		case fi.Mode().IsRegular():
			src, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
			if err != nil {
				return err
			}
			defer src.Close()
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o400, Size: fi.Size(), ModTime: fi.ModTime()}); err != nil {
				return err
			}
			_, err = io.CopyN(tw, src, fi.Size())
			return err
		}
		// Keep writes only directories and regular files.
		return fmt.Errorf("%s: not a file or directory; the bundle was altered", name)
	})
	if err != nil {
		return fmt.Errorf("export incident %s: %w", id, err)
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return gz.Close()
}
