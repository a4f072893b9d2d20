package ociruntime

import (
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// ParseSignal reads a signal as runc's kill takes it: a number, or a name
// with or without SIG (TERM, SIGTERM, sigkill).
func ParseSignal(s string) (unix.Signal, error) {
	if s == "" {
		return unix.SIGTERM, nil
	}
	if n, err := strconv.Atoi(s); err == nil {
		if n <= 0 || n > 64 {
			return 0, fmt.Errorf("signal %d: must be 1 to 64", n)
		}
		return unix.Signal(n), nil
	}
	name := strings.ToUpper(s)
	if !strings.HasPrefix(name, "SIG") {
		name = "SIG" + name
	}
	if sig := unix.SignalNum(name); sig != 0 {
		return sig, nil
	}
	return 0, fmt.Errorf("signal %q: not a signal name or number (e.g. TERM, SIGKILL, 9)", s)
}
