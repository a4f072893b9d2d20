// Package relay is the in-sandbox end of the egress path shared by the
// tiers' guest inits: it copies each connection accepted on the
// sandbox's loopback listener to a new connection to the host's egress
// proxy socket, and never interprets the bytes (the proxy on the host
// decides everything).
package relay

import (
	"errors"
	"io"
	"net"
	"sync"
	"time"
)

// Serve relays connections accepted on l to the Unix socket at path, at
// most limit at once (more are closed), until l is closed. A failed
// connect closes the client: the network fails closed.
func Serve(l net.Listener, path string, limit int) {
	sem := make(chan struct{}, limit)
	pause := time.Millisecond
	for {
		c, err := l.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			// EMFILE, ECONNABORTED and the like: the program may be
			// flooding the relay, which must outlive that rather than
			// leave the run's egress dead. Back off and accept again.
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
			up, err := net.Dial("unix", path)
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
