package native

import (
	"bytes"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/guest/nsinit/nswire"
)

func TestReadStatus(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []nswire.Status
	}{
		{"started then exited", `{"started":true}` + "\n" + `{"exited":true,"exit":3}` + "\n",
			[]nswire.Status{{Started: true}, {Exited: true, Exit: 3}}},
		{"garbage lines are skipped", "not json\n{\"exited\":true,\"exit\":0}\n", []nswire.Status{{Exited: true}}},
		{"out of range exit is dropped", `{"exited":true,"exit":70000}` + "\n", nil},
		{"negative signal is dropped", `{"exited":true,"signal":-1}` + "\n", nil},
		{"too many degradations are dropped", `{"started":true,"degraded":["a","b","c","d","e","f","g","h","i"]}` + "\n", nil},
		{"huge error is dropped", `{"error":"` + strings.Repeat("x", 5000) + `"}` + "\n", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ch := make(chan nswire.Status, 16)
			readStatus(strings.NewReader(tc.in), ch)
			var got []nswire.Status
			for s := range ch {
				got = append(got, s)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
			for i := range got {
				if got[i].Exit != tc.want[i].Exit || got[i].Exited != tc.want[i].Exited || got[i].Started != tc.want[i].Started {
					t.Errorf("message %d = %+v, want %+v", i, got[i], tc.want[i])
				}
			}
		})
	}
}

// TestReadStatusBounded: a flooding init cannot make the host read more
// than MaxStatusBytes.
func TestReadStatusBounded(t *testing.T) {
	flood := bytes.Repeat([]byte(`{"started":true}`+"\n"), 1<<20)
	r := bytes.NewReader(flood)
	ch := make(chan nswire.Status, 1<<20)
	readStatus(r, ch)
	read := len(flood) - r.Len()
	if read > nswire.MaxStatusBytes+4096 {
		t.Errorf("read %d bytes of init status, bound is %d", read, nswire.MaxStatusBytes)
	}
}

// FuzzReadStatus feeds hostile bytes where init's status messages go: no
// panic, and every message that gets through is within range.
func FuzzReadStatus(f *testing.F) {
	for _, s := range []string{
		`{"started":true}` + "\n" + `{"exited":true,"exit":0}` + "\n",
		`{"exited":true,"signal":9,"exit":137}`,
		`{"error":"mount /proc: EPERM"}`,
		`{"started":true,"degraded":["landlock"]}`,
		"\x00\xff{\"exit\":1e309}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		out := make(chan nswire.Status, 1024)
		done := make(chan struct{})
		go func() {
			defer close(done)
			for s := range out {
				if s.Exit < 0 || s.Exit > 255 || s.Signal < 0 || s.Signal > 64 || len(s.Error) > 4096 || len(s.Degraded) > 8 {
					t.Errorf("out-of-range status passed: %+v", s)
				}
			}
		}()
		readStatus(bytes.NewReader(b), out)
		<-done
	})
}
