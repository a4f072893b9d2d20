// Package rootfs holds the two mount steps that the native tier's init
// (guest/nsinit) and the microVM tier's VMM jail (tier/microvm/jail) share
// when they make a new root for themselves.
package rootfs

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// PivotInto makes root, a mount point, the calling process's root and detaches
// the old one, with everything mounted below it. pivot_root(".", ".")
// stacks the old root on top of the new one, so detaching "." leaves only
// root: runc's technique, which needs no put_old directory in a root that
// is read-only. The caller must be in a mount namespace of its own.
func PivotInto(root string) error {
	if err := unix.Chdir(root); err != nil {
		return fmt.Errorf("chdir %s: %w", root, err)
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach the old root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return fmt.Errorf("chdir /: %w", err)
	}
	return nil
}

// SetAttr sets attr (MOUNT_ATTR_*) on the mount at path, not following a
// final symlink. mount_setattr changes only the named attributes, where a
// classic MS_REMOUNT would have to repeat the mount's locked flags.
func SetAttr(path string, attr uint64) error {
	return unix.MountSetattr(unix.AT_FDCWD, path, unix.AT_SYMLINK_NOFOLLOW, &unix.MountAttr{Attr_set: attr})
}
