package service

import (
	"sync"
	"unicode/utf8"
)

// The two output streams of a command.
type stream uint8

const (
	stdoutStream stream = iota
	stderrStream
)

func (s stream) String() string {
	if s == stderrStream {
		return "stderr"
	}
	return "stdout"
}

// maxEvents bounds the output events of one command. Writes are merged
// into the last event until a reader has seen it, so only a program that
// alternates stdout and stderr in tiny writes while a client reads gets
// near it; past it, the live stream skips output (the exit event's result
// still has all of it, up to the caps).
const maxEvents = 1 << 16

// eventLog is a command's output as ordered events with ids 1, 2, …, then
// the exit event. It keeps at most the stdout and stderr caps of bytes
// (one buffer per stream; an event is a range of one), so its memory is
// bounded by the manifest. An event is sealed, and never changes again,
// once a reader has seen it: that is what makes resuming exact.
type eventLog struct {
	mu     sync.Mutex
	bufs   [2][]byte
	caps   [2]int64
	events []outEvent
	sealed int // events[:sealed] are visible and frozen
	ended  bool
	// notify is closed and replaced on every change, waking readers.
	notify chan struct{}
}

type outEvent struct {
	stream   stream
	off, end int
}

// streamEvent is a sealed event as a reader gets it.
type streamEvent struct {
	id     int
	stream stream
	data   []byte
}

func newEventLog(stdoutCap, stderrCap int64) *eventLog {
	return &eventLog{caps: [2]int64{stdoutCap, stderrCap}, notify: make(chan struct{})}
}

// streamWriter is the ExecRequest's Stdout or Stderr. The engine calls it
// with its capture's lock held, so it must not block: it only appends.
type streamWriter struct {
	l *eventLog
	s stream
}

func (w streamWriter) Write(p []byte) (int, error) {
	w.l.write(w.s, p)
	return len(p), nil
}

func (l *eventLog) write(s stream, p []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended {
		return
	}
	buf := l.bufs[s]
	room := l.caps[s] - int64(len(buf))
	if room <= 0 || len(p) == 0 {
		return
	}
	if int64(len(p)) > room {
		p = p[:room]
	}
	n := len(l.events)
	if n == l.sealed || l.events[n-1].stream != s {
		if n >= maxEvents {
			return
		}
		l.events = append(l.events, outEvent{stream: s, off: len(buf), end: len(buf)})
	}
	// Written bytes are never modified, so a reader may keep a slice of
	// an old backing array after this append moves the buffer.
	l.bufs[s] = append(buf, p...)
	l.events[len(l.events)-1].end = len(l.bufs[s])
	l.broadcast()
}

func (l *eventLog) broadcast() {
	close(l.notify)
	l.notify = make(chan struct{})
}

// end marks the command ended: no more output, and the exit event (id
// len(events)+1) follows the last output event.
func (l *eventLog) end() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.ended {
		l.ended = true
		l.broadcast()
	}
}

// read seals what is pending and returns the events after id after, the
// exit event's id once the command has ended (else 0), and a channel
// closed on the next change.
func (l *eventLog) read(after int) ([]streamEvent, int, <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seal()
	var out []streamEvent
	for i := max(after, 0); i < l.sealed; i++ {
		ev := l.events[i]
		out = append(out, streamEvent{id: i + 1, stream: ev.stream, data: l.bufs[ev.stream][ev.off:ev.end:ev.end]})
	}
	exitID := 0
	if l.ended {
		exitID = len(l.events) + 1
	}
	return out, exitID, l.notify
}

// seal freezes every event, except that while the command runs an
// incomplete UTF-8 sequence at the very end is held back for the next
// write, so that text split across writes still arrives as text.
func (l *eventLog) seal() {
	n := len(l.events)
	if l.ended || n == l.sealed {
		l.sealed = n
		return
	}
	last := &l.events[n-1]
	data := l.bufs[last.stream][last.off:last.end]
	cut := completeUTF8(data)
	switch {
	case cut == len(data):
		l.sealed = n
	case cut == 0:
		l.sealed = n - 1
	default:
		rest := outEvent{stream: last.stream, off: last.off + cut, end: last.end}
		last.end = last.off + cut
		l.events = append(l.events, rest)
		l.sealed = n
	}
}

// completeUTF8 is the length of b without a trailing incomplete UTF-8
// sequence.
func completeUTF8(b []byte) int {
	for i := len(b) - 1; i >= 0 && i >= len(b)-3; i-- {
		c := b[i]
		if c < utf8.RuneSelf {
			return len(b)
		}
		if utf8.RuneStart(c) {
			if utf8.FullRune(b[i:]) {
				return len(b)
			}
			return i
		}
	}
	return len(b)
}
