package native

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"strconv"
	"sync"

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
// whole life, so the socket() call must run on a thread inside ns. That
// thread is netnsDialer's: one goroutine locked to its OS thread for the
// life of the process, which joins ns for each dial. It never ends and
// never starts a process. Both matter: a sandbox's init is started with
// PR_SET_PDEATHSIG, which the kernel ties to the *thread* that forked it,
// so a dialing goroutine that ended locked (Go then ends its thread) on a
// pool thread that had once started an init killed that sandbox at
// random (TestServeE2BSDK's ports check); and a thread left in a
// sandbox's namespace must never run anything else.
func dialInNetns(ctx context.Context, ns *os.File, port int) (net.Conn, error) {
	netnsDialer.once.Do(netnsDialer.start)
	r := dialRequest{ctx: ctx, fd: int(ns.Fd()), port: port, done: make(chan dialed, 1)}
	select {
	case netnsDialer.reqs <- r:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	// The dialer answers every request it took: ns stays open (the
	// caller closes it after this returns) until it has.
	d := <-r.done
	return d.c, d.err
}

type dialed struct {
	c   net.Conn
	err error
}

type dialRequest struct {
	ctx  context.Context
	fd   int
	port int
	done chan dialed
}

// netnsDialer is the one thread that dials into sandboxes. Dials are
// serial: a connection to a loopback port is answered (or refused) at
// once, and each is bounded by its caller's context.
var netnsDialer nsDialer

type nsDialer struct {
	once sync.Once
	reqs chan dialRequest
}

func (nd *nsDialer) start() {
	nd.reqs = make(chan dialRequest)
	go func() {
		runtime.LockOSThread()
		// Never unlocked, and the goroutine never returns: see
		// dialInNetns. The thread goes back to the host's namespace
		// after each dial, so that it holds no ended sandbox's
		// namespace alive; home is that namespace.
		home, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			err = fmt.Errorf("open the host's network namespace: %w", err)
		}
		for r := range nd.reqs {
			if err != nil {
				r.done <- dialed{nil, err}
				continue
			}
			var d dialed
			d, err = dialOnThisThread(r, int(home.Fd()))
			r.done <- d
		}
	}()
}

// dialOnThisThread joins r's namespace, dials, and returns to home. A
// thread that cannot return (broken non-nil) refuses every later dial
// rather than keep an ended sandbox's namespace or dial from a state it
// does not know.
func dialOnThisThread(r dialRequest, home int) (d dialed, broken error) {
	if err := unix.Setns(r.fd, unix.CLONE_NEWNET); err != nil {
		return dialed{nil, fmt.Errorf("join the sandbox's network namespace: %w", err)}, nil
	}
	var nd net.Dialer
	c, err := nd.DialContext(r.ctx, "tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(r.port)))
	if berr := unix.Setns(home, unix.CLONE_NEWNET); berr != nil {
		broken = fmt.Errorf("%w: the port dialer could not return to the host's network namespace: %v", tier.ErrUnavailable, berr)
	}
	return dialed{c, err}, broken
}
