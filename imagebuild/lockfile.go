package imagebuild

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// LockVersion is the version of the lockfile format this Moat writes and
// reads.
const LockVersion = 1

// maxLockBytes bounds a lockfile read back: a large image has a few
// thousand packages, a few hundred kilobytes.
const maxLockBytes = 32 << 20

// Lock records what one build of a build file resolved to: the file (by
// hash), the base, every Debian package in the result, every package the
// file pins, and the result's content digest. It is written beside the
// build file (LockPath) after a build and compared with the next build's
// for `moat image build --locked`. Its JSON bytes depend only on its
// content (maps sorted by encoding/json, pins sorted here).
type Lock struct {
	Version int `json:"version"`
	// File is the build file's base name, FileSHA256 the hex sha256 of
	// its bytes.
	File       string   `json:"file"`
	FileSHA256 string   `json:"file_sha256"`
	Base       LockBase `json:"base"`
	// Debian is every Debian package installed in the built tree, name
	// to version.
	Debian map[string]string `json:"debian"`
	// DebianSHA256 is, for each of them the build downloaded (all of a
	// debian base's; an image base's own packages are covered by
	// Base.ImageDigest), "sha256:HEX" of the .deb of the installed
	// version (image.DebHashes).
	DebianSHA256 map[string]string `json:"debian_sha256"`
	// Pins are the pip and npm packages the build file pins, sorted by
	// manager, name, version.
	Pins []LockPin `json:"pins"`
	// Digest is the built image's content digest.
	Digest string `json:"digest"`
}

// LockBase is the base a build started from: a Debian suite, or an image
// by name and content digest.
type LockBase struct {
	Debian      string `json:"debian,omitempty"`
	Image       string `json:"image,omitempty"`
	ImageDigest string `json:"image_digest,omitempty"`
}

// LockPin is one pinned pip or npm package (Pin, with JSON names).
type LockPin struct {
	Manager string `json:"manager"`
	Name    string `json:"name"`
	Version string `json:"version"`
	Hash    string `json:"hash"`
}

// LockPath is where the lockfile of the build file at buildFile lives:
// beside it, with ".lock" appended ("image.yaml.lock", "Dockerfile.lock").
func LockPath(buildFile string) string { return buildFile + ".lock" }

// HashFile returns the hex sha256 of the file at path, for
// Lock.FileSHA256.
func HashFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("hash build file: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("hash build file %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// NewLock records a finished build of plan: fileSHA is HashFile of
// plan.File, baseDigest the content digest of plan.Base.Image ("" for a
// Debian base), debs the Debian packages of the built tree
// (image.InstalledPackages), debHashes the hashes of those the build
// downloaded (image.DebHashes) and digest the published image's digest.
func NewLock(plan *Plan, fileSHA, baseDigest string, debs, debHashes map[string]string, digest string) *Lock {
	l := &Lock{
		Version:      LockVersion,
		File:         filepath.Base(plan.File),
		FileSHA256:   fileSHA,
		Base:         LockBase{Debian: plan.Base.Debian, Image: plan.Base.Image},
		Debian:       map[string]string{},
		DebianSHA256: map[string]string{},
		Pins:         []LockPin{},
		Digest:       digest,
	}
	if plan.Base.Image != "" {
		l.Base.ImageDigest = baseDigest
	}
	for k, v := range debs {
		l.Debian[k] = v
	}
	for k, v := range debHashes {
		l.DebianSHA256[k] = v
	}
	for _, p := range plan.Pins {
		l.Pins = append(l.Pins, LockPin(p))
	}
	sortPins(l.Pins)
	return l
}

func sortPins(pins []LockPin) {
	sort.Slice(pins, func(i, j int) bool {
		a, b := pins[i], pins[j]
		if a.Manager != b.Manager {
			return a.Manager < b.Manager
		}
		if a.Name != b.Name {
			return a.Name < b.Name
		}
		if a.Version != b.Version {
			return a.Version < b.Version
		}
		return a.Hash < b.Hash
	})
}

// Marshal returns the lockfile's bytes: indented JSON with sorted keys and
// pins and a final newline, the same bytes for the same content.
func (l *Lock) Marshal() ([]byte, error) {
	c := *l
	c.Pins = append([]LockPin{}, l.Pins...)
	sortPins(c.Pins)
	if c.Debian == nil {
		c.Debian = map[string]string{}
	}
	if c.DebianSHA256 == nil {
		c.DebianSHA256 = map[string]string{}
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(&c); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// WriteLock writes l to path atomically (a temp file beside it, synced,
// renamed over it): a concurrent reader sees the old lockfile or the new
// one, never half of one.
func WriteLock(path string, l *Lock) error {
	data, err := l.Marshal()
	if err != nil {
		return fmt.Errorf("encode lockfile %s: %w", path, err)
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-")
	if err != nil {
		return fmt.Errorf("write lockfile: %w", err)
	}
	tmp := f.Name()
	done := false
	defer func() {
		if !done {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("write lockfile %s: %w", path, err)
	}
	if err := f.Chmod(0o644); err != nil {
		return fmt.Errorf("write lockfile %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("write lockfile %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write lockfile %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write lockfile %s: %w", path, err)
	}
	done = true
	return nil
}

// ReadLock reads the lockfile at path. Unknown or repeated keys, a
// version other than LockVersion and a lockfile without a digest are
// refused, naming the path.
func ReadLock(path string) (*Lock, error) {
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("read lockfile: %w; build once without --locked to write it", err)
		}
		return nil, fmt.Errorf("read lockfile: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxLockBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read lockfile %s: %w", path, err)
	}
	l, err := ParseLock(data)
	if err != nil {
		return nil, fmt.Errorf("lockfile %s: %w", path, err)
	}
	return l, nil
}

// ParseLock decodes a lockfile's bytes strictly.
func ParseLock(data []byte) (*Lock, error) {
	if len(data) > maxLockBytes {
		return nil, fmt.Errorf("is larger than %d bytes", maxLockBytes)
	}
	// Unknown keys are refused: a lockfile from a newer Moat, or one
	// edited by hand, must not be half-understood by --locked.
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var l Lock
	if err := dec.Decode(&l); err != nil {
		return nil, fmt.Errorf("is not a Moat lockfile: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("is not a Moat lockfile: data after the JSON object")
	}
	switch {
	case l.Version != LockVersion:
		return nil, fmt.Errorf("version %d is not %d; rebuild without --locked to rewrite it", l.Version, LockVersion)
	case l.Digest == "":
		return nil, errors.New("has no digest; rebuild without --locked to rewrite it")
	case (l.Base.Debian == "") == (l.Base.Image == ""):
		return nil, errors.New("base names neither or both of debian and image; rebuild without --locked to rewrite it")
	}
	if l.Debian == nil {
		l.Debian = map[string]string{}
	}
	if l.DebianSHA256 == nil {
		l.DebianSHA256 = map[string]string{}
	}
	if l.Pins == nil {
		l.Pins = []LockPin{}
	}
	sortPins(l.Pins)
	return &l, nil
}

// LockDiffError lists every difference between a lockfile and a build,
// one line each ("debian package curl: 7.88.1-10 -> 7.88.1-11"), in a
// stable order. Compare returns it.
type LockDiffError struct {
	Differences []string
}

func (e *LockDiffError) Error() string {
	return "the build differs from its lockfile:\n  " + strings.Join(e.Differences, "\n  ") +
		"\nreview the change, then build without --locked to update the lockfile"
}

// Compare returns nil when other (a new build) matches l (the lockfile)
// and a *LockDiffError naming every difference otherwise: the build
// file's hash, the base, each Debian package (its version, and the hash
// of its .deb) and pin added, removed or changed, and the digest. The file's name is not compared (a renamed
// file with the same bytes builds the same image).
func (l *Lock) Compare(other *Lock) error {
	var d []string
	change := func(what, a, b string) {
		if a != b {
			d = append(d, fmt.Sprintf("%s: %s -> %s", what, orNone(a), orNone(b)))
		}
	}
	change("build file sha256", l.FileSHA256, other.FileSHA256)
	change("base debian suite", l.Base.Debian, other.Base.Debian)
	change("base image", l.Base.Image, other.Base.Image)
	change("base image digest", l.Base.ImageDigest, other.Base.ImageDigest)
	d = append(d, diffMaps("debian package", l.Debian, other.Debian)...)
	d = append(d, diffHashes(l, other)...)
	d = append(d, diffMaps("", pinMap(l.Pins), pinMap(other.Pins))...)
	change("digest", l.Digest, other.Digest)
	if len(d) == 0 {
		return nil
	}
	return &LockDiffError{Differences: d}
}

// diffHashes lists the .deb hashes that changed, were added or went
// away, one line each naming the package and both hashes ("debian package
// curl sha256: sha256:A -> sha256:B"). A package added or removed is
// already a line of its own, and one whose version changed has a new
// hash as a matter of course: only a package kept at the same version is
// compared, so a changed hash there means other bytes under one version.
func diffHashes(l, other *Lock) []string {
	var names []string
	for k, v := range l.Debian {
		if w, ok := other.Debian[k]; ok && v == w {
			names = append(names, k)
		}
	}
	sort.Strings(names)
	var d []string
	for _, k := range names {
		a, b := l.DebianSHA256[k], other.DebianSHA256[k]
		if a != b {
			d = append(d, fmt.Sprintf("debian package %s sha256: %s -> %s", k, orNone(a), orNone(b)))
		}
	}
	return d
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

// pinMap keys pins by "manager package name" to "version hash", so that a
// version change reads as one change rather than a removal and an
// addition.
func pinMap(pins []LockPin) map[string]string {
	m := map[string]string{}
	for _, p := range pins {
		k := p.Manager + " package " + p.Name
		v := p.Version + " " + p.Hash
		if prev, dup := m[k]; dup {
			v = prev + ", " + v // npm may install two versions of one name
		}
		m[k] = v
	}
	return m
}

func diffMaps(prefix string, a, b map[string]string) []string {
	keys := map[string]bool{}
	for k := range a {
		keys[k] = true
	}
	for k := range b {
		keys[k] = true
	}
	sorted := make([]string, 0, len(keys))
	for k := range keys {
		sorted = append(sorted, k)
	}
	sort.Strings(sorted)
	var d []string
	for _, k := range sorted {
		what := strings.TrimSpace(prefix + " " + k)
		va, ina := a[k]
		vb, inb := b[k]
		switch {
		case !inb:
			d = append(d, fmt.Sprintf("%s %s: removed", what, va))
		case !ina:
			d = append(d, fmt.Sprintf("%s %s: added", what, vb))
		case va != vb:
			d = append(d, fmt.Sprintf("%s: %s -> %s", what, va, vb))
		}
	}
	return d
}
