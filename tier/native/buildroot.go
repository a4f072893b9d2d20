package native

import (
	"fmt"

	"github.com/moat-sandbox/moat/internal/idshift"
)

// An image build step (tier.Spec.Build) runs with the image tree itself as
// its root, read-write. Its user namespace maps ids 0..65535 to the run's
// host range, so the tree's files, owned by host ids, would be nobody's
// inside: a step running as uid 0 could write none of them. The tree's
// ownership is therefore moved into the range (x -> base+x) before init
// starts, and back (base+x -> x) once every process of the sandbox is
// dead, before the range is released: after Destroy every file is owned
// by the ids it had inside. docs/RATIONALE.md has why a chown walk
// rather than an idmapped mount.

// shiftRoot moves the tree into the run's id range, recording it in the
// run's state directory first, so that GC puts back a tree whose moat
// died (idshift.Restore).
func (s *sandbox) shiftRoot() error {
	root, base := s.spec.ImageRoot, s.ids.base()
	if s.spec.StateDir != "" {
		if err := idshift.Mark(s.spec.StateDir, root, base); err != nil {
			return err
		}
	}
	// From the first lchown on, Destroy must shift back, even after a
	// failed In (entries before the failure are shifted).
	s.shifted = true
	if err := idshift.In(root, base); err != nil {
		return fmt.Errorf("build step: %w", err)
	}
	return nil
}

// unshiftRoot moves the tree back to the host's ids and drops the record.
// The sandbox must be dead.
func (s *sandbox) unshiftRoot() error {
	if err := idshift.Out(s.spec.ImageRoot, s.ids.base()); err != nil {
		return fmt.Errorf("build step: give the tree back its own ids: %w", err)
	}
	s.shifted = false
	if s.spec.StateDir != "" {
		return idshift.Unmark(s.spec.StateDir)
	}
	return nil
}
