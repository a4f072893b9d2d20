package egress

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

var (
	errByteBudget     = errors.New("egress: byte budget exhausted")
	errHeaderTooLarge = errors.New("egress: request header too large")
)

// budget is a byte allowance shared by every connection of one Proxy.
type budget struct {
	limit int64
	used  atomic.Int64
}

// take grants up to want bytes and returns how many it granted; 0 means the
// budget is spent.
func (b *budget) take(want int64) int64 {
	for {
		u := b.used.Load()
		rem := b.limit - u
		if rem <= 0 || want <= 0 {
			return 0
		}
		g := min(want, rem)
		if b.used.CompareAndSwap(u, u+g) {
			return g
		}
	}
}

// takeAll grants exactly n bytes, or nothing when fewer remain.
func (b *budget) takeAll(n int64) bool {
	for {
		u := b.used.Load()
		if n < 0 || b.limit-u < n {
			return false
		}
		if b.used.CompareAndSwap(u, u+n) {
			return true
		}
	}
}

func (b *budget) give(n int64) { b.used.Add(-n) }

func (b *budget) spent() bool { return b.used.Load() >= b.limit }

// activity is the time of the last byte moved on either side of one
// session, shared by both directions so that a long download does not trip
// the idle timeout of the quiet upload direction.
type activity struct{ last atomic.Int64 }

func (a *activity) touch()                     { a.last.Store(time.Now().UnixNano()) }
func (a *activity) since() time.Duration       { return time.Since(time.Unix(0, a.last.Load())) }
func newActivity() *activity                   { a := &activity{}; a.touch(); return a }
func isTimeout(err error) bool                 { var ne net.Error; return errors.As(err, &ne) && ne.Timeout() }
func (c *idleConn) setIdle(idle time.Duration) { c.idle = idle }

// idleConn applies the idle timeout to every Read and Write once idle is
// set; before that (while the request header and ClientHello are read) the
// caller's absolute deadline stands. It embeds net.Conn, an interface, so no
// ReaderFrom/WriterTo fast path can bypass the accounting in meteredConn.
type idleConn struct {
	net.Conn
	idle time.Duration
	act  *activity
}

func (c *idleConn) Read(b []byte) (int, error) {
	for {
		if c.idle > 0 {
			c.Conn.SetReadDeadline(time.Now().Add(c.idle))
		}
		n, err := c.Conn.Read(b)
		if n > 0 {
			c.act.touch()
		}
		// The other direction moved recently: this one is merely quiet.
		if n == 0 && c.idle > 0 && isTimeout(err) && c.act.since() < c.idle {
			continue
		}
		return n, err
	}
}

func (c *idleConn) Write(b []byte) (int, error) {
	if c.idle > 0 {
		c.Conn.SetWriteDeadline(time.Now().Add(c.idle))
	}
	n, err := c.Conn.Write(b)
	if n > 0 {
		c.act.touch()
	}
	return n, err
}

// meteredConn is the upstream side of a session: writes spend the out
// budget, reads the in budget, and both are counted for the attempt log.
// Bytes past the budget are never forwarded.
type meteredConn struct {
	idleConn
	out, in           *budget
	bytesOut, bytesIn atomic.Int64
	overBudget        atomic.Bool
}

func (m *meteredConn) Write(b []byte) (int, error) {
	g := m.out.take(int64(len(b)))
	if g == 0 && len(b) > 0 {
		m.overBudget.Store(true)
		return 0, errByteBudget
	}
	n, err := m.idleConn.Write(b[:g])
	if int64(n) < g {
		m.out.give(g - int64(n))
	}
	m.bytesOut.Add(int64(n))
	if err == nil && int(g) < len(b) {
		m.overBudget.Store(true)
		err = errByteBudget
	}
	return n, err
}

func (m *meteredConn) Read(b []byte) (int, error) {
	if m.in.spent() && len(b) > 0 {
		m.overBudget.Store(true)
		return 0, errByteBudget
	}
	n, err := m.idleConn.Read(b)
	if n > 0 {
		// Read first, charge after: a reservation held across a blocking
		// read would starve other connections near the end of the budget.
		// What does not fit is dropped, never delivered.
		g := m.in.take(int64(n))
		if g < int64(n) {
			m.overBudget.Store(true)
			m.bytesIn.Add(g)
			return int(g), errByteBudget
		}
		m.bytesIn.Add(int64(n))
	}
	return n, err
}

// capReader fails once more than n bytes were read while n >= 0: it bounds
// request and response headers, which the net/http parsers read without a
// limit of their own. Set n to -1 to lift the cap.
type capReader struct {
	r   io.Reader
	n   int64
	err error
}

func (c *capReader) Read(b []byte) (int, error) {
	if c.n < 0 {
		return c.r.Read(b)
	}
	if c.n == 0 {
		return 0, c.err
	}
	if int64(len(b)) > c.n {
		b = b[:c.n]
	}
	n, err := c.r.Read(b)
	c.n -= int64(n)
	return n, err
}

// rateLimiter is a token bucket: rate tokens per second, burst of rate.
type rateLimiter struct {
	mu     sync.Mutex
	rate   float64
	tokens float64
	last   time.Time
}

func newRateLimiter(rate int) *rateLimiter {
	return &rateLimiter{rate: float64(rate), tokens: float64(rate)}
}

func (r *rateLimiter) allow(now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.last.IsZero() {
		if d := now.Sub(r.last).Seconds(); d > 0 {
			r.tokens = min(r.rate, r.tokens+d*r.rate)
		}
	}
	if r.last.IsZero() || now.After(r.last) {
		r.last = now
	}
	if r.tokens >= 1 {
		r.tokens--
		return true
	}
	return false
}
