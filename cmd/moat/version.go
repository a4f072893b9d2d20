package main

// moat version: Moat's version (set at build time, else the VCS revision)
// and the kernel features its tiers use (package kernel).

import (
	"fmt"
	"runtime/debug"

	"github.com/moat-sandbox/moat/kernel"
)

func cmdVersion(args []string) int {
	fs := newFlags("version", "Usage: moat version\n\nPrints Moat's version and the kernel features its tiers use.\n")
	if c := parse(fs, args); c >= 0 {
		return c
	}
	fmt.Printf("moat %s\n", versionString())
	r := kernel.Probe()
	fmt.Printf("kernel %s\n", r.Release)
	for _, f := range r.Features {
		mark := "yes"
		if !f.OK {
			mark = "no "
		}
		fmt.Printf("  %-16s %s  %s\n", f.Name, mark, f.Detail)
	}
	return 0
}

// version is set at build time with -ldflags "-X main.version=...".
var version = ""

func versionString() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		rev, dirty := "", false
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
		if len(rev) > 12 {
			rev = rev[:12]
		}
		if rev != "" {
			if dirty {
				rev += "-dirty"
			}
			return "dev-" + rev
		}
	}
	return "dev"
}
