// Package libdir finds the files Moat installs beside its binary: the
// moat-guest binary and the wasm tier's guests. One rule, used by every
// caller: look in <prefix>/lib/moat, where <prefix> is the directory above
// the running moat's own bin/ (so /usr/bin/moat, installed by the .deb,
// finds /usr/lib/moat and /usr/local/bin/moat, installed by scripts/setup,
// finds /usr/local/lib/moat), then in Default.
//
// It only says where to look. Whether what is there may be trusted (owned
// by root, built from the same source) is the caller's check.
package libdir

import (
	"os"
	"path/filepath"
)

// Default is where scripts/setup installs them.
const Default = "/usr/local/lib/moat"

// Find returns the path of name (e.g. "moat-guest" or "wasm") in the first
// of Candidates that exists, else the one in Default, for the caller's
// message about what is missing.
func Find(name string) string {
	exe, err := os.Executable()
	if err != nil {
		exe = ""
	}
	return find(exe, name, func(p string) bool {
		_, err := os.Lstat(p)
		return err == nil
	})
}

func find(exe, name string, exists func(string) bool) string {
	cands := Candidates(exe)
	for _, d := range cands {
		if p := filepath.Join(d, name); exists(p) {
			return p
		}
	}
	return filepath.Join(Default, name)
}

// Paths returns name in each of Candidates of the running moat, in order,
// whether it exists or not, for a caller that checks each (moat-guest
// must be trusted, not merely present).
func Paths(name string) []string {
	exe, err := os.Executable()
	if err != nil {
		exe = ""
	}
	return paths(exe, name)
}

func paths(exe, name string) []string {
	var ps []string
	for _, d := range Candidates(exe) {
		ps = append(ps, filepath.Join(d, name))
	}
	return ps
}

// Candidates are the directories Find looks in for a moat binary at exe,
// in order: <dir of exe>/../lib/moat, then Default (once).
func Candidates(exe string) []string {
	var dirs []string
	if filepath.IsAbs(exe) {
		dirs = append(dirs, filepath.Join(filepath.Dir(filepath.Dir(exe)), "lib", "moat"))
	}
	if len(dirs) == 0 || dirs[0] != Default {
		dirs = append(dirs, Default)
	}
	return dirs
}
