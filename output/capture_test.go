package output

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"runtime"
	"strings"
	"sync"
	"testing"
)

func ptr(s string) *string { return &s }

func TestCapture(t *testing.T) {
	tests := []struct {
		name      string
		cap       int64
		writes    []string
		wantKept  string
		wantTotal int64
		wantTrunc bool
		wantEnc   string
		// wantData is Stream().Data when the kept bytes end in a split
		// rune; nil means the kept bytes themselves.
		wantData *string
	}{
		{name: "under cap", cap: 10, writes: []string{"hello"}, wantKept: "hello", wantTotal: 5, wantEnc: "utf-8"},
		{name: "exactly cap", cap: 5, writes: []string{"hello"}, wantKept: "hello", wantTotal: 5, wantEnc: "utf-8"},
		{name: "over cap", cap: 5, writes: []string{"hello world"}, wantKept: "hello", wantTotal: 11, wantTrunc: true, wantEnc: "utf-8"},
		{name: "over cap across writes", cap: 7, writes: []string{"hello", " world", "!"}, wantKept: "hello w", wantTotal: 12, wantTrunc: true, wantEnc: "utf-8"},
		{name: "many small writes", cap: 100, writes: strings.Split(strings.Repeat("ab", 100), ""), wantKept: strings.Repeat("ab", 50), wantTotal: 200, wantTrunc: true, wantEnc: "utf-8"},
		{name: "zero cap", cap: 0, writes: []string{"abc"}, wantKept: "", wantTotal: 3, wantTrunc: true, wantEnc: "utf-8"},
		{name: "negative cap is zero", cap: -4, writes: []string{"abc"}, wantKept: "", wantTotal: 3, wantTrunc: true, wantEnc: "utf-8"},
		{name: "nothing written", cap: 8, wantKept: "", wantTotal: 0, wantEnc: "utf-8"},
		{name: "empty writes", cap: 8, writes: []string{"", "", ""}, wantKept: "", wantTotal: 0, wantEnc: "utf-8"},
		// "é" is 0xC3 0xA9: a cap of 2 after "a" splits it.
		{name: "utf-8 split at cap", cap: 2, writes: []string{"aé"}, wantKept: "a\xc3", wantTotal: 3, wantTrunc: true, wantEnc: "utf-8", wantData: ptr("a")},
		// "€" is 3 bytes, "😀" 4: every split point backs off to the last complete rune.
		{name: "3-byte rune split after 2", cap: 3, writes: []string{"x€"}, wantKept: "x\xe2\x82", wantTotal: 4, wantTrunc: true, wantEnc: "utf-8", wantData: ptr("x")},
		{name: "4-byte rune split after 3", cap: 4, writes: []string{"x😀"}, wantKept: "x\xf0\x9f\x98", wantTotal: 5, wantTrunc: true, wantEnc: "utf-8", wantData: ptr("x")},
		{name: "rune split across writes", cap: 3, writes: []string{"x", "\xe2", "\x82\xac", "more"}, wantKept: "x\xe2\x82", wantTotal: 8, wantTrunc: true, wantEnc: "utf-8", wantData: ptr("x")},
		{name: "only a split rune", cap: 1, writes: []string{"é"}, wantKept: "\xc3", wantTotal: 2, wantTrunc: true, wantEnc: "utf-8", wantData: ptr("")},
		{name: "incomplete rune without truncation is base64", cap: 10, writes: []string{"a\xc3"}, wantKept: "a\xc3", wantTotal: 2, wantEnc: "base64"},
		{name: "invalid utf-8", cap: 10, writes: []string{"\xff\xfe\x00abc"}, wantKept: "\xff\xfe\x00abc", wantTotal: 6, wantEnc: "base64"},
		{name: "invalid before a split rune", cap: 4, writes: []string{"\xffa€"}, wantKept: "\xffa\xe2\x82", wantTotal: 5, wantTrunc: true, wantEnc: "base64"},
		// NUL is valid UTF-8 but marks binary output; JSON would spend six
		// bytes on each, base64 spends 4/3.
		{name: "NUL bytes make it binary", cap: 10, writes: []string{"a\x00b\x00"}, wantKept: "a\x00b\x00", wantTotal: 4, wantEnc: "base64"},
		{name: "mostly control bytes is binary", cap: 16, writes: []string{"\x01\x02\x03x"}, wantKept: "\x01\x02\x03x", wantTotal: 4, wantEnc: "base64"},
		{name: "control characters are kept", cap: 16, writes: []string{"\x1b[31mred\x07"}, wantKept: "\x1b[31mred\x07", wantTotal: 9, wantEnc: "utf-8"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var live bytes.Buffer
			c := NewCapture(tc.cap, &live)
			for _, w := range tc.writes {
				n, err := c.Write([]byte(w))
				if n != len(w) || err != nil {
					t.Fatalf("Write(%q) = %d, %v; want %d, nil", w, n, err, len(w))
				}
			}
			if got := string(c.Bytes()); got != tc.wantKept {
				t.Errorf("Bytes() = %q, want %q", got, tc.wantKept)
			}
			if got := live.String(); got != tc.wantKept {
				t.Errorf("live got %q, want exactly the kept bytes %q", got, tc.wantKept)
			}
			if got := c.Total(); got != tc.wantTotal {
				t.Errorf("Total() = %d, want %d", got, tc.wantTotal)
			}
			if got := c.Truncated(); got != tc.wantTrunc {
				t.Errorf("Truncated() = %v, want %v", got, tc.wantTrunc)
			}
			s := c.Stream()
			if s.Encoding != tc.wantEnc || s.Bytes != tc.wantTotal || s.Truncated != tc.wantTrunc {
				t.Errorf("Stream() = %+v, want encoding %s, bytes %d, truncated %v", s, tc.wantEnc, tc.wantTotal, tc.wantTrunc)
			}
			switch s.Encoding {
			case "utf-8":
				want := tc.wantKept
				if tc.wantData != nil {
					want = *tc.wantData
				}
				if s.Data != want {
					t.Errorf("Stream().Data = %q, want %q", s.Data, want)
				}
			case "base64":
				raw, err := base64.StdEncoding.DecodeString(s.Data)
				if err != nil {
					t.Fatalf("base64 data does not decode: %v", err)
				}
				if string(raw) != tc.wantKept {
					t.Errorf("base64 round trip = %q, want %q", raw, tc.wantKept)
				}
			}
			if int64(cap(c.buf)) > max(tc.cap, 0) {
				t.Errorf("buffer capacity %d exceeds cap %d", cap(c.buf), tc.cap)
			}
		})
	}
}

// TestCaptureStreamJSON checks the JSON form keeps control characters
// intact (the encoder escapes them) and round-trips.
func TestCaptureStreamJSON(t *testing.T) {
	in := "line\n\x1b]52;c;SGVsbG8=\x07 é and some more text"
	c := NewCapture(1024, nil)
	c.Write([]byte(in))
	b, err := json.Marshal(c.Stream())
	if err != nil {
		t.Fatal(err)
	}
	if bytes.ContainsAny(b, "\x00\x1b\x07") {
		t.Errorf("JSON contains raw control bytes: %q", b)
	}
	var s struct{ Data, Encoding string }
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	if s.Data != in || s.Encoding != "utf-8" {
		t.Errorf("round trip = %q (%s), want %q", s.Data, s.Encoding, in)
	}
}

type failWriter struct{ calls int }

func (f *failWriter) Write(p []byte) (int, error) {
	f.calls++
	return 0, errors.New("terminal gone")
}

func TestCaptureLiveFailureKeepsCapturing(t *testing.T) {
	fw := &failWriter{}
	c := NewCapture(8, fw)
	for _, w := range []string{"ab", "cd", "ef"} {
		if n, err := c.Write([]byte(w)); n != 2 || err != nil {
			t.Fatalf("Write = %d, %v; want 2, nil", n, err)
		}
	}
	if fw.calls != 1 {
		t.Errorf("live writer called %d times after failing, want 1", fw.calls)
	}
	if got := string(c.Bytes()); got != "abcdef" {
		t.Errorf("Bytes() = %q, want %q", got, "abcdef")
	}
	if c.LiveErr() == nil {
		t.Error("LiveErr() = nil, want the live writer's error")
	}
}

// TestCaptureConcurrentTotal reads Total while another goroutine writes
// (run with -race).
func TestCaptureConcurrentTotal(t *testing.T) {
	c := NewCapture(1<<10, nil)
	chunk := bytes.Repeat([]byte("x"), 100)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range 1000 {
			c.Write(chunk)
		}
	}()
	for last := int64(0); last < 100000; {
		tot := c.Total()
		if tot < last {
			t.Fatalf("Total went backwards: %d after %d", tot, last)
		}
		last = tot
		_ = c.Truncated()
		_ = c.Stream()
	}
	wg.Wait()
	if c.Total() != 100000 || len(c.Bytes()) != 1<<10 {
		t.Errorf("Total() = %d, kept %d; want 100000, 1024", c.Total(), len(c.Bytes()))
	}
}

// TestCaptureMemoryBounded writes 100 MB through a 1 MiB capture and checks
// the bytes allocated stay within a few MiB.
func TestCaptureMemoryBounded(t *testing.T) {
	const capBytes = 1 << 20
	chunk := bytes.Repeat([]byte("0123456789abcdef"), 2048) // 32 KiB
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	c := NewCapture(capBytes, nil)
	var written int64
	for written < 100_000_000 {
		c.Write(chunk)
		written += int64(len(chunk))
	}
	runtime.ReadMemStats(&after)
	alloc := after.TotalAlloc - before.TotalAlloc
	if alloc > 4<<20 {
		t.Errorf("allocated %d bytes for a %d-byte cap over %d bytes written; want < 4 MiB", alloc, capBytes, written)
	}
	if c.Total() != written || len(c.Bytes()) != capBytes {
		t.Errorf("Total() = %d, kept %d; want %d, %d", c.Total(), len(c.Bytes()), written, capBytes)
	}
	// Once full, a Write allocates nothing.
	if n := testing.AllocsPerRun(100, func() { c.Write(chunk) }); n != 0 {
		t.Errorf("Write on a full capture allocates %v times per call, want 0", n)
	}
}

func BenchmarkCaptureWrite(b *testing.B) {
	chunk := bytes.Repeat([]byte("x"), 32<<10)
	for _, bc := range []struct {
		name string
		cap  int64
	}{{"under-cap", 1 << 40}, {"over-cap", 1 << 20}} {
		b.Run(bc.name, func(b *testing.B) {
			c := NewCapture(bc.cap, nil)
			b.SetBytes(int64(len(chunk)))
			b.ReportAllocs()
			for b.Loop() {
				c.Write(chunk)
				if bc.cap > 1<<30 && c.Total() > 256<<20 {
					b.StopTimer()
					c = NewCapture(bc.cap, nil)
					b.StartTimer()
				}
			}
		})
	}
}
