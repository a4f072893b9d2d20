package main

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/tier"
)

func cmdDoctor(args []string) int {
	fs := newFlags("doctor", "Usage: moat doctor\n\nExplains what this host supports, which tiers can run here and why not,\nand which images are built. Exit status 0 when the native tier is usable.\n")
	if c := parse(fs, args); c >= 0 {
		return c
	}
	cmdVersion(nil)
	// The engine builds the tiers, so that doctor sees them exactly as a
	// run would (the same init, agent and jailer binaries).
	e, err := engine.New(engine.Options{})
	if err != nil {
		return fail(err)
	}
	fmt.Println("tiers:")
	code := 0
	def := manifest.Default().Tier
	for _, name := range doctorOrder(def, tier.List()) {
		ready, notes, err := describe(e, name)
		if err != nil {
			fmt.Printf("  %-7s unavailable: %v\n", name, err)
			if name == def {
				code = 1
			}
			continue
		}
		if ready != "" {
			ready = ": " + ready
		}
		fmt.Printf("  %-7s ready%s\n", name, ready)
		for _, n := range notes {
			fmt.Printf("          %s\n", n)
		}
	}
	fmt.Printf("state: %s\n", e.Home())
	fmt.Printf("inside sandboxes: %s\n", e.Guest())
	imgs, _ := e.Images().List()
	var names []string
	for _, img := range imgs {
		if img.Current {
			names = append(names, img.Name+" "+img.Digest)
		}
	}
	sort.Strings(names)
	if len(names) == 0 {
		fmt.Println("images: none built (moat run builds python on first use, or: moat image build python)")
	} else {
		fmt.Printf("images: %s\n", strings.Join(names, ", "))
	}
	return code
}

// doctorOrder lists the default tier first (the exit status is about it),
// then the others by name.
func doctorOrder(def string, names []string) []string {
	out := []string{}
	for _, n := range names {
		if n == def {
			out = append([]string{n}, out...)
		} else {
			out = append(out, n)
		}
	}
	return out
}

// describe builds the named tier as the engine does and says what doctor
// prints about it (tier.Describer); an error means it cannot run here.
func describe(e *engine.Engine, name string) (ready string, notes []string, err error) {
	t, err := e.Tier(name)
	if err != nil {
		return "", nil, err
	}
	// Doctor is done with the tier once described (the wasm tier holds a
	// compiled runtime).
	if c, ok := t.(io.Closer); ok {
		defer c.Close()
	}
	if d, ok := t.(tier.Describer); ok {
		return d.Describe(context.Background())
	}
	return "", nil, nil
}
