package native

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"

	"golang.org/x/sys/unix"
)

// Each live sandbox has a host id range of its own: its user namespace
// maps ids 0..idRange-1 to HostIDBase + slot*idRange + (0..idRange-1),
// and that range's first id owns the user namespace. The kernel keeps
// per-user books by host id and by a user namespace's owner: pipe buffer
// pages, descriptors in flight over unix sockets, inotify instances,
// queued signals, user namespaces. With one range for all runs, one run
// could exhaust the host root's inotify or signal budget (the owner was
// root) or pass a token to a concurrent run through the shared counters
// (issue 17). With a range per run, each run's books are its own.
const (
	// HostIDBase is the first host id of the first slot. Ids from here up
	// are unused on any sane host and own nothing, so even a process that
	// reached a host file would have only "other" permissions on it. It
	// lies above the microVM tier's jail ids (0x71000000 + 2^22): no
	// sandbox id is ever a jailed VMM's.
	HostIDBase = 0x72000000
	idRange    = 65536
	// idSlots ranges end below 0x80000000: ids that read as negative in
	// signed 32-bit fields confuse tools.
	idSlots = (0x80000000 - HostIDBase) / idRange

	SandboxUID = 1000
	SandboxGID = 1000
)

// IDSlotsFile is where the slots are allocated: byte i of this file is
// slot i, held with an open-file-description lock (F_OFD_SETLK) by the
// process whose sandbox uses it, for the sandbox's whole life. The lock
// goes with the process, so a killed moat frees its slots; the file's
// content means nothing. On tmpfs (/run) it is gone after a reboot, like
// every lock on it. Host-wide, not per home: ids are host-wide.
var IDSlotsFile = "/run/moat/id-slots"

// idSlot is one sandbox's host id range, held until release.
type idSlot struct {
	f    *os.File
	slot int
}

// base is the host id that the sandbox's id 0 maps to.
func (s *idSlot) base() int { return HostIDBase + s.slot*idRange }

// allocIDSlot takes a free slot, starting at a random one so that
// concurrent moat processes rarely try the same slots.
func allocIDSlot() (*idSlot, error) {
	if err := os.MkdirAll(filepath.Dir(IDSlotsFile), 0o700); err != nil {
		return nil, fmt.Errorf("host id ranges: %w", err)
	}
	f, err := os.OpenFile(IDSlotsFile, os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("host id ranges: %w", err)
	}
	var b [4]byte
	rand.Read(b[:])
	start := int(binary.LittleEndian.Uint32(b[:]) % idSlots)
	for i := range idSlots {
		slot := (start + i) % idSlots
		lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: int64(slot), Len: 1}
		err := unix.FcntlFlock(f.Fd(), unix.F_OFD_SETLK, &lk)
		if err == nil {
			return &idSlot{f: f, slot: slot}, nil
		}
		if !errors.Is(err, unix.EAGAIN) && !errors.Is(err, unix.EACCES) {
			f.Close()
			return nil, fmt.Errorf("host id ranges: lock slot %d of %s: %w", slot, IDSlotsFile, err)
		}
	}
	f.Close()
	return nil, fmt.Errorf("host id ranges: all %d slots of %s are in use: too many sandboxes at once on this host", idSlots, IDSlotsFile)
}

// release frees the slot for another sandbox. Call it only once no
// process of the sandbox is left: its ids must own nothing when reused.
func (s *idSlot) release() {
	if s != nil && s.f != nil {
		s.f.Close()
		s.f = nil
	}
}

// startOwnedBy starts cmd, whose SysProcAttr asks for a new user
// namespace, so that the namespace's owner is host id owner rather than
// the host's root. The kernel makes the creating thread's effective uid
// the owner, and charges the namespace's inotify instances, queued
// signals and nested namespaces to the owner's books. So this thread,
// and only this one (credentials are per thread; the raw system calls
// change no other), takes owner as its effective uid for the clone and
// the uid/gid map writes that follow it in cmd.Start, with its effective
// capabilities raised again from the permitted set (a uid change from 0
// clears them; the clone must stay privileged so that no policy for
// unprivileged user namespaces applies, and the map writes need
// CAP_SETUID on the host), then goes back to uid 0.
func startOwnedBy(cmd *exec.Cmd, owner int) (err error) {
	runtime.LockOSThread()
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, ^uintptr(0), uintptr(owner), ^uintptr(0)); e != 0 {
		runtime.UnlockOSThread()
		return fmt.Errorf("start init as owner %d of its user namespace: setresuid: %w", owner, e)
	}
	defer func() {
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, ^uintptr(0), 0, ^uintptr(0)); e != 0 {
			// Never hand a thread with another uid back to the
			// scheduler: a locked thread whose goroutine ends is ended.
			err = errors.Join(err, fmt.Errorf("restore this thread's uid after starting init: %w", e))
			if cmd.Process != nil {
				cmd.Process.Kill()
				cmd.Wait()
			}
			return
		}
		runtime.UnlockOSThread()
	}()
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("start init: capget: %w", err)
	}
	for i := range data {
		data[i].Effective = data[i].Permitted
	}
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("start init: raise capabilities as owner %d: %w", owner, err)
	}
	return cmd.Start()
}
