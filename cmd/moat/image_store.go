package main

// moat image list | inspect | rm | gc: looking after the image store
// (package image) and what tiers make from its builds (the microVM tier's
// root disks, microvm.PruneDisks). Whether a build is in use is the
// store's to say (image.Store.Use), whether a disk is the tier's; which
// image is too precious to remove without --force (the manifest's
// default) is said here.

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"
	"time"

	"github.com/moat-sandbox/moat/image"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/tier/microvm"
)

// imageList prints one line per stored build: name, digest, size, when it
// was made, and whether it is the one runs get.
func imageList(s *image.Store) int {
	imgs, err := s.List()
	if err != nil {
		return fail(err)
	}
	if len(imgs) == 0 {
		fmt.Println("no images built yet; run: moat image build python")
		return 0
	}
	// The name column is as wide as the longest name (code-interpreter
	// pushed a fixed 12 out of line).
	w := len("NAME")
	for _, img := range imgs {
		w = max(w, len(img.Name))
	}
	fmt.Printf("%-*s %-71s %9s %-16s %s\n", w, "NAME", "DIGEST", "SIZE", "CREATED", "CURRENT")
	for _, img := range imgs {
		cur := "no"
		if img.Current {
			cur = "current"
		}
		if img.SourceDigest != "" {
			cur += ", imported from " + img.SourceDigest
		}
		fmt.Printf("%-*s %-71s %9s %-16s %s\n", w, img.Name, img.Digest, humanBytes(img.Size), img.Built.Local().Format("2006-01-02 15:04"), cur)
	}
	return 0
}

// inspected is what `moat image inspect` prints: the build's stored
// metadata (image.json, whatever made it) and what the store knows about it.
type inspected struct {
	*image.Image
	// Created is when the build finished (Image.Built, under the name
	// other tools use).
	Created time.Time `json:"created"`
	Root    string    `json:"root"`
	Current bool      `json:"current"`
	// Files counts the entries of the root tree (directories, links and
	// files).
	Files int64 `json:"files"`
	// Lockfile is the lockfile of the image in --lockfile-dir, when there
	// is one, and LockfileMatches whether it records this build's digest.
	Lockfile        string `json:"lockfile,omitempty"`
	LockfileMatches *bool  `json:"lockfile_matches,omitempty"`
}

func imageInspect(s *image.Store, name, lockDir string) int {
	img, err := s.Lookup(name)
	if err != nil {
		return imageError(err)
	}
	out := inspected{Image: img, Created: img.Built, Root: img.Root, Current: img.Current}
	if out.Files, err = countEntries(img.Root); err != nil {
		return fail(fmt.Errorf("inspect image %s: %w", name, err))
	}
	if lockDir != "" {
		lf, err := image.ReadLockfile(lockDir, name)
		switch {
		case err == nil:
			out.Lockfile = filepath.Join(lockDir, name+".lock")
			match := lf.Digest == img.Digest
			out.LockfileMatches = &match
		case !errors.Is(err, fs.ErrNotExist):
			return fail(err)
		}
	}
	data, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return fail(err)
	}
	fmt.Printf("%s\n", data)
	return 0
}

// imageRemove removes every build of name, and the microVM disks made
// from them (unless another name stores the same digest). The manifest's
// default image needs --force: every run that names no image would
// rebuild it first (minutes, and the Debian archive must be reachable).
func imageRemove(s *image.Store, home, name string, force bool) int {
	if def := manifest.Default().Image; name == def && !force {
		return fail(usageError{fmt.Errorf("image %q is the default image of every manifest that names none; removing it makes the next such run rebuild it; pass --force to remove it anyway", name)})
	}
	removed, err := s.RemoveName(name)
	var freed int64
	digests := []string{} // not nil: the disks of these digests only
	for _, img := range removed {
		fmt.Printf("removed %s %s (%s)\n", img.Name, img.Digest, humanBytes(img.Size))
		freed += img.Size
		digests = append(digests, img.Digest)
	}
	_, diskFreed, diskErr := pruneDisks(s, home, digests)
	freed += diskFreed
	if err != nil {
		return imageError(errors.Join(err, diskErr))
	}
	if diskErr != nil {
		return fail(diskErr)
	}
	fmt.Printf("freed %s\n", humanBytes(freed))
	return 0
}

// imageGC removes the builds no name points to and no live sandbox uses,
// the directories of builds that were killed, and the microVM disks of
// builds no longer stored (those it just removed included) that no live
// sandbox holds.
func imageGC(s *image.Store, home string) int {
	abandoned, gcErr := s.GC()
	for _, p := range abandoned {
		fmt.Printf("removed abandoned build %s\n", p)
	}
	diskBuilds, diskGCErr := microvm.GCDiskBuilds(home)
	for _, p := range diskBuilds {
		fmt.Printf("removed abandoned microVM disk build %s\n", p)
	}
	removed, err := s.Prune()
	var freed int64
	for _, img := range removed {
		fmt.Printf("removed %s %s (%s)\n", img.Name, img.Digest, humanBytes(img.Size))
		freed += img.Size
	}
	disks, diskFreed, diskErr := pruneDisks(s, home, nil)
	freed += diskFreed
	fmt.Printf("removed %d unused builds, %d abandoned builds, %d microVM disks; freed %s\n",
		len(removed), len(abandoned)+len(diskBuilds), disks, humanBytes(freed))
	if err := errors.Join(gcErr, diskGCErr, err, diskErr); err != nil {
		return fail(err)
	}
	return 0
}

// pruneDisks removes the microVM tier's root disks under home whose
// digest s no longer stores (of the digests only, when it is not nil),
// prints each, and returns how many it removed and the bytes freed.
func pruneDisks(s *image.Store, home string, only []string) (int, int64, error) {
	disks, err := microvm.PruneDisks(home, only, s.Digests)
	var freed int64
	for _, d := range disks {
		fmt.Printf("removed microVM disk %s (%s)\n", d.Digest, humanBytes(d.Size))
		freed += d.Size
	}
	return len(disks), freed, err
}

// imageError fails with exit status 2 for what the user can fix by naming
// another image or stopping a sandbox, 125 for the rest.
func imageError(err error) int {
	if errors.Is(err, image.ErrUnknown) || errors.Is(err, image.ErrNotBuilt) || errors.Is(err, image.ErrInUse) {
		return fail(usageError{err})
	}
	return fail(err)
}

// countEntries counts what is below root, following no symlink.
func countEntries(root string) (int64, error) {
	var n int64
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if path != root {
			n++
		}
		return nil
	})
	return n, err
}

// humanBytes writes n as B, KiB, MiB or GiB with one decimal.
func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	v, i := float64(n), -1
	for v >= unit && i < 3 {
		v /= unit
		i++
	}
	return fmt.Sprintf("%.1f %s", v, strings.Split("KiB MiB GiB TiB", " ")[i])
}
