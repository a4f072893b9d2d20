package tier

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/moat-sandbox/moat/cgroup"
)

// Config is what every tier's constructor receives: the one description
// of how this Moat starts sandboxes, so that the engine and moat doctor
// build every tier the same way. The zero value is usable: each empty
// field has the default documented beside it.
type Config struct {
	// Home is Moat's state directory; a tier keeps its caches below it
	// (the microvm tier in Home/microvm). Empty: the tier keeps no cache
	// under a home (the microvm tier refuses to start).
	Home string
	// Exe is the executable the tier starts inside sandboxes (native's
	// init, gVisor's init, the microvm agent): moat itself or moat-guest.
	// Empty: /proc/self/exe.
	Exe string
	// Moat is the moat binary re-executed for host-side helpers (the
	// microvm tier's VMM jailer), never moat-guest. Empty: /proc/self/exe.
	Moat string
}

// Constructor checks that this host can run a tier and returns it. Its
// error explains what is missing and wraps ErrUnavailable.
type Constructor func(Config) (Tier, error)

// ErrUnknown is returned (wrapped) by Lookup for a name no tier registered.
var ErrUnknown = errors.New("no such tier in this build")

var registry struct {
	mu    sync.Mutex
	ctors map[string]Constructor
}

// Register makes a tier available by name. Each tier package calls it
// from its init function; a program chooses its tiers by importing their
// packages (cmd/moat imports all four). Registering an empty name, a nil
// constructor or a name twice is a bug in the program, found when it
// starts: Register panics then, as database/sql.Register and gVisor's
// platform.Register do.
func Register(name string, c Constructor) {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	if name == "" || c == nil {
		panic(fmt.Sprintf("tier.Register(%q): empty name or nil constructor", name))
	}
	if _, dup := registry.ctors[name]; dup {
		panic(fmt.Sprintf("tier.Register(%q): registered twice", name))
	}
	if registry.ctors == nil {
		registry.ctors = map[string]Constructor{}
	}
	registry.ctors[name] = c
}

// Lookup returns the constructor of the named tier. For a name nobody
// registered, the error wraps ErrUnknown and names the tiers there are.
func Lookup(name string) (Constructor, error) {
	registry.mu.Lock()
	c, ok := registry.ctors[name]
	registry.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("tier %q: %w; available: %s", name, ErrUnknown, strings.Join(List(), ", "))
	}
	return c, nil
}

// List returns the registered tier names, sorted.
func List() []string {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	names := make([]string, 0, len(registry.ctors))
	for n := range registry.ctors {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// OrphanCollector is implemented by tiers that confine runs in cgroups
// named moat/<run id>: Cgroups is the view of the host's cgroups through
// which the engine's GC lists and removes the cgroups dead runs left.
type OrphanCollector interface {
	Cgroups() *cgroup.Host
}

// Describer is implemented by tiers that can say more about themselves
// than that they are ready (moat doctor prints it). Describe returns the
// detail of the "ready" line ("" for none) and further lines to print
// under it; an error means the tier cannot run here after all (an
// accelerator that does not work) and is printed as why.
type Describer interface {
	Describe(ctx context.Context) (ready string, notes []string, err error)
}
