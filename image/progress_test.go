package image

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestMeter(t *testing.T) {
	tests := []struct {
		name     string
		terminal bool
		total    int64
		steps    []time.Duration // clock advance before each update
		want     string
	}{
		{
			name:  "fast layer: nothing",
			steps: []time.Duration{time.Millisecond, time.Millisecond},
			want:  "",
		},
		{
			name:  "plain line after ten seconds, with the total",
			total: 4_000_000,
			steps: []time.Duration{5 * time.Second, 6 * time.Second, time.Second},
			want:  "layer 1 of 2: 2.0 MB of 4.0 MB read (50%)\n",
		},
		{
			name:  "plain line without a total",
			total: -1,
			steps: []time.Duration{11 * time.Second},
			want:  "layer 1 of 2: 1.0 MB read\n",
		},
		{
			name:     "terminal redraws and clears",
			terminal: true,
			total:    4_000_000,
			steps:    []time.Duration{250 * time.Millisecond, 250 * time.Millisecond},
			want:     "\r\x1b[Klayer 1 of 2: 1.0 MB of 4.0 MB read (25%)\r\x1b[Klayer 1 of 2: 2.0 MB of 4.0 MB read (50%)\r\x1b[K",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			clock := time.Unix(0, 0)
			var read int64
			m := &meter{w: &buf, terminal: tt.terminal, label: "layer 1 of 2", total: tt.total,
				done: func() int64 { return read }, now: func() time.Time { return clock }}
			m.next = clock.Add(m.tick())
			for _, d := range tt.steps {
				clock = clock.Add(d)
				read += 1_000_000
				m.update()
			}
			m.finish()
			if got := buf.String(); got != tt.want {
				t.Errorf("output %q, want %q", got, tt.want)
			}
		})
	}
}

// TestMeterNilWriter: an import without a progress writer reads layers
// through a meter that reports nothing and does not fail.
func TestMeterNilWriter(t *testing.T) {
	m := newMeter(nil, true, "layer", 10, func() int64 { return 5 })
	m.next = time.Time{}
	m.update()
	m.finish()
	r := meteredReader{strings.NewReader("abc"), m}
	b := make([]byte, 8)
	if n, _ := r.Read(b); n != 3 {
		t.Fatalf("read %d bytes, want 3", n)
	}
}
