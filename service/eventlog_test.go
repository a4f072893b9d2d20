package service

import "testing"

func TestEventLog(t *testing.T) {
	t.Run("merges until seen", func(t *testing.T) {
		l := newEventLog(100, 100)
		l.write(stdoutStream, []byte("a"))
		l.write(stdoutStream, []byte("b"))
		evs, exit, _ := l.read(0)
		if len(evs) != 1 || string(evs[0].data) != "ab" || exit != 0 {
			t.Fatalf("events %+v", evs)
		}
		l.write(stdoutStream, []byte("c"))
		evs, _, _ = l.read(1)
		if len(evs) != 1 || evs[0].id != 2 || string(evs[0].data) != "c" {
			t.Fatalf("events %+v", evs)
		}
		// What was seen never changes.
		evs, _, _ = l.read(0)
		if string(evs[0].data) != "ab" {
			t.Fatalf("sealed event changed: %+v", evs)
		}
	})
	t.Run("holds back a split rune", func(t *testing.T) {
		l := newEventLog(100, 100)
		l.write(stdoutStream, []byte("x\xe2\x82"))
		evs, _, _ := l.read(0)
		if len(evs) != 1 || string(evs[0].data) != "x" {
			t.Fatalf("events %+v", evs)
		}
		l.write(stdoutStream, []byte("\xac"))
		evs, _, _ = l.read(1)
		if len(evs) != 1 || string(evs[0].data) != "€" {
			t.Fatalf("events %+v", evs)
		}
		l.write(stdoutStream, []byte("\xe2"))
		l.end()
		evs, exit, _ := l.read(2)
		if len(evs) != 1 || string(evs[0].data) != "\xe2" || exit != 4 {
			t.Fatalf("at the end: events %+v exit %d", evs, exit)
		}
	})
	t.Run("caps each stream", func(t *testing.T) {
		l := newEventLog(4, 2)
		l.write(stdoutStream, []byte("123456"))
		l.write(stderrStream, []byte("abc"))
		l.write(stdoutStream, []byte("7"))
		l.end()
		evs, _, _ := l.read(0)
		if len(evs) != 2 || string(evs[0].data) != "1234" || string(evs[1].data) != "ab" {
			t.Fatalf("events %+v", evs)
		}
	})
	t.Run("bounds the events", func(t *testing.T) {
		l := newEventLog(1<<30, 1<<30)
		for range maxEvents + 10 {
			l.write(stdoutStream, []byte("o"))
			l.write(stderrStream, []byte("e"))
		}
		l.end()
		evs, exit, _ := l.read(0)
		if len(evs) != maxEvents || exit != maxEvents+1 {
			t.Fatalf("%d events, exit id %d", len(evs), exit)
		}
	})
	t.Run("writes after the end are dropped", func(t *testing.T) {
		l := newEventLog(10, 10)
		l.end()
		l.write(stdoutStream, []byte("late"))
		evs, exit, _ := l.read(0)
		if len(evs) != 0 || exit != 1 {
			t.Fatalf("events %+v exit %d", evs, exit)
		}
	})
}
