package tier

import (
	"context"
	"errors"
	"net"
)

// Dialer is implemented by sandboxes the host can open a TCP connection
// into (manifest network.inbound): DialPort connects to 127.0.0.1:port in
// the sandbox's own network namespace, where a program in the sandbox
// listens, and returns the host's end. It never makes the sandbox
// reachable from any network: each connection is made by Moat, for one
// request the front door has authorised. Whether the manifest grants
// port is the caller's to check; a tier refuses only what it can never
// dial (the egress proxy's port, which is Moat's and not the program's).
// A sandbox without it cannot be reached from outside at all.
type Dialer interface {
	DialPort(ctx context.Context, port int) (net.Conn, error)
}

// ErrPortReserved is wrapped by DialPort's error for a port inside the
// sandbox that belongs to Moat (the egress proxy's), never the program's.
var ErrPortReserved = errors.New("the port is Moat's own inside the sandbox")
