package ociruntime

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// maxLayers bounds the directories of a container's root (one
// SCM_RIGHTS message carries at most 253 descriptors, binds included).
const maxLayers = 128

// rootLayers returns the directories the container's root is made of,
// top first, each to be id-mapped on its own: the rootfs itself, or, when
// it is an overlay mount (containerd's overlayfs snapshotter and Docker's
// overlay2 mount it so before calling create), that overlay's upper and
// lower directories. An overlay mount cannot be id-mapped (overlayfs
// lacks FS_ALLOW_IDMAP); its layers, on ext4 or xfs, can.
func rootLayers(rootfs string) ([]string, error) {
	real, err := filepath.EvalSymlinks(rootfs)
	if err != nil {
		return nil, fmt.Errorf("container root %s: %w", rootfs, err)
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	fstype, opts, found := mountAt(mi, real)
	if !found || fstype != "overlay" {
		return []string{rootfs}, nil
	}
	layers, err := overlayLayers(opts)
	if err != nil {
		return nil, fmt.Errorf("container root %s is an overlay mount: %w", rootfs, err)
	}
	return layers, nil
}

// mountAt finds the topmost mount on dir in a mountinfo table and returns
// its filesystem type and super options.
func mountAt(mountinfo []byte, dir string) (fstype, superOpts string, found bool) {
	sc := bufio.NewScanner(bytes.NewReader(mountinfo))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		f := strings.Fields(pre)
		g := strings.Fields(post)
		if len(f) < 5 || len(g) < 3 {
			continue
		}
		if unescape(f[4]) == dir {
			fstype, superOpts, found = g[0], g[2], true
		}
	}
	return fstype, superOpts, found
}

// overlayLayers reads an overlay's super options: upperdir (if any)
// first, then lowerdir's directories, top first. Paths must be absolute:
// a relative lowerdir (Docker shortens long ones so) is refused.
func overlayLayers(superOpts string) ([]string, error) {
	var upper string
	var lower []string
	for _, o := range strings.Split(superOpts, ",") {
		k, v, _ := strings.Cut(o, "=")
		switch k {
		case "upperdir":
			upper = unescape(v)
		case "lowerdir":
			for _, l := range strings.Split(v, ":") {
				if l == "" {
					continue // "::" separates data-only layers: none here
				}
				lower = append(lower, unescape(l))
			}
		}
	}
	layers := lower
	if upper != "" {
		layers = append([]string{upper}, lower...)
	}
	if len(lower) == 0 {
		return nil, fmt.Errorf("no lowerdir in its options %q", superOpts)
	}
	if len(layers) > maxLayers {
		return nil, fmt.Errorf("%d layers; Moat takes at most %d", len(layers), maxLayers)
	}
	for _, l := range layers {
		if !filepath.IsAbs(l) || filepath.Clean(l) != l {
			return nil, fmt.Errorf("layer %q is not a clean absolute path; use a snapshotter that mounts with absolute layer paths", l)
		}
	}
	return layers, nil
}

// unescape undoes mountinfo's octal escapes (\040 for a space).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
