package engine

import (
	"context"
	"errors"
	"fmt"
	"net"

	"github.com/moat-sandbox/moat/tier"
)

// ErrPortNotGranted is returned (wrapped) by DialPort for a port the
// session's manifest does not list in network.inbound.
var ErrPortNotGranted = errors.New("the manifest does not grant inbound connections to this port")

// DialPort opens a TCP connection from the host to 127.0.0.1:port inside
// the session's sandbox, when the manifest's network.inbound grants port
// and the tier can (tier.Dialer; otherwise an error wrapping
// tier.ErrUnavailable). What the program answers is hostile input to
// whoever reads the connection.
func (s *Session) DialPort(ctx context.Context, port int) (net.Conn, error) {
	if err := s.open(); err != nil {
		return nil, err
	}
	if !s.m.Network.InboundAllows(port) {
		return nil, fmt.Errorf("%w: port %d is not in network.inbound", ErrPortNotGranted, port)
	}
	d, ok := s.p.sb.(tier.Dialer)
	if !ok {
		return nil, fmt.Errorf("%w: the %s tier cannot connect into a sandbox (network.inbound is served by the native tier)", tier.ErrUnavailable, s.p.tier.Name())
	}
	return d.DialPort(ctx, port)
}
