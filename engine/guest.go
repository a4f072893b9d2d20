package engine

import (
	"debug/buildinfo"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"syscall"

	"github.com/moat-sandbox/moat/internal/libdir"
	"github.com/moat-sandbox/moat/internal/sourceid"
)

// DefaultGuest is where scripts/setup installs moat-guest (cmd/moat-guest),
// the in-sandbox half of moat alone. GuestBinary looks first beside the
// running moat (libdir: /usr/lib/moat/moat-guest for the .deb's
// /usr/bin/moat); $MOAT_GUEST overrides both.
const DefaultGuest = libdir.Default + "/moat-guest"

// GuestBinary returns the executable the tiers start inside sandboxes
// (native's init, gVisor's init, the microvm agent) when Options.Exe is
// not set, and why: moat-guest when it was built from exactly the source
// this moat was, else this moat binary itself ("/proc/self/exe"), which
// carries the same code. Both work; moat-guest starts several times faster
// (docs/RATIONALE.md).
//
// Built from exactly the same source means: scripts/setup stamped both
// with the same source ID (sourceid.ID, a digest of the tree's files)
// and both were built by the same Go version. Any other build (go build
// by hand, go install, a test) has no ID and uses itself, so an outdated
// moat-guest is never run. moat-guest must be a regular file owned by
// root and not writable by anyone else, in directories likewise up to /:
// root runs it, and a sandbox's init is trusted code.
func GuestBinary() (path, why string) {
	cands := libdir.Paths("moat-guest")
	if env := os.Getenv("MOAT_GUEST"); env != "" {
		cands = []string{env}
	}
	self, ok := debug.ReadBuildInfo()
	if !ok {
		return "/proc/self/exe", "this moat binary (it records no build information)"
	}
	p, err := pickGuest(cands, func(p string) error { return checkGuest(p, sourceid.ID, self.GoVersion) })
	if err != nil {
		return "/proc/self/exe", "this moat binary (" + err.Error() + ")"
	}
	return p, p + " (built from the same source, " + sourceid.ID + ")"
}

// pickGuest returns the first of cands that check accepts: a moat-guest
// beside moat that is missing or untrusted does not hide a good one in the
// default place. Else the first candidate's reason.
func pickGuest(cands []string, check func(string) error) (string, error) {
	var first error
	for _, p := range cands {
		err := check(p)
		if err == nil {
			return p, nil
		}
		if first == nil {
			first = err
		}
	}
	if first == nil {
		first = fmt.Errorf("no place to look for moat-guest")
	}
	return "", first
}

// checkGuest says why the binary at p may not stand in for the guest half
// of a moat built from source id with Go goVersion, or nil.
func checkGuest(p, id, goVersion string) error {
	if id == "" {
		return fmt.Errorf("this moat was not built by scripts/setup, so it has no source ID to match moat-guest with")
	}
	if !filepath.IsAbs(p) {
		return fmt.Errorf("%s is not an absolute path", p)
	}
	if _, err := os.Lstat(p); os.IsNotExist(err) {
		return fmt.Errorf("moat-guest is not installed at %s; scripts/setup installs it", p)
	}
	if err := rootOwned(p, false); err != nil {
		return err
	}
	// Every directory above it too: whoever may write one could swap it.
	// And all of it reachable by others: the native tier's init execs it
	// as its user namespace's root, an unprivileged host id.
	for d := filepath.Dir(p); ; d = filepath.Dir(d) {
		if err := rootOwned(d, true); err != nil {
			return err
		}
		if fi, err := os.Stat(d); err == nil && fi.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("%s is not searchable by others (mode %04o): the sandbox's init could not execute moat-guest below it", d, fi.Mode().Perm())
		}
		if d == "/" {
			break
		}
	}
	if fi, err := os.Stat(p); err == nil && fi.Mode().Perm()&0o001 == 0 {
		return fmt.Errorf("%s is not executable by others (mode %04o): the sandbox's init could not execute it", p, fi.Mode().Perm())
	}
	other, err := buildinfo.ReadFile(p)
	if err != nil {
		return fmt.Errorf("%s: no Go build information: %v", p, err)
	}
	return sameSource(id, goVersion, other)
}

// sourceIDFlag is how scripts/setup passes the source ID to the linker.
const sourceIDFlag = "-X github.com/moat-sandbox/moat/internal/sourceid.ID="

// sameSource is nil when other was built by Go goVersion with source id.
func sameSource(id, goVersion string, other *debug.BuildInfo) error {
	var ldflags, cgo string
	for _, s := range other.Settings {
		switch s.Key {
		case "-ldflags":
			ldflags = s.Value
		case "CGO_ENABLED":
			cgo = s.Value
		}
	}
	var theirs string
	if _, after, ok := strings.Cut(ldflags, sourceIDFlag); ok {
		theirs, _, _ = strings.Cut(after, " ")
		theirs = strings.Trim(theirs, `'"`)
	}
	switch {
	case other.Main.Path != "github.com/moat-sandbox/moat":
		return fmt.Errorf("moat-guest is of module %q, not Moat's", other.Main.Path)
	case theirs == "":
		return fmt.Errorf("moat-guest has no source ID: run scripts/setup")
	case theirs != id:
		return fmt.Errorf("moat-guest was built from other source (%s, this moat %s): run scripts/setup", theirs, id)
	case other.GoVersion != goVersion:
		return fmt.Errorf("moat-guest was built with %s, this moat with %s: run scripts/setup", other.GoVersion, goVersion)
	case cgo != "0":
		return fmt.Errorf("moat-guest was built with cgo: it must be static")
	}
	return nil
}

// rootOwned checks that p (not a symlink) is owned by root and writable by
// nobody else; a directory writable by others must be sticky (/tmp), so
// that they cannot rename or delete what root put there.
func rootOwned(p string, dir bool) error {
	fi, err := os.Lstat(p)
	if err != nil {
		return err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case dir && !fi.IsDir(), !dir && !fi.Mode().IsRegular():
		return fmt.Errorf("%s is not a regular %s", p, map[bool]string{true: "directory", false: "file"}[dir])
	case !ok || st.Uid != 0:
		return fmt.Errorf("%s is not owned by root", p)
	case fi.Mode().Perm()&0o022 != 0 && !(dir && fi.Mode()&os.ModeSticky != 0):
		return fmt.Errorf("%s is writable by group or others (mode %04o)", p, fi.Mode().Perm())
	}
	return nil
}
