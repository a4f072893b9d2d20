package nsinit

import (
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"
)

// maxBridged bounds the bridge's concurrent connections; the proxy applies
// the manifest's real limits on the host side.
const maxBridged = 64

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

// bridgeEgress copies each connection accepted on l to a new connection to
// the host's proxy socket, reached through init's own descriptor. It never
// interprets the bytes: the proxy on the host decides everything. A failed
// connect closes the client: the network fails closed.
func bridgeEgress(l net.Listener, limit int) {
	sem := make(chan struct{}, limit)
	target := fmt.Sprintf("/proc/self/fd/%d", EgressFD)
	pause := time.Millisecond
	for {
		c, err := l.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			// EMFILE, ECONNABORTED and the like: the program may be
			// flooding us; the bridge must outlive that, not leave the
			// run's egress dead. Back off and accept again.
			time.Sleep(pause)
			pause = min(2*pause, 100*time.Millisecond)
			continue
		}
		pause = time.Millisecond
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
