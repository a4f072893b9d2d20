// Package guestkernel is how Moat boots its guest kernel (Debian's
// linux-image-cloud-amd64, which scripts/setup extracts): where the kernel
// lives and the command line it needs. The microvm tier boots it for runs;
// internal/testvm boots it for tests that need a kernel the host lacks.
package guestkernel

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// DefaultDir is where scripts/setup extracts the kernel package:
// DIR/vmlinuz and DIR/lib/modules/VERSION/. $MOAT_MICROVM_KERNEL
// overrides it.
const DefaultDir = "/var/cache/moat/microvm-kernel"

// Dir is $MOAT_MICROVM_KERNEL, else DefaultDir.
func Dir() string {
	if d := os.Getenv("MOAT_MICROVM_KERNEL"); d != "" {
		return d
	}
	return DefaultDir
}

// Modules are the kernel's modules a guest with a disk and a
// virtio-serial port needs, relative to lib/modules/VERSION/kernel, in
// dependency order (Debian's cloud kernel builds virtio as modules; ext4
// is built in).
var Modules = []string{
	"drivers/virtio/virtio_ring.ko",
	"drivers/virtio/virtio.ko",
	"drivers/virtio/virtio_mmio.ko",
	"drivers/block/virtio_blk.ko",
	"drivers/char/virtio_console.ko",
}

// ModuleDir is DIR/lib/modules/VERSION/kernel of the kernel in dir.
func ModuleDir(dir string) (string, error) {
	mods, _ := filepath.Glob(filepath.Join(dir, "lib/modules/*/kernel"))
	if len(mods) != 1 {
		return "", fmt.Errorf("expected one lib/modules/VERSION in %s, found %d", dir, len(mods))
	}
	return mods[0], nil
}

// base keeps the guest quiet and makes a guest panic end the VMM
// (panic=-1 reboots, -no-reboot turns that into exit). Under TCG on a
// loaded host the kernel's TSC calibration against the emulated PIT fails
// and boot then hangs (seen about once in ten boots of a one-vCPU VM on
// this host): TCG's guest TSC runs at the host's rate, so Cmdline gives
// the host's frequency instead (tsc_early_khz), and the IO-APIC timer
// check, which times emulated interrupts, is skipped.
//
// reboot=t: the restart after a panic is a triple fault, which QEMU turns
// into its exit at once. The default order tries ACPI, the keyboard
// controller (polled up to 64Ki times per attempt) and port CF9 first, none
// of which a microvm machine has; under TCG on a loaded host that took over
// a minute (seen in CI), a VM that had panicked and still held its RAM.
const base = "console=ttyS0 panic=-1 reboot=t rdinit=/init tsc=reliable no_timer_check"

// Cmdline is the kernel command line: quiet unless verbose (every kernel
// message on the console, for debugging a boot).
func Cmdline(verbose bool) string {
	s := base + " quiet loglevel=1"
	if verbose {
		s = base + " loglevel=7"
	}
	if khz := hostTSCkHz(); khz > 0 {
		s += " tsc_early_khz=" + strconv.FormatInt(khz, 10)
	}
	return s
}

// Machine is QEMU's -M for this kernel: the microvm machine without option
// ROMs, with the legacy timers the kernel calibrates against, and an ISA
// serial port (the console) only when serial is set.
func Machine(serial bool) string {
	return "microvm,x-option-roms=off,pit=on,pic=on,rtc=on,isa-serial=" + strconv.FormatBool(serial)
}

// TCGCPU is QEMU's -cpu under TCG: the default model; with "max" the
// kernel's TSC calibration hangs on this QEMU.
const TCGCPU = "qemu64"

// hostTSCkHz is the host CPU's clock in kHz from /proc/cpuinfo, or 0.
func hostTSCkHz() int64 {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok && strings.TrimSpace(k) == "cpu MHz" {
			mhz, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil || mhz <= 0 {
				return 0
			}
			return int64(mhz * 1000)
		}
	}
	return 0
}
