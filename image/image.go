// Package image builds and stores the immutable root filesystem images that
// sandboxed code runs on, addressed by the digest of their content.
//
// An image is a Debian root tree made with mmdebstrap, scrubbed of anything
// host-specific (passwd, hostname, resolv.conf), stripped of setuid bits,
// hashed into a canonical digest and stored under
//
//	<dir>/<name>/<hex digest>/rootfs      the tree
//	<dir>/<name>/<hex digest>/image.json  its metadata
//	<dir>/<name>/current                  symlink naming the current digest
//
// The package must never modify a stored image after it is published (other
// packages bind-mount it read-only and rely on the digest), never publish a
// partially built tree, never follow symlinks inside an image tree (the tree
// is produced by maintainer scripts and its links point at host paths when
// seen from outside), and never copy anything from the host's /etc into an
// image.
package image

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"
)

// ErrNotBuilt means the named image has no current build in the store.
var ErrNotBuilt = errors.New("image not built")

// ErrUnknown means the store neither holds the named image nor has a
// definition to build it from (or the name is not one it could hold).
var ErrUnknown = errors.New("unknown image")

// Image is one built, immutable image.
type Image struct {
	// Name is the definition name, e.g. "python".
	Name string `json:"name"`
	// Digest is "sha256:<hex>", the content digest of the root tree
	// (see WriteListing).
	Digest string `json:"digest"`
	// Root is the absolute host path of the root filesystem directory. It
	// is derived from the store location, not stored in image.json, so a
	// store can be moved.
	Root string `json:"-"`
	// Env is the default environment: PATH, LANG and the like. HOME is set
	// by the caller.
	Env []string `json:"env"`
	// Packages maps each installed Debian package to its exact version.
	Packages map[string]string `json:"packages"`
	// Built is when the build finished.
	Built time.Time `json:"built"`
	// Suite is the Debian suite the image was bootstrapped from.
	Suite string `json:"suite"`
	// Size is the total size in bytes of the regular files in Root.
	Size int64 `json:"size"`
	// BuiltWith names the bootstrap tool and version, e.g. "mmdebstrap 1.3.5".
	BuiltWith string `json:"built_with"`
	// Definition is the fingerprint of the definition the image was built
	// from (Definition.Fingerprint). When the definition changes (a package
	// added), the stored image is stale and Lookup says so.
	Definition string `json:"definition"`
	// Current reports whether this is the build that Lookup returns.
	Current bool `json:"-"`

	// The fields below are set for imported images (Store.Import) only.

	// Source is the import SOURCE, e.g. "oci-archive:app.tar".
	Source string `json:"source,omitempty"`
	// SourceDigest is the source's own identity beside Moat's content
	// Digest: the OCI manifest digest, a docker-archive's config digest
	// (its image ID), or the sha256 of a rootfs tar.
	SourceDigest string `json:"source_digest,omitempty"`
	// Entrypoint and Cmd come from the image config; a run with no
	// command runs Entrypoint followed by Cmd.
	Entrypoint []string `json:"entrypoint,omitempty"`
	Cmd        []string `json:"cmd,omitempty"`
	// WorkingDir is the config's working directory: runs start there
	// when it exists in the image (or in the workspace), else they are
	// refused (engine).
	WorkingDir string `json:"working_dir,omitempty"`
	// User is the config's user, recorded only: every run uses the
	// sandbox's unprivileged user, never root.
	User string `json:"user,omitempty"`
}

// Store is a directory of built images, normally $MOAT_HOME/images.
// The zero value is not usable; call NewStore.
type Store struct {
	// Dir is the store's root directory.
	Dir string

	// tools runs the external programs a build needs; tests replace it.
	tools toolchain
}

// NewStore returns a store rooted at dir. It does not touch the disk: the
// directory is created by the first Build.
func NewStore(dir string) *Store {
	return &Store{Dir: dir, tools: mmdebstrapTools()}
}

const (
	currentLink  = "current"
	metadataFile = "image.json"
	rootfsDir    = "rootfs"
	// buildPrefix marks in-progress (or abandoned) build directories; GC
	// removes those it can prove are abandoned.
	buildPrefix = ".build-"
	lockName    = ".lock"
)

// Lookup returns the current image for name, or an error wrapping
// ErrNotBuilt that says how to build it.
func (s *Store) Lookup(name string) (*Image, error) {
	if err := validName(name); err != nil {
		// A name the store cannot hold is not an image it has: callers
		// branch on ErrUnknown to answer "no such image" rather than fail.
		return nil, fmt.Errorf("look up image: %w: %w", ErrUnknown, err)
	}
	nameDir := filepath.Join(s.Dir, name)
	target, err := os.Readlink(filepath.Join(nameDir, currentLink))
	if errors.Is(err, os.ErrNotExist) {
		if _, derr := definition(name); derr != nil {
			return nil, fmt.Errorf("look up image: image %q: %w (known images: %s)", name, ErrUnknown, strings.Join(s.Names(), ", "))
		}
		return nil, fmt.Errorf("image %q in %s: %w; build it with `moat image build %s`", name, s.Dir, ErrNotBuilt, name)
	}
	if err != nil {
		return nil, fmt.Errorf("look up image %q: %w", name, err)
	}
	// The link is written only by Build, but it is read from disk: accept
	// nothing but a bare hex digest so it cannot point outside the store.
	if !validHex(target) {
		return nil, fmt.Errorf("look up image %q: %s points at %q, not a digest; rebuild with `moat image build %s`",
			name, filepath.Join(nameDir, currentLink), target, name)
	}
	if err := s.checkPrivate(); err != nil {
		return nil, fmt.Errorf("look up image %q: %w", name, err)
	}
	img, err := s.load(name, target)
	if err != nil {
		return nil, fmt.Errorf("look up image %q: %w", name, err)
	}
	img.Current = true
	if def, err := definition(name); err == nil && img.Definition != def.Fingerprint() {
		return nil, fmt.Errorf("image %q in %s was built from an older definition (%s): %w; rebuild it with `moat image build %s`",
			name, s.Dir, def.Description, ErrNotBuilt, name)
	}
	return img, nil
}

// Names returns, sorted, every image name Lookup can resolve or Build can
// make: the built-in definitions and every stored name with a current
// build (an imported image has no definition). It is what an error about
// an unknown image offers instead; a store that cannot be read adds
// nothing to the built-in names.
func (s *Store) Names() []string {
	seen := map[string]bool{}
	for _, d := range Definitions() {
		seen[d.Name] = true
	}
	ents, _ := os.ReadDir(s.Dir)
	for _, e := range ents {
		if !e.IsDir() || validName(e.Name()) != nil {
			continue
		}
		if t, err := os.Readlink(filepath.Join(s.Dir, e.Name(), currentLink)); err == nil && validHex(t) {
			seen[e.Name()] = true
		}
	}
	out := make([]string, 0, len(seen))
	for n := range seen {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// List returns every stored image, sorted by name and then newest first.
func (s *Store) List() ([]*Image, error) {
	names, err := os.ReadDir(s.Dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list images: %w", err)
	}
	var out []*Image
	for _, n := range names {
		if !n.IsDir() || validName(n.Name()) != nil {
			continue
		}
		nameDir := filepath.Join(s.Dir, n.Name())
		current, _ := os.Readlink(filepath.Join(nameDir, currentLink))
		entries, err := os.ReadDir(nameDir)
		if err != nil {
			return nil, fmt.Errorf("list images: %w", err)
		}
		for _, e := range entries {
			if !e.IsDir() || !validHex(e.Name()) {
				continue
			}
			img, err := s.load(n.Name(), e.Name())
			if err != nil {
				return nil, fmt.Errorf("list images: %w", err)
			}
			img.Current = e.Name() == current
			out = append(out, img)
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		return out[i].Built.After(out[j].Built)
	})
	return out, nil
}

// Remove deletes one stored build. It refuses to remove the current build,
// which a run may be about to mount, and a build a live sandbox uses
// (Use; the error wraps ErrInUse): a read-only bind mount does not stop
// files being unlinked through the store path.
func (s *Store) Remove(name, digest string) error {
	if err := validName(name); err != nil {
		return err
	}
	hexDigest := strings.TrimPrefix(digest, digestPrefix)
	if !validHex(hexDigest) {
		return fmt.Errorf("remove image %s: digest %q is not sha256:<64 hex>", name, digest)
	}
	nameDir := filepath.Join(s.Dir, name)
	lock, err := lockNonBlocking(filepath.Join(nameDir, lockName))
	if err != nil {
		return fmt.Errorf("remove image %s@%s: %w", name, digest, err)
	}
	defer lock.Close()
	if cur, _ := os.Readlink(filepath.Join(nameDir, currentLink)); cur == hexDigest {
		return fmt.Errorf("remove image %s@%s: it is the current build; build a newer one first", name, digest)
	}
	dir := filepath.Join(nameDir, hexDigest)
	if _, err := os.Lstat(dir); err != nil {
		return fmt.Errorf("remove image %s@%s: %w", name, digest, err)
	}
	// A live sandbox holds the build's use lock (Use); remove.go has why.
	use, err := lockNonBlocking(filepath.Join(nameDir, usePrefix+hexDigest))
	if errors.Is(err, errLocked) {
		return fmt.Errorf("remove image %s@%s: %w; stop the sandboxes using it and retry", name, digest, ErrInUse)
	}
	if err != nil {
		return fmt.Errorf("remove image %s@%s: %w", name, digest, err)
	}
	defer use.Close()
	if err := removeTree(dir); err != nil {
		return fmt.Errorf("remove image %s@%s: %w", name, digest, err)
	}
	os.Remove(filepath.Join(nameDir, usePrefix+hexDigest))
	return nil
}

// GC removes build directories left behind by a build that was killed
// (SIGKILL, power loss) before it could clean up, and returns their paths.
// A build holds its name's lock for its whole life, so a build directory
// under a name whose lock GC can take is abandoned; names whose lock is
// held are skipped.
func (s *Store) GC() ([]string, error) {
	names, err := os.ReadDir(s.Dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("gc images: %w", err)
	}
	var removed []string
	var errs []error
	for _, n := range names {
		if !n.IsDir() || validName(n.Name()) != nil {
			continue
		}
		nameDir := filepath.Join(s.Dir, n.Name())
		lock, err := lockNonBlocking(filepath.Join(nameDir, lockName))
		if errors.Is(err, errLocked) {
			continue // a build is running; its directory is not stale
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("gc %s: %w", n.Name(), err))
			continue
		}
		entries, err := os.ReadDir(nameDir)
		if err != nil {
			errs = append(errs, fmt.Errorf("gc %s: %w", n.Name(), err))
		}
		for _, e := range entries {
			if !strings.HasPrefix(e.Name(), buildPrefix) && !strings.HasPrefix(e.Name(), ".current-") {
				continue
			}
			p := filepath.Join(nameDir, e.Name())
			if err := removeTree(p); err != nil {
				errs = append(errs, fmt.Errorf("gc %s: %w", n.Name(), err))
				continue
			}
			removed = append(removed, p)
		}
		lock.Close()
	}
	return removed, errors.Join(errs...)
}

// load reads one build's metadata and checks it against its directory name.
func (s *Store) load(name, hexDigest string) (*Image, error) {
	dir := filepath.Join(s.Dir, name, hexDigest)
	data, err := os.ReadFile(filepath.Join(dir, metadataFile))
	if err != nil {
		return nil, fmt.Errorf("read metadata: %w", err)
	}
	var img Image
	if err := json.Unmarshal(data, &img); err != nil {
		return nil, fmt.Errorf("parse %s: %w", filepath.Join(dir, metadataFile), err)
	}
	if img.Digest != digestPrefix+hexDigest || img.Name != name {
		return nil, fmt.Errorf("%s says %s@%s but is stored as %s@%s%s",
			filepath.Join(dir, metadataFile), img.Name, img.Digest, name, digestPrefix, hexDigest)
	}
	root, err := filepath.Abs(filepath.Join(dir, rootfsDir))
	if err != nil {
		return nil, fmt.Errorf("resolve rootfs path: %w", err)
	}
	fi, err := os.Lstat(root)
	if err != nil {
		return nil, fmt.Errorf("rootfs: %w", err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("rootfs %s is not a directory", root)
	}
	img.Root = root
	return &img, nil
}

// checkPrivate refuses a store that someone other than its owner could
// write to: whoever can write there can swap the tree that every sandbox
// runs on. The owner must be us (root in production).
func (s *Store) checkPrivate() error {
	fi, err := os.Stat(s.Dir)
	if err != nil {
		return fmt.Errorf("image store: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("image store %s: no unix stat data", s.Dir)
	}
	if fi.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("image store %s is writable by group or others (mode %04o); fix with `chmod go-w %s`",
			s.Dir, fi.Mode().Perm(), s.Dir)
	}
	if int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("image store %s is owned by uid %d, not by us (uid %d); fix with `chown %d %s`",
			s.Dir, st.Uid, os.Geteuid(), os.Geteuid(), s.Dir)
	}
	return nil
}

// validHex reports whether s is a lowercase hex sha256.
func validHex(s string) bool {
	if len(s) != 64 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil && strings.ToLower(s) == s
}
