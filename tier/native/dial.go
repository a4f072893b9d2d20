package native

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/tier"
)

var _ tier.Dialer = (*sandbox)(nil)

// DialPort implements tier.Dialer for session sandboxes: a TCP connection
// to 127.0.0.1:port inside the sandbox's network namespace, made from a
// host thread that joins that namespace for the socket() call only.
func (s *sandbox) DialPort(ctx context.Context, port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, fmt.Errorf("port %d is not a TCP port (1-65535)", port)
	}
	if port == tier.EgressPort && s.spec.EgressSocket != "" {
		// 127.0.0.1:EgressPort inside is Moat's egress proxy: a
		// connection from outside would borrow the sandbox's network
		// grant (an open proxy to its allowlist for whoever holds the
		// URL).
		return nil, fmt.Errorf("%w: port %d inside the sandbox is Moat's egress proxy, not the program's, and is never reachable from outside", tier.ErrPortReserved, port)
	}
	if s.sess == nil || s.init == nil || s.init.Process == nil {
		return nil, fmt.Errorf("%w: only a session sandbox can be connected to", tier.ErrUnavailable)
	}
	ns, err := os.Open("/proc/" + strconv.Itoa(s.init.Process.Pid) + "/ns/net")
	if err != nil {
		return nil, fmt.Errorf("open the sandbox's network namespace: %w", err)
	}
	defer ns.Close()
	// The pid was init's when opened only if init had not been reaped
	// yet: checked after the open, so a recycled pid's namespace is never
	// joined.
	select {
	case <-s.sess.initDone:
		return nil, errSandboxGone
	default:
	}
	s.sess.mu.Lock()
	gone := s.sess.destroyed || s.sess.dead
	s.sess.mu.Unlock()
	if gone {
		return nil, errSandboxGone
	}
	return dialInNetns(ctx, ns, port)
}

var errSandboxGone = errors.New("the sandbox has ended")

// dialInNetns connects to 127.0.0.1:port in the network namespace ns. A
// socket belongs to the namespace of the thread that creates it, for its
// whole life; so a new goroutine locks itself to its thread, setns()es
// into ns, dials, and exits still locked, which makes the Go runtime end
// that thread instead of returning it, in the sandbox's namespace, to the
// pool that runs every other goroutine.
func dialInNetns(ctx context.Context, ns *os.File, port int) (net.Conn, error) {
	type dialed struct {
		c   net.Conn
		err error
	}
	ch := make(chan dialed, 1)
	fd := int(ns.Fd())
	go func() {
		runtime.LockOSThread()
		// No UnlockOSThread: see above.
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			ch <- dialed{nil, fmt.Errorf("join the sandbox's network namespace: %w", err)}
			return
		}
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		ch <- dialed{c, err}
	}()
	r := <-ch
	return r.c, r.err
}
