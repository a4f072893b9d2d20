// Package sdnotify tells the service manager that started this process
// (systemd, with Type=notify) how its start and stop are going: READY=1
// once it serves, STOPPING=1 when it begins to shut down. It implements the
// sd_notify(3) datagram protocol against $NOTIFY_SOCKET, which is all it
// is: twenty lines do not need libsystemd or a dependency.
//
// It must never block a server or fail it: without $NOTIFY_SOCKET (not
// under systemd, or a unit that is not Type=notify) Notify does nothing.
package sdnotify

import (
	"fmt"
	"net"
	"os"
	"strings"
)

// Socket is the environment variable systemd sets to the notification
// socket's address.
const Socket = "NOTIFY_SOCKET"

// The states Moat reports (sd_notify(3)).
const (
	// Ready says start-up is finished: for moat serve, the listener is
	// accepting connections. Until it arrives, systemd keeps the unit
	// "activating" and units ordered after it wait.
	Ready = "READY=1"
	// Stopping says shutdown has begun (the drain), so systemd shows the
	// unit "deactivating" instead of a service that stopped answering.
	Stopping = "STOPPING=1"
)

// Notify sends state (one or more NAME=VALUE lines) to $NOTIFY_SOCKET. It
// returns false, nil when the variable is unset: the process was not
// started by a service manager that asked for notifications. An address
// starting with "@" is in the abstract namespace (sd_notify(3)).
func Notify(state string) (sent bool, err error) {
	addr := os.Getenv(Socket)
	if addr == "" {
		return false, nil
	}
	if !strings.HasPrefix(addr, "/") && !strings.HasPrefix(addr, "@") {
		return false, fmt.Errorf("sd_notify: $%s=%q: want an absolute socket path or an @abstract name", Socket, addr)
	}
	conn, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: addr, Net: "unixgram"})
	if err != nil {
		return false, fmt.Errorf("sd_notify %s: %w", addr, err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte(state)); err != nil {
		return false, fmt.Errorf("sd_notify %s: %w", addr, err)
	}
	return true, nil
}
