// Package relay is the in-sandbox end of the egress path shared by the
// tiers' guest inits: it copies each connection accepted on the
// sandbox's loopback listener to a new connection to the host's egress
// proxy (a Unix socket, or a stream of the microvm tier's egress port),
// and never interprets the bytes (the proxy on the host decides
// everything).
package relay

import (
	"errors"
	"io"
	"net"
	"sync"
	"time"
)

// MaxConns bounds the relay's concurrent connections in every tier (the
// microvm tier's host end applies the same bound to its streams); the
// proxy on the host applies the manifest's real connection limits.
const MaxConns = 64

// Serve relays connections accepted on l to the Unix socket at path, at
// most limit at once (more are closed), until l is closed. A failed
// connect closes the client: the network fails closed.
func Serve(l net.Listener, path string, limit int) {
	ServeDial(l, func() (net.Conn, error) { return net.Dial("unix", path) }, limit)
}

// ServeDial is Serve with the upstream connection made by dial. A
// connection that has CloseWrite gets half-closes passed along; one
// without is closed only when both directions are done.
func ServeDial(l net.Listener, dial func() (net.Conn, error), limit int) {
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
			up, err := dial()
			if err != nil {
				return
			}
			defer up.Close()
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				io.Copy(up, c)
				closeWrite(up)
			}()
			io.Copy(c, up)
			closeWrite(c)
			wg.Wait()
		}()
	}
}

// closeWrite half-closes c when it can (TCP, Unix, a yamux stream).
func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
}
