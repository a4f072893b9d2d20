package vmwire

import (
	"io"
	"time"

	"github.com/hashicorp/yamux"
	"github.com/moat-sandbox/moat/guest/relay"
)

// The egress channel: with an egress grant the VM gets a second
// virtio-serial port (EgressPortName) that carries one yamux stream per
// connection (guest/vmagent's egress.go tells the whole story). These are
// the settings both ends must agree on.

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
