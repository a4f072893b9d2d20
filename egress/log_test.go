package egress

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"
)

// floodRefused sends n requests that the proxy refuses, one connection
// each, and waits for every answer.
func floodRefused(t *testing.T, h *harness, n int, target string) {
	t.Helper()
	for range n {
		c, err := net.DialTimeout("tcp", h.addr, 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "GET http://%s/ HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		io.Copy(io.Discard, c) // a refusal, or a reset for an early one
		c.Close()
	}
}

// TestFloodThenExfiltrate is issue 17 §4: refused attempts filled the log,
// and the allowed POST after them, payload and all, was dropped from it.
// Allowed attempts and their bytes are always logged; refused ones past
// the bound are counted, by reason and destination.
func TestFloodThenExfiltrate(t *testing.T) {
	const payload = 5000
	tests := []struct {
		name   string
		flood  int
		rate   int  // connections per second; the clock stands still during the flood
		tunnel bool // exfiltrate through CONNECT instead of a POST
		// want: the reasons of the refused attempts the log does not hold
		wantReasons map[string]int
	}{
		{name: "not-allowlisted then POST", flood: 30, rate: 1000, wantReasons: map[string]int{ReasonNotAllowlisted: 25}},
		{name: "rate-limited then POST", flood: 30, rate: 10, wantReasons: map[string]int{ReasonNotAllowlisted: 5, ReasonLimitRate: 20}},
		{name: "not-allowlisted then tunnel", flood: 30, rate: 1000, tunnel: true, wantReasons: map[string]int{ReasonNotAllowlisted: 25}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
			clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
			pol := testPolicy()
			pol.Limits.MaxLogEntries = 5
			pol.Limits.ConnRate = tc.rate
			h := newHarness(t, pol, Options{Now: clock})
			floodRefused(t, h, tc.flood, "evil.test")
			h.settle(5)
			waitFor(t, "the flood counted", func() bool { return h.p.Summary().Attempts == tc.flood })
			mu.Lock()
			now = now.Add(time.Second) // the rate limiter lets the next one through
			mu.Unlock()

			url := "http://allowed.test/upload"
			if tc.tunnel {
				url = "https://allowed.test/upload"
			}
			resp, err := h.client().Post(url, "application/octet-stream", bytes.NewReader(make([]byte, payload)))
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || h.b.uploadedBytes() != payload {
				t.Fatalf("upload: status %d, destination got %d bytes", resp.StatusCode, h.b.uploadedBytes())
			}
			h.p.Close()

			var allowed []Attempt
			for _, a := range h.p.Attempts() {
				if a.Allowed {
					allowed = append(allowed, a)
				}
			}
			if len(allowed) != 1 || allowed[0].Host != "allowed.test" || allowed[0].BytesOut < payload {
				t.Fatalf("allowed attempts in the log: %+v (want the upload with at least %d bytes out)", allowed, payload)
			}
			s := h.p.Summary()
			if s.Attempts != tc.flood+1 || s.Allowed != 1 || s.BytesOut != allowed[0].BytesOut || s.BytesIn != allowed[0].BytesIn {
				t.Fatalf("summary %+v, want %d attempts, 1 allowed, the upload's bytes", s, tc.flood+1)
			}
			if s.Unlogged != tc.flood-5 || len(s.UnloggedReasons) != len(tc.wantReasons) {
				t.Fatalf("unlogged %d %v, want %d %v", s.Unlogged, s.UnloggedReasons, tc.flood-5, tc.wantReasons)
			}
			for r, n := range tc.wantReasons {
				if s.UnloggedReasons[r] != n {
					t.Fatalf("unlogged reasons %v, want %v", s.UnloggedReasons, tc.wantReasons)
				}
			}
			sum := s.UnloggedElsewhere
			for _, d := range s.UnloggedDestinations {
				sum += d.Count
				if d.Reason == ReasonNotAllowlisted && (d.Host != "evil.test" || d.Port != 80) {
					t.Fatalf("destination %+v, want evil.test:80", d)
				}
			}
			if sum != s.Unlogged || len(h.p.Attempts())+s.Unlogged != s.Attempts {
				t.Fatalf("counts do not add up: %+v, %d logged", s, len(h.p.Attempts()))
			}
		})
	}
}

// TestMaxAdmitted: past MaxAdmitted attempts let through, the run's egress
// ends (limit-log) rather than let a connection go unrecorded.
func TestMaxAdmitted(t *testing.T) {
	pol := testPolicy()
	pol.Limits.MaxAdmitted = 2
	pol.Limits.MaxLogEntries = 1
	h := newHarness(t, pol, Options{})
	c := h.client()
	var codes []int
	for range 4 {
		resp, err := c.Get("http://allowed.test/")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		codes = append(codes, resp.StatusCode)
	}
	if fmt.Sprint(codes) != "[200 200 503 503]" {
		t.Fatalf("statuses %v, want two served, then 503", codes)
	}
	h.p.Close()
	if n := len(h.dialer.addrs()); n != 2 {
		t.Fatalf("the proxy dialed %d times, want 2", n)
	}
	s := h.p.Summary()
	if s.Allowed != 2 || s.Attempts != 4 || s.Unlogged != 1 || s.UnloggedReasons[ReasonLimitLog] != 1 {
		t.Fatalf("summary %+v", s)
	}
}

func TestSummaryBoundedAndSince(t *testing.T) {
	p := New(Policy{Limits: Limits{MaxLogEntries: 1}}, Options{})
	defer p.Close()
	p.logRefused(Attempt{Host: "logged.test", Port: 80, Reason: ReasonNotAllowlisted})
	for i := range maxSummaryDestinations + 10 {
		p.logRefused(Attempt{Host: fmt.Sprintf("h%d.test", i), Port: 443, Reason: ReasonNotAllowlisted})
	}
	first := p.Summary()
	if len(first.UnloggedDestinations) != maxSummaryDestinations || first.UnloggedElsewhere != 10 || first.Unlogged != maxSummaryDestinations+10 {
		t.Fatalf("destinations %d, elsewhere %d, unlogged %d", len(first.UnloggedDestinations), first.UnloggedElsewhere, first.Unlogged)
	}
	p.logRefused(Attempt{Host: "h0.test", Port: 443, Reason: ReasonNotAllowlisted})
	p.logRefused(Attempt{Reason: ReasonLimitRate})
	d := p.Summary().Since(first)
	if d.Attempts != 2 || d.Unlogged != 2 || d.UnloggedElsewhere != 1 || d.UnloggedReasons[ReasonNotAllowlisted] != 1 || d.UnloggedReasons[ReasonLimitRate] != 1 {
		t.Fatalf("since: %+v", d)
	}
	if len(d.UnloggedDestinations) != 1 || d.UnloggedDestinations[0].Host != "h0.test" || d.UnloggedDestinations[0].Count != 1 {
		t.Fatalf("since destinations: %+v", d.UnloggedDestinations)
	}
}

// zoneResolver answers every name under its zone with 127.0.0.1 and
// records the names it was asked: what a DNS server of the attacker's
// would have received. No DNS is ever sent.
type zoneResolver struct {
	zone  string
	mu    sync.Mutex
	asked []string
}

func (z *zoneResolver) LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error) {
	z.mu.Lock()
	z.asked = append(z.asked, host)
	z.mu.Unlock()
	if host == strings.TrimPrefix(z.zone, ".") || strings.HasSuffix(host, z.zone) || host == "allowed.test" {
		return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

func (z *zoneResolver) received() (names int, bytes int) {
	z.mu.Lock()
	defer z.mu.Unlock()
	seen := map[string]bool{}
	for _, n := range z.asked {
		if strings.HasSuffix(n, z.zone) && !seen[n] {
			seen[n] = true
			bytes += len(n)
		}
	}
	return len(seen), bytes
}

// TestWildcardNamesCharged is issue 17 §6: with a wildcard grant every new
// name went to the host's resolver for free (3600 bytes of names through a
// 1 KiB budget). Each new name now costs its length of MaxBytesOut and a
// token of NamesPerSecond; names an exact rule writes out cost nothing.
func TestWildcardNamesCharged(t *testing.T) {
	secretName := func(i int) string { return fmt.Sprintf("%040d.wild.test", i) } // 50 bytes
	tests := []struct {
		name     string
		budget   int64
		rate     int
		requests int
		repeat   bool // every request uses the same name
		// want
		maxNames  int
		refusedAs string
	}{
		{name: "budget bounds the names", budget: 1024, rate: 1000, requests: 72, maxNames: 20, refusedAs: ReasonLimitBytes},
		{name: "rate bounds new names", budget: 64 << 20, rate: 4, requests: 10, maxNames: 4, refusedAs: ReasonLimitNames},
		{name: "a name seen before is free", budget: 60, rate: 1, requests: 10, repeat: true, maxNames: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
			z := &zoneResolver{zone: ".wild.test"}
			pol := testPolicy()
			pol.Limits.MaxBytesOut = tc.budget
			pol.Limits.NamesPerSecond = tc.rate
			h := newHarness(t, pol, Options{Resolver: z, Now: func() time.Time { return now }})
			refused := map[string]int{}
			for i := range tc.requests {
				name := secretName(i)
				if tc.repeat {
					name = secretName(0)
				}
				v := h.p.decide(h.p.ctx, name, 443, true)
				if v.reason != ReasonAllowed {
					refused[v.reason]++
				}
			}
			names, nameBytes := z.received()
			if names > tc.maxNames || int64(nameBytes) > tc.budget {
				t.Fatalf("the resolver received %d names (%d bytes) with a %d byte budget and %d names a second; want at most %d names",
					names, nameBytes, tc.budget, tc.rate, tc.maxNames)
			}
			s := h.p.Summary()
			if s.Lookups != names || s.LookupBytes != int64(nameBytes) {
				t.Fatalf("summary says %d lookups, %d bytes; the resolver got %d, %d", s.Lookups, s.LookupBytes, names, nameBytes)
			}
			if tc.refusedAs != "" && refused[tc.refusedAs] != tc.requests-names {
				t.Fatalf("refused %v, want %d as %s", refused, tc.requests-names, tc.refusedAs)
			}
			if tc.refusedAs == "" && len(refused) > 0 {
				t.Fatalf("refused %v, want none", refused)
			}
		})
	}
	t.Run("exact names are free", func(t *testing.T) {
		z := &zoneResolver{zone: ".wild.test"}
		pol := testPolicy()
		pol.Limits.MaxBytesOut = 5
		pol.Limits.NamesPerSecond = 1
		h := newHarness(t, pol, Options{Resolver: z})
		for range 3 {
			if v := h.p.decide(h.p.ctx, "allowed.test", 80, false); v.reason != ReasonAllowed {
				t.Fatalf("exact rule's name: %+v", v)
			}
		}
		if s := h.p.Summary(); s.Lookups != 0 || s.LookupBytes != 0 {
			t.Fatalf("an exact rule's name was charged: %+v", s)
		}
	})
	t.Run("charged names spend the budget for bytes", func(t *testing.T) {
		z := &zoneResolver{zone: ".wild.test"}
		pol := testPolicy()
		pol.Limits.MaxBytesOut = 60
		h := newHarness(t, pol, Options{Resolver: z})
		if v := h.p.decide(h.p.ctx, secretName(1), 80, false); v.reason != ReasonAllowed {
			t.Fatalf("first name: %+v", v)
		}
		// 50 of 60 bytes spent on the name: an 11-byte upload cannot fit.
		if g := h.p.out.take(11); g != 10 {
			t.Fatalf("after a 50-byte name, %d of 11 bytes granted from a 60 byte budget", g)
		}
	})
}

// TestRefusedHostBounded: a refused request's host is the client's text;
// the log keeps at most maxLoggedHost bytes of it, so 10000 refusals with
// 60 KiB hosts cannot hold 600 MiB.
func TestRefusedHostBounded(t *testing.T) {
	h := newHarness(t, testPolicy(), Options{})
	c := h.raw()
	host := strings.Repeat("a", 60<<10)
	fmt.Fprintf(c, "GET http://%s/ HTTP/1.1\r\nHost: x\r\n\r\n", host)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	io.Copy(io.Discard, c)
	a := h.last()
	if a.Allowed || len(a.Host) > maxLoggedHost+len("...") {
		t.Fatalf("logged host of %d bytes (%+v)", len(a.Host), a.Reason)
	}
}
