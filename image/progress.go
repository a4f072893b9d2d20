package image

import (
	"fmt"
	"io"
	"time"
)

// Intervals between progress reports while one layer is read: a terminal
// line is redrawn often, a plain line (a log, CI) is written rarely so a
// slow import does not fill the log.
const (
	terminalTick = 200 * time.Millisecond
	plainTick    = 10 * time.Second
)

// meter reports how far the reading of one layer has got, as the layer is
// extracted: on a terminal one line redrawn in place, otherwise a plain
// line now and then. It never reports for a layer read in under one tick.
type meter struct {
	w        io.Writer
	terminal bool
	label    string
	total    int64        // stored size, <= 0 if unknown
	done     func() int64 // stored bytes read so far
	now      func() time.Time
	next     time.Time
	drawn    bool // a terminal line is on screen
}

func newMeter(w io.Writer, terminal bool, label string, total int64, done func() int64) *meter {
	m := &meter{w: w, terminal: terminal, label: label, total: total, done: done, now: time.Now}
	m.next = m.now().Add(m.tick())
	return m
}

func (m *meter) tick() time.Duration {
	if m.terminal {
		return terminalTick
	}
	return plainTick
}

// update reports if a tick has passed since the last report.
func (m *meter) update() {
	if m == nil || m.w == nil {
		return
	}
	now := m.now()
	if now.Before(m.next) {
		return
	}
	m.next = now.Add(m.tick())
	line := fmt.Sprintf("%s: %s", m.label, m.amount(m.done()))
	if m.terminal {
		// \r and erase-line: the line is redrawn, not appended.
		fmt.Fprintf(m.w, "\r\x1b[K%s", line)
		m.drawn = true
		return
	}
	fmt.Fprintln(m.w, line)
}

// amount is "12.3 MB of 45.6 MB read (27%)", or without the total when
// the source did not say how large the layer is.
func (m *meter) amount(n int64) string {
	if m.total > 0 {
		return fmt.Sprintf("%.1f MB of %.1f MB read (%d%%)", float64(n)/1e6, float64(m.total)/1e6, n*100/m.total)
	}
	return fmt.Sprintf("%.1f MB read", float64(n)/1e6)
}

// finish clears the redrawn line, so the layer's summary line that
// follows starts at column 0.
func (m *meter) finish() {
	if m != nil && m.drawn {
		fmt.Fprint(m.w, "\r\x1b[K")
		m.drawn = false
	}
}

// meteredReader calls the meter's update on every read.
type meteredReader struct {
	r io.Reader
	m *meter
}

func (r meteredReader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	r.m.update()
	return n, err
}
