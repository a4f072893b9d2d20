package egress

import (
	"net/netip"
	"sync"
	"testing"
)

func TestSetAllow(t *testing.T) {
	pol := testPolicy()
	pol.Allow = []Rule{MustParseRule("allowed.test")}
	pol.AllowAddresses = []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}
	p := New(pol, Options{Resolver: newFakeResolver()})
	defer p.Close()
	lo := []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}
	steps := []struct {
		name  string
		allow []string
		addrs []netip.Prefix
		want  map[string]string // host -> reason
	}{
		{"as created", nil, nil, map[string]string{"allowed.test": ReasonAllowed, "other.test": ReasonNotAllowlisted}},
		{"replaced: the old host goes, the new comes", []string{"other.test"}, lo, map[string]string{"allowed.test": ReasonNotAllowlisted, "other.test": ReasonAllowed}},
		{"without the address grant, loopback answers are refused", []string{"other.test"}, nil, map[string]string{"other.test": ReasonPrivateAddress}},
		{"emptied", []string{}, nil, map[string]string{"allowed.test": ReasonNotAllowlisted, "other.test": ReasonNotAllowlisted}},
		{"a wildcard", []string{"*.wild.test"}, lo, map[string]string{"a.wild.test": ReasonAllowed, "allowed.test": ReasonNotAllowlisted}},
	}
	for i, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			if i > 0 {
				var rules []Rule
				for _, r := range st.allow {
					rules = append(rules, MustParseRule(r))
				}
				p.SetAllow(rules, st.addrs)
			}
			for host, want := range st.want {
				if v := p.decide(p.ctx, host, 80, false); v.reason != want {
					t.Errorf("%s: %s (%s), want %s", host, v.reason, v.msg, want)
				}
			}
		})
	}
}

// A secret's hosts stay reachable whatever the allowlist becomes, and
// decisions racing a replacement each see one allowlist (go test -race).
func TestSetAllowKeepsSecretsAndRaces(t *testing.T) {
	pol := testPolicy()
	pol.Allow = nil
	pol.Secrets = []SecretBinding{{Name: "K", Placeholder: "moat-placeholder-0123456789abcdef", Value: "v", Hosts: []Rule{MustParseRule("allowed.test")}}}
	p := New(pol, Options{Resolver: newFakeResolver()})
	defer p.Close()
	p.SetAllow(nil, []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")})
	if v := p.decide(p.ctx, "allowed.test", 443, true); v.reason != ReasonAllowed {
		t.Errorf("a secret's host after SetAllow: %s (%s)", v.reason, v.msg)
	}
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 200; j++ {
				p.decide(p.ctx, "other.test", 80, false)
			}
		}()
	}
	for j := 0; j < 200; j++ {
		p.SetAllow([]Rule{MustParseRule("other.test")}, nil)
		p.SetAllow(nil, nil)
	}
	wg.Wait()
}
