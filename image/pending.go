package image

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Pending is an image tree being made under a name's lock: Build, Import
// and the image builder (package imagebuild) each fill Root() their own
// way and then Publish it, so that finalisation, hashing and the atomic
// publish are one code path. Close releases the lock and, unless Publish
// succeeded, removes everything the build wrote: a failed or cancelled
// build leaves the store as it was.
type Pending struct {
	store              *Store
	name, nameDir, tmp string
	lock               *os.File
	progress           io.Writer
	start              time.Time
	// newName: the name's directory did not exist before (nor the store,
	// if newStore); a failed build removes them again.
	newName, newStore bool
	published         bool
	succeeded         bool
	// keepExisting: when the digest is already stored, keep its metadata
	// (Build: the tree answers to a definition, not to this run) instead
	// of overwriting it with this one's (Import, imagebuild: the config
	// and source of the latest build of the same tree win).
	keepExisting bool

	// sums, when set (Import), holds the sha256 of the files the
	// extractor wrote, which the digest uses instead of reading them
	// back (filesums.go).
	sums *fileSums

	// Check, when set, is called by Publish with the finished tree's
	// digest before anything is published; an error publishes nothing
	// (a build that must match its lockfile).
	Check func(digest string) error
}

// Begin reserves a build directory for name next to its final place (so
// publishing is a rename within one filesystem), holding the name's lock
// until Close; it waits for a build of the same name already running.
// progress (nil discards) receives the phases.
func (s *Store) Begin(ctx context.Context, name string, progress io.Writer) (*Pending, error) {
	if progress == nil {
		progress = io.Discard
	}
	if err := validName(name); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadImage, err)
	}
	p := &Pending{store: s, name: name, progress: progress, start: time.Now()}
	p.newStore = !exists(s.Dir)
	p.newName = !exists(filepath.Join(s.Dir, name))
	nameDir, err := s.prepareDirs(name)
	if err != nil {
		return nil, err
	}
	p.nameDir = nameDir
	if p.lock, err = lockWait(ctx, filepath.Join(nameDir, lockName), progress); err != nil {
		p.Close()
		return nil, err
	}
	if p.tmp, err = os.MkdirTemp(nameDir, buildPrefix); err != nil {
		p.Close()
		return nil, err
	}
	// Readable by others from the start: apt drops privileges to _apt for
	// downloads and needs to traverse into the tree; nothing in a build is
	// secret, only writes must be root's.
	if err := os.Chmod(p.tmp, 0o755); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// Root is the host path of the tree being built (it does not exist until
// the caller creates it).
func (p *Pending) Root() string { return filepath.Join(p.tmp, rootfsDir) }

// Lock is the open store lock, for a child process that must hold it as
// long as it lives (mmdebstrap).
func (p *Pending) Lock() *os.File { return p.lock }

// Phase writes one timed progress line.
func (p *Pending) Phase(format string, args ...any) {
	fmt.Fprintf(p.progress, "[%5.1fs] %s\n", time.Since(p.start).Seconds(), fmt.Sprintf(format, args...))
}

// Publish finalises the tree (the image's own passwd and group, empty
// mount points, no setuid bits: finalize.go), hashes it, writes img's
// metadata (Name, Digest, Size and Root are set here), renames the tree
// to its digest and makes it the name's current build. When the same
// content is already stored, that copy (which may be mounted) is kept
// untouched and this build's directory is dropped.
func (p *Pending) Publish(ctx context.Context, img *Image) (*Image, error) {
	if p.tmp == "" || p.published || p.succeeded {
		return nil, errors.New("publish: build is not pending")
	}
	rootfs := p.Root()
	if err := ensureEtc(rootfs); err != nil {
		return nil, err
	}
	p.Phase("finalizing: own /etc/passwd, empty mount points, no setuid bits")
	if err := finalize(rootfs, p.sums); err != nil {
		return nil, err
	}
	p.Phase("hashing tree")
	digest, size, err := treeDigest(rootfs, p.sums)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if p.Check != nil {
		if err := p.Check(digest); err != nil {
			return nil, err
		}
	}
	img.Name, img.Digest, img.Size = p.name, digest, size
	hexDigest := strings.TrimPrefix(digest, digestPrefix)
	final := filepath.Join(p.nameDir, hexDigest)
	if _, err := os.Lstat(final); err == nil {
		// Same content already stored (a reproducible rebuild): keep the
		// published tree, which may be mounted right now, untouched.
		p.Phase("identical image %s already stored", digest)
		if p.keepExisting {
			existing, err := p.store.load(p.name, hexDigest)
			if err != nil {
				return nil, fmt.Errorf("existing %s: %w", final, err)
			}
			if existing.Definition != img.Definition {
				// Same tree from a changed (or older, unrecorded)
				// definition: record the definition it now answers to.
				existing.Definition = img.Definition
				if err := writeMetadata(final, existing); err != nil {
					return nil, err
				}
			}
			img = existing
		} else if err := writeMetadata(final, img); err != nil {
			return nil, err
		}
	} else {
		if err := writeMetadata(p.tmp, img); err != nil {
			return nil, err
		}
		// Flush the tree before the rename makes it visible: after a
		// crash, a published digest directory must hold the content it
		// is named after, not truncated files.
		if err := syncFS(p.tmp); err != nil {
			return nil, err
		}
		if err := os.Rename(p.tmp, final); err != nil {
			return nil, fmt.Errorf("publish: %w", err)
		}
		p.published = true
	}
	if err := setCurrent(p.nameDir, hexDigest); err != nil {
		return nil, err
	}
	p.succeeded = true
	root, err := filepath.Abs(filepath.Join(final, rootfsDir))
	if err != nil {
		return nil, err
	}
	img.Root = root
	img.Current = true
	p.Phase("stored %s (%.0f MB) at %s", digest, float64(size)/1e6, final)
	return img, nil
}

// Close releases the name's lock. It first removes the build directory
// unless Publish renamed it into place and, before a successful Publish, for a name (or store) this build
// created, the directories it created: only when empty, in case another
// build of the name started meanwhile.
func (p *Pending) Close() {
	if p.tmp != "" && !p.published {
		if err := removeTree(p.tmp); err != nil {
			fmt.Fprintf(p.progress, "warning: could not clean up %s: %v (run `moat image gc`)\n", p.tmp, err)
		}
	}
	if !p.succeeded && p.newName && p.nameDir != "" {
		os.Remove(filepath.Join(p.nameDir, lockName))
		os.Remove(p.nameDir)
		if p.newStore {
			os.Remove(filepath.Dir(p.nameDir))
		}
	}
	if p.lock != nil {
		p.lock.Close()
		p.lock = nil
	}
	p.tmp = ""
}

// Bootstrap makes Root() a Debian tree of suite: the essential set, and
// apt when download is not empty, with the same mmdebstrap run (and checks) as the built-in images.
// download are fetched into the tree's apt cache with their dependencies
// but not installed (Definition.Download): the caller installs them in a
// sandbox, offline, so none of their maintainer scripts runs on the
// host. What runs on the host is the bootstrap of a set that does not
// depend on the caller. The tree keeps apt's package lists and every
// downloaded .deb (ArchiveDebs hashes them); finalisation removes both.
// It returns the environment such an image gets. Only the suites Moat
// has archive sources for are accepted.
func (p *Pending) Bootstrap(ctx context.Context, suite string, download []string) (env []string, err error) {
	var base *Definition
	for _, d := range Definitions() {
		if d.Suite == suite {
			base = &d
			break
		}
	}
	if base == nil {
		return nil, fmt.Errorf("debian suite %q: Moat builds from %s; use one of them", suite, strings.Join(suites(), ", "))
	}
	for _, pkg := range download {
		// They become words of mmdebstrap's customize hook, a shell line.
		if !debPackage.MatchString(pkg) {
			return nil, fmt.Errorf("debian package %q: not a package name (lower-case letters, digits, + - .)", pkg)
		}
	}
	if err := p.store.tools.check(); err != nil {
		return nil, err
	}
	var packages []string
	if len(download) > 0 {
		packages = []string{"apt"} // to install them in the sandbox
	}
	def := Definition{
		Name:            p.name,
		Suite:           suite,
		Packages:        packages,
		Download:        download,
		Env:             []string{"PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8"},
		Sources:         base.Sources,
		SourceDateEpoch: base.SourceDateEpoch,
	}
	if len(download) > 0 {
		p.Phase("bootstrapping Debian %s + apt, downloading %s", suite, strings.Join(download, ", "))
	} else {
		p.Phase("bootstrapping Debian %s", suite)
	}
	if err := p.store.tools.bootstrap(ctx, def, p.Root(), p.progress, []*os.File{p.lock}); err != nil {
		return nil, err
	}
	return def.Env, ctx.Err()
}

// suites lists the Debian suites of the built-in definitions.
func suites() []string {
	var out []string
	for _, d := range Definitions() {
		if !slices.Contains(out, d.Suite) {
			out = append(out, d.Suite)
		}
	}
	return out
}
