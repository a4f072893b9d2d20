package engine

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/output"
)

type failWriter struct{ n int }

func (f *failWriter) Write(p []byte) (int, error) {
	f.n++
	return 0, errors.New("gone")
}

// TestRawTee: the raw writer of ExecRequest.RawStdout gets every byte
// past the cap while the capture keeps only the cap; a failing raw
// writer is dropped and the capture goes on.
func TestRawTee(t *testing.T) {
	tests := []struct {
		name     string
		cap      int64
		writes   []string
		fail     bool
		wantKept string
	}{
		{"under the cap", 100, []string{"ab", "cd"}, false, "abcd"},
		{"past the cap", 3, []string{"ab", "cdef", "gh"}, false, "abc"},
		{"zero cap", 0, []string{"xyz"}, false, ""},
		{"failing raw writer", 3, []string{"ab", "cd"}, true, "abc"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var raw bytes.Buffer
			fw := &failWriter{}
			tee := &rawTee{capture: output.NewCapture(tc.cap, nil), raw: &raw}
			if tc.fail {
				tee.raw = fw
			}
			for _, w := range tc.writes {
				if n, err := tee.Write([]byte(w)); n != len(w) || err != nil {
					t.Fatalf("Write(%q) = %d, %v; want %d, nil", w, n, err, len(w))
				}
			}
			all := strings.Join(tc.writes, "")
			if got := string(tee.capture.Bytes()); got != tc.wantKept {
				t.Errorf("capture kept %q, want %q", got, tc.wantKept)
			}
			if tee.capture.Total() != int64(len(all)) {
				t.Errorf("capture counted %d, want %d", tee.capture.Total(), len(all))
			}
			if tc.fail {
				if fw.n != 1 {
					t.Errorf("failing raw writer called %d times, want once (then dropped)", fw.n)
				}
			} else if raw.String() != all {
				t.Errorf("raw got %q, want all of %q", raw.String(), all)
			}
		})
	}
}
