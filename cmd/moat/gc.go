package main

// moat gc: remove what runs killed mid-way left behind (engine.GC).

import (
	"fmt"

	"github.com/moat-sandbox/moat/engine"
)

func cmdGC(args []string) int {
	fs := newFlags("gc", "Usage: moat gc\n\nRemoves what runs killed mid-way left behind: cgroups, run directories,\nabandoned image builds. Live runs are never touched.\n")
	if c := parse(fs, args); c >= 0 {
		return c
	}
	e, err := engine.New(engine.Options{})
	if err != nil {
		return fail(err)
	}
	rep, err := e.GC()
	fmt.Printf("removed %d run directories, %d cgroups, %d abandoned image builds\n", len(rep.Runs), len(rep.Cgroups), len(rep.Images))
	if err != nil {
		return fail(err)
	}
	return 0
}
