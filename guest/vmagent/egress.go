package vmagent

// The egress channel: with an egress grant the VM gets a second
// virtio-serial port (EgressPortName) and still no network device. The
// agent listens on the guest's own 127.0.0.1:EgressPort and carries each
// accepted connection as one yamux stream over the port; the host relays
// each stream to Moat's egress proxy. The guest is the yamux client (it
// opens every stream), the host the server. The bytes are never
// interpreted on the way: the proxy decides.

import (
	"fmt"
	"net"
	"strconv"

	"github.com/hashicorp/yamux"

	"github.com/moat-sandbox/moat/guest/relay"
	"github.com/moat-sandbox/moat/guest/vmagent/vmwire"
)

// startEgress serves 127.0.0.1:port (loopback is up already), each
// connection a stream over the egress port. It fails rather than start
// the command without the egress it was granted.
func startEgress(port int) error {
	if port <= 0 || port > 65535 {
		return fmt.Errorf("egress: bad port %d", port)
	}
	f, err := openPort(vmwire.EgressPortName)
	if err != nil {
		return fmt.Errorf("egress: %w", err)
	}
	sess, err := yamux.Client(f, vmwire.EgressConfig())
	if err != nil {
		f.Close()
		return fmt.Errorf("egress: %w", err)
	}
	// Listening before the command starts, as root: the program cannot
	// take the port first.
	l, err := net.Listen("tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		sess.Close()
		return fmt.Errorf("egress: listen on 127.0.0.1:%d: %w", port, err)
	}
	go relay.ServeDial(l, func() (net.Conn, error) {
		st, err := sess.OpenStream()
		if err != nil {
			return nil, err
		}
		return halfClosing{st}, nil
	}, vmwire.EgressMaxConns)
	return nil
}

// halfClosing is a stream whose CloseWrite is yamux's Close: a FIN that
// still lets the other direction finish.
type halfClosing struct{ *yamux.Stream }

func (h halfClosing) CloseWrite() error { return h.Stream.Close() }
