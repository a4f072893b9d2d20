package gvisor

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/moat-sandbox/moat/tier"
)

// maxTrustBundle bounds the image's CA bundle read (Debian's is about
// 220 KiB).
const maxTrustBundle = 8 << 20

// trustMounts makes the sandbox trust spec.TrustPEM (the egress proxy's
// run CA) for the run: the image's CA bundle plus the run CA are written
// to a file in the run's private state directory and bound read-only at
// tier.TrustFile, and over tier.TrustBundle when the image has one. The
// image's bundle is read through an os.Root of the image, so a symlink in
// the image cannot make the host read one of its own files. tmp is the
// host directory behind the sandbox's /tmp, where the mount point is
// made (root's, read-only, so it is never a file the program could
// have planted).
func trustMounts(spec *tier.Spec, tmp string) ([]ociMount, error) {
	if len(spec.TrustPEM) == 0 {
		return nil, nil
	}
	bundle, imageHas, err := imageBundle(spec.ImageRoot)
	if err != nil {
		return nil, err
	}
	data := append(append(bundle, '\n'), spec.TrustPEM...)
	src := filepath.Join(spec.StateDir, "trust.pem")
	if err := os.WriteFile(src, data, 0o444); err != nil {
		return nil, fmt.Errorf("write the run CA bundle: %w", err)
	}
	point := filepath.Join(tmp, filepath.Base(tier.TrustFile))
	if filepath.Dir(tier.TrustFile) != "/tmp" {
		return nil, fmt.Errorf("the trust file %s is not in /tmp", tier.TrustFile)
	}
	f, err := os.OpenFile(point, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return nil, fmt.Errorf("make the mount point of the run CA bundle: %w", err)
	}
	f.Close()
	opts := []string{"bind", "ro", "nosuid", "nodev", "noexec"}
	mounts := []ociMount{{Destination: tier.TrustFile, Type: "bind", Source: src, Options: opts}}
	if imageHas {
		mounts = append(mounts, ociMount{Destination: tier.TrustBundle, Type: "bind", Source: src, Options: opts})
	}
	return mounts, nil
}

// imageBundle reads the image's system CA bundle, if it has one as a
// regular file (after symlinks inside the image).
func imageBundle(imageRoot string) ([]byte, bool, error) {
	root, err := os.OpenRoot(imageRoot)
	if err != nil {
		return nil, false, fmt.Errorf("open the image root: %w", err)
	}
	defer root.Close()
	f, err := root.Open(strings.TrimPrefix(tier.TrustBundle, "/"))
	if err != nil {
		return nil, false, nil
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		return nil, false, nil
	}
	b, err := io.ReadAll(io.LimitReader(f, maxTrustBundle+1))
	if err != nil || len(b) > maxTrustBundle {
		return nil, false, fmt.Errorf("read the image's CA bundle %s: too large or unreadable", tier.TrustBundle)
	}
	return bytes.Clone(b), true, nil
}
