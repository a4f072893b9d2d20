package vmagent

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/guest/vmagent/vmwire"
	"github.com/moat-sandbox/moat/internal/rootfs"
)

// maxTrustBundle bounds the image's CA bundle the agent reads (Debian's
// is about 220 KiB).
const maxTrustBundle = 8 << 20

// installTrust makes the command trust the egress proxy's run CA for the
// run: the image's bundle plus the run CA go to TrustFile below newRoot
// (in /tmp, the tmpfs mountRun made; created exclusively, then bound
// read-only on itself), and over the image's bundle when it has one. The
// image's bundle is read through an os.Root of newRoot, so a symlink in
// the image resolves inside the image, never to the agent's own files.
func installTrust(req *vmwire.Request) error {
	if len(req.TrustPEM) == 0 {
		return nil
	}
	if !filepath.IsAbs(req.TrustFile) || !filepath.IsAbs(req.TrustBundle) {
		return fmt.Errorf("request: trust paths %q, %q are not absolute", req.TrustFile, req.TrustBundle)
	}
	root, err := os.OpenRoot(newRoot)
	if err != nil {
		return fmt.Errorf("open the image root: %w", err)
	}
	defer root.Close()
	var bundle []byte
	imageHas := false
	if f, err := root.Open(strings.TrimPrefix(req.TrustBundle, "/")); err == nil {
		if fi, err := f.Stat(); err == nil && fi.Mode().IsRegular() {
			bundle, err = io.ReadAll(io.LimitReader(f, maxTrustBundle+1))
			if err != nil || len(bundle) > maxTrustBundle {
				f.Close()
				return fmt.Errorf("read the image's CA bundle %s: too large or unreadable", req.TrustBundle)
			}
			imageHas = true
		}
		f.Close()
	}
	data := append(append(bundle, '\n'), req.TrustPEM...)
	f, err := root.OpenFile(strings.TrimPrefix(req.TrustFile, "/"), os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o444)
	if err != nil {
		return fmt.Errorf("write the run CA bundle: %w", err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("write the run CA bundle: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write the run CA bundle: %w", err)
	}
	file := filepath.Join(newRoot, req.TrustFile)
	targets := []string{file}
	if imageHas {
		targets = append(targets, filepath.Join(newRoot, req.TrustBundle))
	}
	for _, t := range targets {
		if err := unix.Mount(file, t, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind the run CA bundle at %s: %w", t, err)
		}
		if err := rootfs.SetAttr(t, unix.MOUNT_ATTR_RDONLY|unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOEXEC); err != nil {
			return fmt.Errorf("make %s read-only: %w", t, err)
		}
	}
	return nil
}
