package nsinit

import (
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
)

// maxBridged bounds the bridge's concurrent connections; the proxy applies
// the manifest's real limits on the host side.
const maxBridged = 64

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

// bridgeEgress copies each connection accepted on l to a new connection to
// the host's proxy socket, reached through init's own descriptor. It never
// interprets the bytes: the proxy on the host decides everything. A failed
// connect closes the client: the network fails closed.
func bridgeEgress(l net.Listener) {
	sem := make(chan struct{}, maxBridged)
	target := fmt.Sprintf("/proc/self/fd/%d", EgressFD)
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		select {
		case sem <- struct{}{}:
		default:
			c.Close()
			continue
		}
		go func() {
			defer func() { <-sem }()
			defer c.Close()
			up, err := net.Dial("unix", target)
			if err != nil {
				return
			}
			defer up.Close()
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				io.Copy(up, c)
				up.(*net.UnixConn).CloseWrite()
			}()
			io.Copy(c, up)
			if tc, ok := c.(*net.TCPConn); ok {
				tc.CloseWrite()
			}
			wg.Wait()
		}()
	}
}
