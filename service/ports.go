package service

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/tier"
)

// Inbound connections: the host connects, on a client's behalf, to a port
// a program listens on inside a sandbox (manifest network.inbound). Who
// may ask is the front door's to decide (the E2B API's traffic token);
// this is the one place that checks the sandbox is the key's, running,
// and that its manifest grants the port.

// PortDialer is implemented by a Session whose sandbox the host can
// connect into (engine.Session; it refuses a port its manifest does not
// grant, wrapping engine.ErrPortNotGranted, and a tier that cannot,
// wrapping tier.ErrUnavailable).
type PortDialer interface {
	DialPort(ctx context.Context, port int) (net.Conn, error)
}

// ErrNotListening is wrapped by DialPort's error when nothing in the
// sandbox accepts connections on the port (E2B's "port is not open").
var ErrNotListening = errors.New("nothing in the sandbox listens on this port")

// DialPort connects to 127.0.0.1:port inside key's running sandbox id. The
// errors: NotFound (no such sandbox of key's), Conflict (not running, or
// nothing listening: wraps ErrNotListening), Forbidden (network.inbound
// does not list port), Invalid (not a port), Unavailable (a tier that
// cannot connect into its sandboxes).
func (s *Service) DialPort(ctx context.Context, key audit.Key, id string, port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, InvalidField("port", "%d is not a TCP port (1-65535)", port)
	}
	sb, e := s.lookup(key, id)
	if e != nil {
		return nil, e
	}
	s.mu.Lock()
	state := sb.state
	s.mu.Unlock()
	if state != StateRunning {
		return nil, conflict("sandbox %s is %s: its ports are reachable only while it runs", sb.id, state)
	}
	if !sb.manifest.Network.InboundAllows(port) {
		return nil, notGranted(sb.id, port)
	}
	d, ok := sb.sess.(PortDialer)
	if !ok {
		return nil, unavailable("this host's sandboxes cannot be connected into (network.inbound is served by the native tier)")
	}
	c, err := d.DialPort(ctx, port)
	switch {
	case err == nil:
		return c, nil
	case errors.Is(err, engine.ErrPortNotGranted):
		return nil, notGranted(sb.id, port)
	case errors.Is(err, tier.ErrPortReserved):
		return nil, &Error{Kind: Forbidden, Field: "port", Message: fmt.Sprintf("port %d of sandbox %s is Moat's egress proxy inside the sandbox, never reachable from outside", port, sb.id), Err: err}
	case errors.Is(err, syscall.ECONNREFUSED):
		return nil, &Error{Kind: Conflict, Message: fmt.Sprintf("sandbox %s is running but nothing listens on port %d (start a server on 0.0.0.0:%d or 127.0.0.1:%d inside it)", sb.id, port, port, port),
			Err: fmt.Errorf("%w: %w", ErrNotListening, err)}
	}
	return nil, requestError(err, "sandbox "+Quote(id), "port")
}

func notGranted(id string, port int) *Error {
	return Errorf(Forbidden, "network.inbound", "port %d of sandbox %s is not open to inbound connections: its manifest's network.inbound does not list it", port, id)
}
