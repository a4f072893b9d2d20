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
	"io"
	"net"
	"strconv"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/moat-sandbox/moat/guest/relay"
)

// EgressPortName is the virtio-serial port that carries egress streams.
const EgressPortName = "moat-egress"

// EgressMaxConns bounds concurrent egress connections at both ends of the
// port: the bound every tier's in-sandbox relay applies.
const EgressMaxConns = relay.MaxConns

// EgressBacklog is how many opened streams may wait for the host to take
// them (the host takes each at once), and how many streams beyond the
// relay limit the guest may hold open before the host ends its session.
const EgressBacklog = 16

// EgressWindow is the largest receive window of a stream: the most either
// end buffers for a stream nobody reads (yamux's minimum).
const EgressWindow = 256 << 10

// EgressConfig is the yamux configuration of both ends. No keepalive (the
// port cannot silently drop, and a ping is a frame the host would have to
// answer), no logging (what a hostile guest makes yamux print must not
// reach the host's stderr), a small backlog, the minimum window, no
// timeout on opening (on one, yamux tears the whole session down; the
// host acknowledges every stream at once anyway), a bounded wait for a
// peer that stops taking writes or never finishes closing a stream.
func EgressConfig() *yamux.Config {
	return &yamux.Config{
		AcceptBacklog:          EgressBacklog,
		EnableKeepAlive:        false,
		KeepAliveInterval:      time.Minute, // unused; yamux wants it set
		ConnectionWriteTimeout: 10 * time.Second,
		MaxStreamWindowSize:    EgressWindow,
		StreamOpenTimeout:      0,
		StreamCloseTimeout:     30 * time.Second,
		LogOutput:              io.Discard,
	}
}

// startEgress serves 127.0.0.1:port (loopback is up already), each
// connection a stream over the egress port. It fails rather than start
// the command without the egress it was granted.
func startEgress(port int) error {
	if port <= 0 || port > 65535 {
		return fmt.Errorf("egress: bad port %d", port)
	}
	f, err := openPort(EgressPortName)
	if err != nil {
		return fmt.Errorf("egress: %w", err)
	}
	sess, err := yamux.Client(f, EgressConfig())
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
	}, EgressMaxConns)
	return nil
}

// halfClosing is a stream whose CloseWrite is yamux's Close: a FIN that
// still lets the other direction finish.
type halfClosing struct{ *yamux.Stream }

func (h halfClosing) CloseWrite() error { return h.Stream.Close() }
