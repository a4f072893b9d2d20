package nsinit

import (
	"fmt"
	"net"
	"strconv"

	"github.com/moat-sandbox/moat/guest/relay"
)

// maxBridged bounds the bridge's concurrent connections: the relay's
// bound, shared by every tier; the proxy applies the manifest's real
// limits on the host side.
const maxBridged = relay.MaxConns

// bridgeLimit is how many connections the bridge may hold at once within
// init's descriptor limit (init lives under the run's open_files rlimit):
// each bridged connection costs up to six descriptors (two sockets, and the
// pipe pairs the kernel's splice path may use), with headroom for init.
func bridgeLimit(nofile uint64) int {
	n := (int(min(nofile, 1<<16)) - 32) / 6
	return max(1, min(maxBridged, n))
}

// listenEgress opens the in-sandbox end of the egress path: a TCP listener
// on the sandbox's own loopback. It is opened before privileges are dropped
// so the port may be below 1024, and before seccomp, which does not mind.
func listenEgress(port int) (net.Listener, error) {
	l, err := net.Listen("tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return nil, fmt.Errorf("egress: listen on 127.0.0.1:%d: %w", port, err)
	}
	return l, nil
}
