package image

import (
	"bytes"
	"fmt"
	"io/fs"
	"os/exec"
	"path/filepath"
	"strconv"
)

// WriteExt4 writes the tree at root (an image's root, owners and modes
// included) into a new ext4 filesystem file at out, sized for the tree
// plus headroom, without mounting anything on the host (mkfs.ext4 -d).
// The microvm tier boots guests from such a file; tests that boot a VM
// attach one.
func WriteExt4(root, out string) error {
	var size, inodes int64
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		inodes++
		if fi, err := d.Info(); err == nil && fi.Mode().IsRegular() {
			size += (fi.Size() + 4095) &^ 4095
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("measure %s: %w", root, err)
	}
	// Headroom for metadata: inode tables, directories, bitmaps.
	blocks := (size+inodes*4096)/4096*5/4 + 8192
	cmd := exec.Command("mkfs.ext4", "-q", "-F", "-b", "4096", "-N", strconv.FormatInt(inodes+1024, 10),
		"-O", "^has_journal,^resize_inode", "-E", "root_owner=0:0", "-L", "moat-image", "-d", root, out, strconv.FormatInt(blocks, 10))
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("mkfs.ext4: %v: %s", err, bytes.TrimSpace(b))
	}
	return nil
}
