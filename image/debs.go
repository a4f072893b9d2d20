package image

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path"
	"regexp"
	"sort"
	"strings"
	"syscall"
)

// ArchivesDir is apt's download cache inside a tree, where mmdebstrap
// (told to keep them) and apt-get leave the .deb files they fetched.
const ArchivesDir = "var/cache/apt/archives"

// maxArchiveEntries bounds the directory listing of ArchivesDir: a large
// image has a few thousand packages.
const maxArchiveEntries = 100000

// Deb is one .deb file in a tree's ArchivesDir: the package, version and
// architecture from apt's file name, and the sha256 of its bytes.
type Deb struct {
	Name, Version, Arch string
	// SHA256 is "sha256:" and the hex digest of the file.
	SHA256 string
}

var (
	// debPackage is a Debian package name (Debian policy §5.6.1).
	debPackage = regexp.MustCompile(`^[a-z0-9][a-z0-9+.-]+$`)
	// debVersion is [epoch:]upstream[-revision] (policy §5.6.12).
	debVersion = regexp.MustCompile(`^([0-9]+:)?[A-Za-z0-9.+~-]+$`)
	debArch    = regexp.MustCompile(`^[a-z0-9-]+$`)
)

// ParseDebFileName splits apt's name for a downloaded package,
// "name_version_arch.deb", with the version's ':' written "%3a" as apt
// escapes it (bsdutils_1%3a2.38.1-5+deb12u3_amd64.deb is version
// 1:2.38.1-5+deb12u3). Hash is left empty.
func ParseDebFileName(file string) (Deb, error) {
	stem, ok := strings.CutSuffix(file, ".deb")
	parts := strings.Split(stem, "_")
	if !ok || len(parts) != 3 {
		return Deb{}, fmt.Errorf("%q is not a .deb named name_version_arch.deb", file)
	}
	version, err := url.PathUnescape(parts[1])
	if err != nil {
		return Deb{}, fmt.Errorf("%q: version %q: %w", file, parts[1], err)
	}
	d := Deb{Name: parts[0], Version: version, Arch: parts[2]}
	switch {
	case !debPackage.MatchString(d.Name):
		return Deb{}, fmt.Errorf("%q: %q is not a Debian package name", file, d.Name)
	case !debVersion.MatchString(d.Version):
		return Deb{}, fmt.Errorf("%q: %q is not a Debian version", file, d.Version)
	case !debArch.MatchString(d.Arch):
		return Deb{}, fmt.Errorf("%q: %q is not an architecture", file, d.Arch)
	}
	return d, nil
}

// ArchiveDebs hashes every .deb in the ArchivesDir of the tree at root,
// sorted by file name; a tree without that directory has none, and a
// file not named as apt names its downloads is not one. The tree
// may have been written by sandboxed build steps, so everything goes
// through an os.Root on it (no symlink leads out), only regular files are
// read, and a symlink or directory named *.deb is skipped.
func ArchiveDebs(root string) ([]Deb, error) {
	r, err := os.OpenRoot(root)
	if err != nil {
		return nil, fmt.Errorf("hash downloaded packages: %w", err)
	}
	defer r.Close()
	fi, err := r.Lstat(ArchivesDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("hash downloaded packages: %w", err)
	}
	if !fi.IsDir() {
		return nil, nil // a symlink or file: nothing apt downloaded lives there
	}
	dir, err := r.Open(ArchivesDir)
	if err != nil {
		return nil, fmt.Errorf("hash downloaded packages: %w", err)
	}
	entries, err := dir.ReadDir(maxArchiveEntries + 1)
	dir.Close()
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("hash downloaded packages: /%s: %w", ArchivesDir, err)
	}
	if len(entries) > maxArchiveEntries {
		return nil, fmt.Errorf("hash downloaded packages: /%s has more than %d entries", ArchivesDir, maxArchiveEntries)
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].Name() < entries[j].Name() })
	var debs []Deb
	for _, e := range entries {
		if !e.Type().IsRegular() || !strings.HasSuffix(e.Name(), ".deb") {
			continue
		}
		d, err := ParseDebFileName(e.Name())
		if err != nil {
			// Not named as apt names its downloads (a step put it
			// there): not a package the lockfile can match by version.
			continue
		}
		if d.SHA256, err = hashIn(r, path.Join(ArchivesDir, e.Name())); err != nil {
			return nil, fmt.Errorf("hash downloaded packages: %w", err)
		}
		debs = append(debs, d)
	}
	return debs, nil
}

// hashIn returns "sha256:HEX" of the regular file rel inside r, refusing
// anything else: O_NOFOLLOW for a symlink in the last component (os.Root
// keeps the others inside the tree), O_NONBLOCK so a FIFO cannot stall
// the build, then a check of what was opened.
func hashIn(r *os.Root, rel string) (string, error) {
	f, err := r.OpenFile(rel, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return "", err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", err
	}
	if !fi.Mode().IsRegular() {
		return "", fmt.Errorf("/%s is not a regular file", rel)
	}
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("/%s: %w", rel, err)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

// DebHashes picks, for every installed package (name to version, as
// InstalledPackages reads them), the hash of the .deb of exactly that
// version among debs. A package installed from elsewhere (a base image's)
// has none; a .deb of another version, or of a package not installed, is
// not what the image holds and is left out. Of two .debs of the installed
// version (two architectures), the first by file name wins, so the result
// does not depend on directory order.
func DebHashes(debs []Deb, installed map[string]string) map[string]string {
	out := map[string]string{}
	for _, d := range debs {
		if v, ok := installed[d.Name]; !ok || v != d.Version {
			continue
		}
		if _, dup := out[d.Name]; !dup {
			out[d.Name] = d.SHA256
		}
	}
	return out
}
