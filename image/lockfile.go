package image

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Lockfile records what a build of an image resolved to. It is committed to
// the repository as images/<name>.lock so a change in the Debian archive
// (a security update, say) shows up as a reviewable diff, and so a build can
// be made to fail when the archive no longer gives what was reviewed.
type Lockfile struct {
	Name     string            `json:"name"`
	Suite    string            `json:"suite"`
	Digest   string            `json:"digest"`
	Packages map[string]string `json:"packages"`
	// SHA256 is, for each package, "sha256:HEX" of the .deb the build
	// downloaded and installed (DebHashes).
	SHA256    map[string]string `json:"sha256"`
	BuiltWith string            `json:"built_with"`
}

// LockMismatchError reports how resolved package versions and .deb
// hashes differ from a lockfile. Each entry of Changed is "pkg: locked V1,
// resolved V2" (or "pkg sha256: locked sha256:A, resolved sha256:B"), of
// Added "pkg V" and of Removed "pkg V".
type LockMismatchError struct {
	Path                    string
	Changed, Added, Removed []string
}

func (e *LockMismatchError) Error() string {
	var parts []string
	if len(e.Changed) > 0 {
		parts = append(parts, "changed: "+strings.Join(e.Changed, "; "))
	}
	if len(e.Added) > 0 {
		parts = append(parts, "not in lockfile: "+strings.Join(e.Added, "; "))
	}
	if len(e.Removed) > 0 {
		parts = append(parts, "missing from build: "+strings.Join(e.Removed, "; "))
	}
	return fmt.Sprintf("resolved packages differ from %s (%s); rebuild without --locked to update the lockfile and review the diff",
		e.Path, strings.Join(parts, " | "))
}

// lockfilePath is where the lockfile of name lives in dir.
func lockfilePath(dir, name string) string {
	return filepath.Join(dir, name+".lock")
}

// ReadLockfile reads images/<name>.lock from dir.
func ReadLockfile(dir, name string) (*Lockfile, error) {
	if err := validName(name); err != nil {
		return nil, err
	}
	path := lockfilePath(dir, name)
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("read lockfile: %w; create it with `moat image build %s` (without --locked)", err, name)
	}
	if err != nil {
		return nil, fmt.Errorf("read lockfile: %w", err)
	}
	var lf Lockfile
	if err := json.Unmarshal(data, &lf); err != nil {
		return nil, fmt.Errorf("parse lockfile %s: %w", path, err)
	}
	if lf.Name != name {
		return nil, fmt.Errorf("lockfile %s: name is %q, want %q", path, lf.Name, name)
	}
	if len(lf.Packages) == 0 {
		return nil, fmt.Errorf("lockfile %s: no packages", path)
	}
	return &lf, nil
}

// WriteLockfile writes lf to dir/<name>.lock atomically (temp file and
// rename), so a concurrent reader sees the old or the new lockfile, never
// half of one. encoding/json sorts map keys, which keeps diffs minimal.
func WriteLockfile(dir string, lf *Lockfile) error {
	if err := validName(lf.Name); err != nil {
		return err
	}
	data, err := jsonIndent(lf)
	if err != nil {
		return fmt.Errorf("encode lockfile: %w", err)
	}
	if err := writeFileAtomic(lockfilePath(dir, lf.Name), data, 0o644); err != nil {
		return fmt.Errorf("write lockfile: %w", err)
	}
	return nil
}

// compareLock returns nil if resolved equals the lockfile's packages and
// hashes the lockfile's hashes, and a *LockMismatchError naming every
// difference otherwise. A package whose version changed is reported once,
// by version (its hash changes with it); a hash that changed under the
// same version (the archive serving other bytes), or that one side lacks
// (a lockfile written before hashes were recorded), by hash.
func compareLock(path string, lf *Lockfile, resolved, hashes map[string]string) error {
	mm := &LockMismatchError{Path: path}
	for pkg, want := range lf.Packages {
		got, ok := resolved[pkg]
		switch {
		case !ok:
			mm.Removed = append(mm.Removed, pkg+" "+want)
		case got != want:
			mm.Changed = append(mm.Changed, fmt.Sprintf("%s: locked %s, resolved %s", pkg, want, got))
		case lf.SHA256[pkg] != hashes[pkg]:
			mm.Changed = append(mm.Changed, fmt.Sprintf("%s %s sha256: locked %s, resolved %s", pkg, got, orNone(lf.SHA256[pkg]), orNone(hashes[pkg])))
		}
	}
	for pkg, got := range resolved {
		if _, ok := lf.Packages[pkg]; !ok {
			mm.Added = append(mm.Added, pkg+" "+got)
		}
	}
	if len(mm.Changed)+len(mm.Added)+len(mm.Removed) == 0 {
		return nil
	}
	sort.Strings(mm.Changed)
	sort.Strings(mm.Added)
	sort.Strings(mm.Removed)
	return mm
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

// writeFileAtomic writes data to a temp file next to path, syncs it and
// renames it over path.
func writeFileAtomic(path string, data []byte, perm os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-")
	if err != nil {
		return err
	}
	tmp := f.Name()
	ok := false
	defer func() {
		if !ok {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if _, err := f.Write(data); err != nil {
		return err
	}
	if err := f.Chmod(perm); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	ok = true
	return nil
}

// jsonIndent is the one JSON encoding of files we write: indented, map keys
// sorted (encoding/json's default), trailing newline.
func jsonIndent(v any) ([]byte, error) {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(data, '\n'), nil
}

// InstalledPackages is the Debian package set (name to version) installed
// in the tree at root, read from the tree's own dpkg database, for
// lockfiles written outside this package (imagebuild's).
func InstalledPackages(ctx context.Context, root string) (map[string]string, error) {
	return dpkgPackages(ctx, root)
}
