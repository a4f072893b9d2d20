package engine

import (
	"debug/buildinfo"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"syscall"
)

// DefaultGuest is where scripts/setup installs moat-guest (cmd/moat-guest),
// the in-sandbox half of moat alone; $MOAT_GUEST overrides it.
const DefaultGuest = "/usr/local/lib/moat/moat-guest"

// GuestBinary returns the executable the tiers start inside sandboxes
// (native's init, gVisor's init, the microvm agent) when Options.Exe is
// not set, and why: moat-guest when it was built from exactly the source
// this moat was, else this moat binary itself ("/proc/self/exe"), which
// carries the same code. Both work; moat-guest starts several times faster
// (docs/RATIONALE.md).
//
// Built from exactly the same source means: both binaries record the same
// Go version, module and VCS revision, and neither was built from a tree
// with uncommitted changes. A development build (a modified tree) or one
// without VCS information always uses itself, so an outdated moat-guest
// is never run. moat-guest must be a regular file owned by root and not
// writable by anyone else, in a directory likewise: root runs it, and a
// sandbox's init is trusted code.
func GuestBinary() (path, why string) {
	p := DefaultGuest
	if env := os.Getenv("MOAT_GUEST"); env != "" {
		p = env
	}
	self, ok := debug.ReadBuildInfo()
	if !ok {
		return "/proc/self/exe", "this moat binary (it records no build information)"
	}
	if err := checkGuest(p, self); err != nil {
		return "/proc/self/exe", "this moat binary (" + err.Error() + ")"
	}
	return p, p + " (built from the same commit)"
}

// checkGuest says why the binary at p may not stand in for self's guest
// half, or nil.
func checkGuest(p string, self *debug.BuildInfo) error {
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
	for d := filepath.Dir(p); ; d = filepath.Dir(d) {
		if err := rootOwned(d, true); err != nil {
			return err
		}
		if d == "/" {
			break
		}
	}
	other, err := buildinfo.ReadFile(p)
	if err != nil {
		return fmt.Errorf("%s: no Go build information: %v", p, err)
	}
	return sameSource(self, other)
}

// sameSource is nil when both builds come from one committed revision of
// one module with one Go version.
func sameSource(self, other *debug.BuildInfo) error {
	settings := func(bi *debug.BuildInfo) map[string]string {
		m := map[string]string{}
		for _, s := range bi.Settings {
			m[s.Key] = s.Value
		}
		return m
	}
	a, b := settings(self), settings(other)
	switch {
	case self.Main.Path != other.Main.Path:
		return fmt.Errorf("moat-guest is of module %q, this moat of %q", other.Main.Path, self.Main.Path)
	case self.GoVersion != other.GoVersion:
		return fmt.Errorf("moat-guest was built with %s, this moat with %s", other.GoVersion, self.GoVersion)
	case a["vcs.revision"] == "":
		return fmt.Errorf("this moat records no VCS revision")
	case a["vcs.modified"] != "false":
		return fmt.Errorf("this moat was built from a tree with uncommitted changes")
	case b["vcs.revision"] != a["vcs.revision"]:
		return fmt.Errorf("moat-guest was built from revision %.12s, this moat from %.12s: run scripts/setup", b["vcs.revision"], a["vcs.revision"])
	case b["vcs.modified"] != "false":
		return fmt.Errorf("moat-guest was built from a tree with uncommitted changes: run scripts/setup")
	case b["CGO_ENABLED"] != "0":
		return fmt.Errorf("moat-guest was built with cgo: it must be static")
	}
	return nil
}

// rootOwned checks that p (not a symlink) is owned by root and writable by
// nobody else.
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
	case fi.Mode().Perm()&0o022 != 0:
		return fmt.Errorf("%s is writable by group or others (mode %04o)", p, fi.Mode().Perm())
	}
	return nil
}
