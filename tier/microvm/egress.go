package microvm

// The host end of the egress channel. With an egress grant the VM has a
// second virtio-serial port whose QEMU chardev is a Unix socket in the
// run's state directory; the host connects to it as soon as the VMM runs
// (before any request, so a snapshot and its restores see the same
// connected port) and serves yamux on it. The guest agent opens one
// stream per connection the program makes to its 127.0.0.1:EgressPort;
// the host relays each stream to the egress proxy's Unix socket, which
// applies the allowlist and the manifest's limits.
//
// Everything on the port is the guest's and hostile. What it can do and
// what bounds it:
//
//   - garbage, pings, window violations, stream ids the host owns: the
//     frames are checked before yamux sees them (guestFrames) and yamux
//     checks the rest; any violation closes this session, and with it only
//     this VM's egress;
//   - more streams than the limit: every stream is taken (acknowledged)
//     at once; at most the limit are relayed, and one over it is closed
//     at once, as the native relay closes a connection over its limit.
//     None waits: a queue on the host would make the guest's opens wait
//     behind it, and connections its program already gave up would hold
//     its relay's slots long after a flood (red team:
//     net-egress-conn-flood). The guest may keep at most limit+backlog
//     streams open that it has not closed (guestFrames), so the host holds
//     at most that plus the limit, each buffering at most one window
//     (EgressWindow) of unread data;
//   - a stream it never reads, or never closes: it keeps its slot (its own
//     egress gets narrower) until the session ends;
//   - the agent port is another chardev, socket and goroutine: nothing here
//     waits on it or it on this.
//
// Close (when the VM is killed: after Exec, or by Destroy) closes the
// session, every stream and every proxy connection, and waits for every
// goroutine the channel started.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/moat-sandbox/moat/guest/vmagent/vmwire"
)

// egressChannel is the host end of one VM's egress port.
type egressChannel struct {
	sess  *yamux.Session
	proxy string // the egress proxy's socket
	limit int

	mu     sync.Mutex
	closed bool
	ups    map[net.Conn]struct{} // open proxy connections
	wg     sync.WaitGroup        // the accept loop and every relay
}

// newEgressChannel serves yamux on conn (the host end of the egress
// port), relaying each stream to the Unix socket proxy, at most limit at
// once.
func newEgressChannel(conn net.Conn, proxy string, limit int) (*egressChannel, error) {
	frames := &guestFrames{Conn: conn, open: map[uint32]bool{}}
	sess, err := yamux.Server(frames, vmwire.EgressConfig())
	if err != nil {
		conn.Close()
		return nil, err
	}
	e := &egressChannel{sess: sess, proxy: proxy, limit: max(1, limit), ups: map[net.Conn]struct{}{}}
	frames.maxOpen = e.limit + vmwire.EgressBacklog
	e.wg.Add(1)
	go e.accept()
	return e, nil
}

// accept takes every stream at once and relays it when a slot is free;
// a stream over the limit is closed at once, never queued.
func (e *egressChannel) accept() {
	defer e.wg.Done()
	slots := make(chan struct{}, e.limit)
	for {
		st, err := e.sess.AcceptStream()
		if err != nil {
			return // the session ended
		}
		select {
		case slots <- struct{}{}:
			e.wg.Add(1)
			go func() {
				defer e.wg.Done()
				defer func() { <-slots }()
				e.relay(st)
			}()
		default:
			// The guest's end sees its connection end. Its unread data
			// (one window at most) goes with the stream once the guest
			// closes its side too.
			st.Close()
		}
	}
}

// relay copies st to a new connection to the proxy and back, passing
// half-closes along; it returns once both directions are done, the
// session ended, or the channel closed.
func (e *egressChannel) relay(st *yamux.Stream) {
	defer st.Close()
	c, err := net.DialTimeout("unix", e.proxy, 5*time.Second)
	if err != nil {
		// Fail closed: the guest sees its connection end. The slot is
		// held until the guest closes its side (or the stream times out).
		st.Close()
		io.Copy(io.Discard, st)
		return
	}
	up := c.(*net.UnixConn)
	if !e.track(up) {
		up.Close()
		return
	}
	defer e.untrack(up)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if _, err := io.Copy(up, st); err != nil {
			// The proxy went away: the guest's remaining bytes go nowhere,
			// but its slot stays taken until it closes its side.
			io.Copy(io.Discard, st)
		}
		up.CloseWrite()
	}()
	io.Copy(st, up)
	st.Close() // yamux's Close is a half-close: a FIN
	<-done
}

func (e *egressChannel) track(c net.Conn) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return false
	}
	e.ups[c] = struct{}{}
	return true
}

func (e *egressChannel) untrack(c net.Conn) {
	e.mu.Lock()
	delete(e.ups, c)
	e.mu.Unlock()
	c.Close()
}

// broken reports whether the session has ended (the guest broke the
// protocol, the VM died, or the channel was closed).
func (e *egressChannel) broken() bool { return e.sess.IsClosed() }

// Close ends the session, every stream and proxy connection, and waits
// for the channel's goroutines. It never waits on the guest: closing the
// port's socket unblocks yamux's reader and writer, closing the proxy
// connections unblocks every relay.
func (e *egressChannel) Close() {
	e.mu.Lock()
	e.closed = true
	ups := make([]net.Conn, 0, len(e.ups))
	for c := range e.ups {
		ups = append(ups, c)
	}
	e.mu.Unlock()
	e.sess.Close()
	for _, c := range ups {
		c.Close()
	}
	e.wg.Wait()
}

// yamux's frame header (github.com/hashicorp/yamux spec.md): version,
// type, flags, stream id, length; a data frame's payload follows.
const (
	yamuxHeader       = 12
	yamuxData         = 0
	yamuxWindowUpdate = 1
	yamuxPing         = 2
	yamuxGoAway       = 3
	yamuxSYN          = 1
	yamuxFIN          = 4
	yamuxRST          = 8
	yamuxFlags        = 0xf // SYN, ACK, FIN, RST
)

var errGuestFrame = errors.New("egress port: the guest broke the yamux protocol")

// guestFrames checks the frames the guest sends before yamux reads them,
// closing what yamux itself would accept but the host must not: pings
// (yamux answers each in a new goroutine, so a flood of them while the
// guest does not read is a flood of host goroutines), unknown flags,
// streams the host would have opened (even ids), data frames larger than
// a stream's window, and more than maxOpen streams open at once that the
// guest has not closed (its agent relays at most the limit at once).
// Writes and Close go to the port's socket unchanged.
type guestFrames struct {
	net.Conn
	hdr     [yamuxHeader]byte
	pending []byte          // a checked header not yet returned
	body    uint32          // payload bytes of the current data frame
	open    map[uint32]bool // streams the guest opened and has not closed
	maxOpen int
	err     error
}

func (g *guestFrames) Read(p []byte) (int, error) {
	switch {
	case g.err != nil:
		return 0, g.err
	case len(g.pending) > 0:
		n := copy(p, g.pending)
		g.pending = g.pending[n:]
		return n, nil
	case g.body > 0:
		if uint32(len(p)) > g.body {
			p = p[:g.body]
		}
		n, err := g.Conn.Read(p)
		g.body -= uint32(n)
		return n, err
	}
	if _, err := io.ReadFull(g.Conn, g.hdr[:]); err != nil {
		return 0, err
	}
	if err := g.check(); err != nil {
		g.err = err
		return 0, err
	}
	g.pending = g.hdr[:]
	n := copy(p, g.pending)
	g.pending = g.pending[n:]
	return n, nil
}

func (g *guestFrames) check() error {
	h := g.hdr[:]
	typ, flags := h[1], binary.BigEndian.Uint16(h[2:4])
	id, length := binary.BigEndian.Uint32(h[4:8]), binary.BigEndian.Uint32(h[8:12])
	switch {
	case h[0] != 0:
		return fmt.Errorf("%w: version %d", errGuestFrame, h[0])
	case typ == yamuxPing:
		return fmt.Errorf("%w: a ping (keepalive is off at both ends)", errGuestFrame)
	case typ > yamuxGoAway:
		return fmt.Errorf("%w: frame type %d", errGuestFrame, typ)
	case flags&^yamuxFlags != 0:
		return fmt.Errorf("%w: flags %#x", errGuestFrame, flags)
	case typ == yamuxData && length > vmwire.EgressWindow:
		return fmt.Errorf("%w: a %d-byte data frame", errGuestFrame, length)
	}
	if (typ == yamuxData || typ == yamuxWindowUpdate) && flags&yamuxSYN != 0 {
		// Odd ids are the guest's; their order is not checked: yamux
		// numbers streams in order but concurrent opens send their SYNs in
		// any order. A SYN for a stream that is open is yamux's duplicate,
		// which ends the session.
		if id%2 == 0 {
			return fmt.Errorf("%w: stream id %d is the host's to open", errGuestFrame, id)
		}
		g.open[id] = true
		if len(g.open) > g.maxOpen {
			return fmt.Errorf("%w: more than %d streams open at once", errGuestFrame, g.maxOpen)
		}
	}
	if (typ == yamuxData || typ == yamuxWindowUpdate) && flags&(yamuxFIN|yamuxRST) != 0 {
		delete(g.open, id)
	}
	if typ == yamuxData {
		g.body = length
	}
	return nil
}
