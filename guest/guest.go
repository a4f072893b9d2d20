// Package guest is the part of Moat that runs inside sandboxes: the native
// tier's init (nsinit), the gVisor tier's init (gvinit) and the microvm
// tier's agent (vmagent), with the relay they share. This file is their
// common entry point.
//
// Two binaries carry it: moat itself, and moat-guest (cmd/moat-guest),
// which holds nothing else: no CLI, no server, no other tier's host code.
// Every cold sandbox starts a guest process, and Go runs every linked
// package's initialisation before main, so the small binary starts in a
// fraction of the time (see docs/RATIONALE.md). Nothing here may run on the
// host side of a sandbox.
package guest

import (
	"os"

	"github.com/moat-sandbox/moat/guest/gvinit"
	"github.com/moat-sandbox/moat/guest/nsinit"
	"github.com/moat-sandbox/moat/guest/nsinit/nswire"
	"github.com/moat-sandbox/moat/guest/vmagent"
)

// Dispatch becomes the guest role this process was started as, by its
// hidden argument (or, for the microvm agent, by being the VM's /init),
// and then never returns. It returns when the process is none of them.
// Call it first thing in main.
func Dispatch() {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case nswire.Arg:
			nsinit.Main()
		case gvinit.Arg:
			gvinit.Main()
		case vmagent.ExecArg:
			vmagent.Main()
		}
	}
	if vmagent.IsAgent() {
		vmagent.Main()
	}
}
