package tier

import (
	"testing"
	"time"

	"github.com/moat-sandbox/moat/result"
)

func TestCancelled(t *testing.T) {
	tests := []struct {
		name   string
		detail string
		want   result.Violation
	}{
		{"caller", "the caller cancelled the run; SIGTERM was sent to the program",
			result.Violation{Kind: "cancelled", Detail: "the caller cancelled the run; SIGTERM was sent to the program"}},
		{"destroyed", "the sandbox was destroyed while the command ran",
			result.Violation{Kind: "cancelled", Detail: "the sandbox was destroyed while the command ran"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := Cancelled(tc.detail); got != tc.want {
				t.Errorf("Cancelled(%q) = %+v, want %+v", tc.detail, got, tc.want)
			}
		})
	}
}

// TestCancelGrace pins the grace: results print it ("destroyed after 2s"),
// and the CLI's and tiers' tests read those texts.
func TestCancelGrace(t *testing.T) {
	if CancelGrace != 2*time.Second || CancelGrace.String() != "2s" {
		t.Errorf("CancelGrace = %v, want 2s", CancelGrace)
	}
}
