package servicetest

import (
	"context"
	"fmt"
	"net"
	"os"
	"syscall"

	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/service"
)

var _ service.PortDialer = (*Session)(nil)

// Listen makes port inside every fake sandbox reach addr, a listener on
// the host (an httptest server's), as engine.Session.DialPort reaches a
// program listening inside a real one. A port never given is closed:
// dialing it is refused as an unanswered connect is.
func (b *Backend) Listen(port int, addr string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ports == nil {
		b.ports = map[int]string{}
	}
	b.ports[port] = addr
}

// DialPort implements service.PortDialer as engine.Session does: the
// manifest's network.inbound must grant port.
func (s *Session) DialPort(ctx context.Context, port int) (net.Conn, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	if !s.manifest.Network.InboundAllows(port) {
		return nil, fmt.Errorf("%w: port %d is not in network.inbound", engine.ErrPortNotGranted, port)
	}
	s.b.mu.Lock()
	addr := s.b.ports[port]
	s.b.mu.Unlock()
	if addr == "" {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	}
	var d net.Dialer
	return d.DialContext(ctx, "tcp", addr)
}
