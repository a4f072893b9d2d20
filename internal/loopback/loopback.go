// Package loopback brings up lo, the one interface of a fresh network
// namespace or VM: native's init, the microVM agent and the test VMs use it.
package loopback

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// Up sets IFF_UP on lo in the caller's network namespace; the kernel then
// gives it 127.0.0.1/8 and ::1. It adds no route anywhere else.
func Up() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("loopback: socket: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return fmt.Errorf("loopback: %w", err)
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("loopback: get flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP | unix.IFF_RUNNING)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("loopback: up: %w", err)
	}
	return nil
}
