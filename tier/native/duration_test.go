package native

import (
	"testing"
	"time"

	"github.com/moat-sandbox/moat/guest/nsinit/nswire"
)

func TestProgramDuration(t *testing.T) {
	sent := time.Unix(1000, 0)
	at := func(ms int) time.Time { return sent.Add(time.Duration(ms) * time.Millisecond) }
	ms := time.Millisecond
	tests := []struct {
		name           string
		final          *nswire.Status
		started, ended time.Time
		want           time.Duration
	}{
		// A loaded host read both reports in one batch: init's clock
		// still knows the program ran 4 ms.
		{"init's measurement", &nswire.Status{Exited: true, DurationNS: int64(4 * ms)}, at(9), at(9), 4 * ms},
		{"init claims longer than the host saw", &nswire.Status{Exited: true, DurationNS: int64(time.Hour)}, at(2), at(10), 8 * ms},
		{"init claims exactly what the host saw", &nswire.Status{Exited: true, DurationNS: int64(10 * ms)}, at(2), at(10), 10 * ms},
		{"no measurement from init", &nswire.Status{Exited: true}, at(2), at(10), 8 * ms},
		{"no final status", nil, at(2), at(10), 8 * ms},
		{"no start report", nil, time.Time{}, at(10), 10 * ms},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := programDuration(tc.final, sent, tc.started, tc.ended); got != tc.want {
				t.Errorf("programDuration = %v, want %v", got, tc.want)
			}
		})
	}
}
