package egress

import (
	"errors"
	"fmt"
	"net/netip"
	"time"
)

// Policy is what a run may reach.
type Policy struct {
	// Allow is the host allowlist (manifest network.allow).
	Allow []Rule
	// AllowAddresses are IP prefixes explicitly granted (manifest
	// network.allow_addresses), e.g. a test server on 127.0.0.1. Only these
	// may bypass the reserved-address refusal, and only for names that are
	// also allowed, or for IP-literal requests to exactly these addresses on
	// a port some allow rule names.
	AllowAddresses []netip.Prefix
	// Secrets are the run's secrets (secrets.go): their hosts are
	// reached through TLS the proxy terminates, with the placeholder
	// replaced by the value; a placeholder sent elsewhere is refused.
	Secrets []SecretBinding
	// Canaries are the run's decoy credentials (output.NewCanaries):
	// any request, host name or body the proxy sees carrying one, in any
	// form it recognises for a placeholder, is refused as a placeholder
	// bound nowhere is (reason secret-exfiltration), and CanarySeen
	// says so. Each must be 16+ characters of [A-Za-z0-9_-].
	Canaries []string
	Limits   Limits
}

// Limits bound what a run can spend through the proxy. A zero or negative
// field takes its default.
type Limits struct {
	// MaxConns is the number of client connections handled at once
	// (default 16); more are refused with limit-conns.
	MaxConns int
	// MaxBytesOut and MaxBytesIn are the bytes the proxy forwards to
	// destinations and back to the sandbox over the whole life of the Proxy
	// (one run): an exfiltration and download budget (defaults 64 MiB and
	// 512 MiB).
	MaxBytesOut, MaxBytesIn int64
	// ConnRate is the number of new connections accepted per second, with a
	// burst of the same size (default 20); more are refused with limit-rate.
	ConnRate int
	// IdleTimeout closes a connection on which nothing moved either way for
	// this long (default 60s). HandshakeTimeout bounds reading the request
	// header, resolving, dialing and reading the TLS ClientHello (default
	// 10s), so a slow client cannot hold a connection slot.
	IdleTimeout, HandshakeTimeout time.Duration
	// MaxLogEntries bounds the refused attempts stored one by one in the
	// log (default 10000). Refused attempts past it are not stored but
	// counted in the Summary, by reason and by destination: a flood of
	// refusals costs bounded memory and hides nothing.
	MaxLogEntries int
	// MaxAdmitted bounds the attempts let through to a destination
	// (default 50000). Every one of them is stored in the log with its
	// bytes; once this many were, the proxy lets nothing more through
	// (limit-log) rather than let traffic go unrecorded. The connection
	// rate limit makes it unreachable in practice (20 a second for 40
	// minutes at the defaults).
	MaxAdmitted int
	// NamesPerSecond is the number of new host names the proxy may
	// resolve per second for names that only a wildcard rule allows,
	// with a burst of the same size (default 5); more are refused with
	// limit-names. Each such name is information leaving the host as a
	// DNS query, so its first lookup also costs len(name) bytes of
	// MaxBytesOut. Names written out in a rule cost nothing: the manifest
	// already says them.
	NamesPerSecond int
}

// Defaults for Limits.
const (
	DefaultMaxConns         = 16
	DefaultMaxBytesOut      = 64 << 20
	DefaultMaxBytesIn       = 512 << 20
	DefaultConnRate         = 20
	DefaultIdleTimeout      = 60 * time.Second
	DefaultHandshakeTimeout = 10 * time.Second
	DefaultMaxLogEntries    = 10000
	DefaultMaxAdmitted      = 50000
	DefaultNamesPerSecond   = 5
)

// withDefaults returns l with every unset field at its default.
func (l Limits) withDefaults() Limits {
	if l.MaxConns <= 0 {
		l.MaxConns = DefaultMaxConns
	}
	if l.MaxBytesOut <= 0 {
		l.MaxBytesOut = DefaultMaxBytesOut
	}
	if l.MaxBytesIn <= 0 {
		l.MaxBytesIn = DefaultMaxBytesIn
	}
	if l.ConnRate <= 0 {
		l.ConnRate = DefaultConnRate
	}
	if l.IdleTimeout <= 0 {
		l.IdleTimeout = DefaultIdleTimeout
	}
	if l.HandshakeTimeout <= 0 {
		l.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if l.MaxLogEntries <= 0 {
		l.MaxLogEntries = DefaultMaxLogEntries
	}
	if l.MaxAdmitted <= 0 {
		l.MaxAdmitted = DefaultMaxAdmitted
	}
	if l.NamesPerSecond <= 0 {
		l.NamesPerSecond = DefaultNamesPerSecond
	}
	return l
}

// Validate reports every rule that ParseRule would not have produced and
// every invalid prefix. New never fails: a rule that does not validate
// simply never matches (fail closed), so callers that build a Policy by
// hand should call Validate first.
func (p Policy) Validate() error {
	var errs []error
	for i, r := range p.Allow {
		if _, ok := compileRule(r); !ok {
			errs = append(errs, fmt.Errorf("network.allow[%d] %q: not a valid rule; build it with egress.ParseRule", i, r.String()))
		}
	}
	for i, pr := range p.AllowAddresses {
		if _, ok := canonicalPrefix(pr); !ok {
			errs = append(errs, fmt.Errorf("network.allow_addresses[%d]: invalid prefix", i))
		}
	}
	errs = append(errs, validateSecrets(p.Secrets)...)
	for i, c := range p.Canaries {
		if len(c) < minPlaceholder || !placeholderChars(c) {
			errs = append(errs, fmt.Errorf("canaries[%d]: must be at least %d characters of [A-Za-z0-9_-] (output.NewCanaries makes such)", i, minPlaceholder))
		}
	}
	return errors.Join(errs...)
}

// compileRule re-parses r, so a hand-built Rule with an upper-case host, a
// stray "*." or an IP literal cannot match anything ParseRule would refuse.
func compileRule(r Rule) (Rule, bool) {
	if r.Port < 0 || r.Port > 65535 || r.Host == "" {
		return Rule{}, false
	}
	c, err := ParseRule(r.String())
	if err != nil || c != r {
		return Rule{}, false
	}
	return c, true
}

// policy is the compiled, immutable form the proxy consults.
type policy struct {
	rules  []Rule
	grants []netip.Prefix
	limits Limits
}

func compilePolicy(p Policy) policy {
	var c policy
	for _, r := range p.Allow {
		if cr, ok := compileRule(r); ok {
			c.rules = append(c.rules, cr)
		}
	}
	// A secret's hosts are where it may be sent: they are destinations
	// of the run as much as network.allow's (secrets.go).
	for _, b := range p.Secrets {
		for _, r := range b.Hosts {
			if cr, ok := compileRule(r); ok {
				c.rules = append(c.rules, cr)
			}
		}
	}
	for _, pr := range p.AllowAddresses {
		if cp, ok := canonicalPrefix(pr); ok {
			c.grants = append(c.grants, cp)
		}
	}
	c.limits = p.Limits.withDefaults()
	return c
}

// allowsName reports whether a normalised host and port are allowlisted.
func (c *policy) allowsName(host string, port int) bool {
	for _, r := range c.rules {
		if r.matches(host, port) {
			return true
		}
	}
	return false
}

// namesExactly reports whether a rule names host itself (not through a
// wildcard): looking such a name up tells the resolver nothing the
// manifest does not already say.
func (c *policy) namesExactly(host string) bool {
	for _, r := range c.rules {
		if !r.Wildcard && r.Host == host {
			return true
		}
	}
	return false
}

// allowsExplicitPort reports whether a rule naming exactly this port
// allows host.
func (c *policy) allowsExplicitPort(host string, port int) bool {
	for _, r := range c.rules {
		if r.Port == port && r.matches(host, port) {
			return true
		}
	}
	return false
}

// granted reports whether an address is explicitly granted.
func (c *policy) granted(a netip.Addr) bool {
	a = a.WithZone("").Unmap()
	for _, p := range c.grants {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// allowsLiteralPort reports whether an IP-literal request to a granted
// address may use port: only a port some allow rule names (an explicit
// port, or 80 and 443 for a rule without one; 80 and 443 when there are no
// rules at all). An address grant is not a grant of every service on it:
// with allow [localhost:8080] and allow_addresses [127.0.0.1], a request to
// 127.0.0.1:22 stays refused.
func (c *policy) allowsLiteralPort(port int) bool {
	if len(c.rules) == 0 {
		return port == 80 || port == 443
	}
	for _, r := range c.rules {
		if r.Port == port || r.Port == 0 && (port == 80 || port == 443) {
			return true
		}
	}
	return false
}

// ParsePrefix reads an IP address or prefix (an allow_addresses entry): an
// address is the prefix of that one address.
func ParsePrefix(s string) (netip.Prefix, error) {
	if p, err := netip.ParsePrefix(s); err == nil {
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("is not an IP address or prefix (e.g. 127.0.0.1 or 10.0.0.0/24)")
	}
	return netip.PrefixFrom(a, a.BitLen()), nil
}
