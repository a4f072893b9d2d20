package main

// moat gc: remove what runs killed mid-way left behind (engine.GC).

import (
	"fmt"

	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/incident"
)

func cmdGC(args []string) int {
	fs := newFlags("gc", "Usage: moat gc\n\nRemoves what runs killed mid-way left behind: cgroups, run directories,\nabandoned image builds, and incident bundles past the retention policy.\nLive runs are never touched.\n")
	if c := parse(fs, args); c >= 0 {
		return c
	}
	// The incident policy first: a mistake in it is refused before
	// anything is removed.
	pol, err := incidentPolicy()
	if err != nil {
		return fail(err)
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
	// Incident bundles past the operator's age and total caps.
	pruned, err := incident.Open(engine.IncidentDir(e.Home()), pol).Prune(0)
	if len(pruned) > 0 {
		fmt.Printf("pruned %d incident bundles past the retention policy\n", len(pruned))
	}
	if err != nil {
		return fail(err)
	}
	return 0
}
