package native

import (
	"os"
	"os/exec"
)

// IDRange is a host id range for a sandbox whose life outlives this
// process: an OCI container (package ociruntime), whose init is started
// by one short-lived runtime command and ended through another. The
// range's slot lock belongs to File's open file description; handing
// File to the container's init keeps the slot taken exactly as long as
// that init lives.
type IDRange struct{ slot *idSlot }

// AllocIDRange takes a free host id range (see IDSlotsFile).
func AllocIDRange() (*IDRange, error) {
	s, err := allocIDSlot()
	if err != nil {
		return nil, err
	}
	return &IDRange{slot: s}, nil
}

// Base is the host id that the sandbox's id 0 maps to.
func (r *IDRange) Base() int { return r.slot.base() }

// Size is how many ids the range maps.
func (r *IDRange) Size() int { return idRange }

// File is the descriptor whose lock holds the range.
func (r *IDRange) File() *os.File { return r.slot.f }

// Release closes this process's hold on the range.
func (r *IDRange) Release() { r.slot.release() }

// StartOwnedBy starts cmd, which asks for a new user namespace, with that
// namespace owned by host id owner rather than the host's root (see
// startOwnedBy for why each sandbox's books are its own).
func StartOwnedBy(cmd *exec.Cmd, owner int) error { return startOwnedBy(cmd, owner) }
