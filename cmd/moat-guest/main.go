// Command moat-guest is the part of moat that runs inside sandboxes, alone
// (package guest): the native tier's init, the gVisor tier's init and the
// microvm tier's agent. scripts/setup installs it as
// /usr/local/lib/moat/moat-guest; moat starts it instead of re-executing
// itself when both were built from the same commit (engine.GuestBinary),
// because it starts several times faster. It does nothing on its own.
package main

import (
	"fmt"
	"os"

	"github.com/moat-sandbox/moat/guest"
)

func main() {
	guest.Dispatch()
	fmt.Fprintln(os.Stderr, "moat-guest is what moat runs inside its sandboxes; it does nothing on its own (use moat)")
	os.Exit(2)
}
