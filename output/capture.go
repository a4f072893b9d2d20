// Package output captures a sandboxed program's stdout and stderr with a hard
// cap, and encodes them for the Result and for a terminal.
//
// Everything here is hostile bytes: the package must never hold more than the
// cap in memory, never stop draining a pipe (a blocked pipe would stall the
// program instead of cutting it off), and never pass terminal control
// sequences to a TTY unescaped (see Sanitize).
package output

import (
	"encoding/base64"
	"io"
	"math"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	"github.com/moat-sandbox/moat/result"
)

// minGrow is the first allocation, so a program that prints one line does
// not cost a whole cap's worth of memory.
const minGrow = 4096

// Capture is an io.Writer that keeps the first Cap bytes, counts every byte
// written (Total), and optionally forwards the kept bytes live to Live (e.g.
// the user's terminal), never more than Cap bytes forwarded. Write never
// fails so the copier keeps draining the pipe; memory use is bounded by Cap.
//
// Write, Total, Truncated, Bytes and Stream are safe to call concurrently.
type Capture struct {
	limit int64
	total atomic.Int64

	mu      sync.Mutex
	buf     []byte
	live    io.Writer // nil once a live write failed
	liveErr error
}

// NewCapture returns a Capture keeping at most capBytes bytes (a negative
// cap is 0) and forwarding them to live, which may be nil.
func NewCapture(capBytes int64, live io.Writer) *Capture {
	if capBytes < 0 {
		capBytes = 0
	}
	if capBytes > math.MaxInt {
		capBytes = math.MaxInt
	}
	return &Capture{limit: capBytes, live: live}
}

// Write keeps what fits under the cap, forwards it to the live writer, and
// counts all of p. It always returns len(p), nil. A failing live writer is
// dropped (see LiveErr); capture continues.
func (c *Capture) Write(p []byte) (int, error) {
	c.total.Add(int64(len(p)))
	c.mu.Lock()
	defer c.mu.Unlock()
	room := c.limit - int64(len(c.buf))
	if room <= 0 || len(p) == 0 {
		return len(p), nil
	}
	keep := p
	if int64(len(keep)) > room {
		keep = keep[:room]
	}
	c.grow(len(keep))
	c.buf = append(c.buf, keep...)
	if c.live != nil {
		// Forward from our copy: a Writer must not retain p, and the live
		// writer must not be able to change what we captured.
		kept := c.buf[len(c.buf)-len(keep):]
		if _, err := c.live.Write(kept[:len(kept):len(kept)]); err != nil {
			c.live, c.liveErr = nil, err
		}
	}
	return len(p), nil
}

// grow makes room for n more bytes without ever exceeding the cap: doubling
// from minGrow, clamped to the cap (append alone could overshoot it).
func (c *Capture) grow(n int) {
	need := len(c.buf) + n
	if need <= cap(c.buf) {
		return
	}
	newCap := max(2*cap(c.buf), need, minGrow)
	if int64(newCap) > c.limit {
		newCap = int(c.limit)
	}
	nb := make([]byte, len(c.buf), newCap)
	copy(nb, c.buf)
	c.buf = nb
}

// Bytes returns a copy of the kept bytes.
func (c *Capture) Bytes() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]byte(nil), c.buf...)
}

// Total returns the number of bytes written, kept or not.
func (c *Capture) Total() int64 { return c.total.Load() }

// Truncated reports whether more bytes were written than kept.
func (c *Capture) Truncated() bool { return c.total.Load() > c.limit }

// LiveErr returns the error that made the live writer stop, if any.
func (c *Capture) LiveErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.liveErr
}

// Stream converts to the result form: valid UTF-8 gives Encoding "utf-8"
// and Data as is (the JSON encoder escapes control characters); anything
// else gives Encoding "base64" of the kept bytes.
//
// When the cap cut a multi-byte rune in two, the incomplete rune at the end
// is dropped before deciding (those bytes count as not captured), so a
// truncated UTF-8 stream still reports "utf-8".
func (c *Capture) Stream() result.Stream {
	c.mu.Lock()
	data := c.buf
	c.mu.Unlock()
	// data[:len] never changes once written: Write only appends.
	total := c.total.Load()
	s := result.Stream{Bytes: total, Truncated: total > c.limit}
	text := data
	if s.Truncated {
		text = data[:completeLen(data)]
	}
	if utf8.Valid(text) && textual(text) {
		s.Data, s.Encoding = string(text), "utf-8"
	} else {
		s.Data, s.Encoding = base64.StdEncoding.EncodeToString(data), "base64"
	}
	return s
}

// textual reports whether valid UTF-8 b reads as text: no NUL and few
// other control bytes. JSON escapes each control byte as six bytes
// (\u0000), so a megabyte of them would cost six in every result; base64
// costs 4/3 and says honestly that the output is binary.
func textual(b []byte) bool {
	controls := 0
	for _, c := range b {
		switch {
		case c == 0:
			return false
		case c < 0x20 && c != '\n' && c != '\r' && c != '\t', c == 0x7f:
			controls++
		}
	}
	return controls*4 <= len(b)
}

// completeLen returns the length of b without a trailing incomplete (but so
// far valid) UTF-8 sequence. Invalid bytes are left for the caller to judge.
func completeLen(b []byte) int {
	// A rune is at most utf8.UTFMax bytes: look back at most 3 for its
	// first byte.
	for i := len(b) - 1; i >= 0 && i >= len(b)-(utf8.UTFMax-1); i-- {
		if utf8.RuneStart(b[i]) {
			if b[i] >= utf8.RuneSelf && !utf8.FullRune(b[i:]) {
				return i
			}
			break
		}
	}
	return len(b)
}

// Redact replaces the known secrets' values in what was captured (Redact)
// and returns where they were, as findings of where. Call it once the
// program has ended: later writes are not redacted. Bytes and Stream
// return the redacted bytes from then on; Total still counts what the
// program wrote.
func (c *Capture) Redact(where string, secrets []Secret) []result.Finding {
	if len(secrets) == 0 {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	out, found := Redact(c.buf, where, secrets)
	if len(found) > 0 {
		c.buf = out
	}
	return found
}
