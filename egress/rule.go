package egress

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/net/idna"
	"golang.org/x/net/publicsuffix"
)

// Rule is one allowlist entry: an exact host ("pypi.org"), or a subdomain
// wildcard ("*.pythonhosted.org" matches a.pythonhosted.org and
// a.b.pythonhosted.org but not pythonhosted.org itself), with an optional
// port. Host is stored without the "*." prefix, in its normalised ASCII
// (punycode) lower-case form without a trailing dot; build rules with
// ParseRule so that holds.
type Rule struct {
	Host     string
	Wildcard bool
	// Port is the one port the rule grants; 0 grants 80 and 443.
	Port int
}

// RuleError is a rule that cannot be parsed; its message names the entry and
// the fix.
type RuleError struct {
	Entry  string // the entry as written
	Reason string // what is wrong and how to fix it
}

func (e *RuleError) Error() string {
	return fmt.Sprintf("network.allow entry %q: %s", e.Entry, e.Reason)
}

var errNumericHost = errors.New("looks like an IP address in numeric form")

// normaliseHost returns the canonical form of a host name: ASCII, lower case,
// Unicode labels in punycode ("xn--..."), no trailing dot. Anything that is
// not a valid DNS host name is an error, so a caller never matches on a
// string the resolver or the destination would read differently: the
// normalised name is also what is resolved, sent as Host and compared with
// the SNI.
//
// Unicode labels go through IDNA (UTS #46 lookup mapping, NFC, IDNA2008
// validity, the bidi rule; idnaProfile), so every spelling of one name,
// composed, decomposed or already punycode, normalises to the same A-label
// and matches the same rule. On top of IDNA, Moat refuses what IDNA would
// quietly map: characters that stand in for ASCII (the Kelvin sign K,
// fullwidth forms, the ideographic full stop as a dot), and labels that
// mix the Latin, Greek and Cyrillic scripts, the lookalikes a reader of a
// manifest or a log would take for another name (checkLookalike).
func normaliseHost(s string) (string, error) {
	if s == "" {
		return "", errors.New("empty host name")
	}
	if len(s) > 1024 {
		return "", errors.New("host name too long")
	}
	// One trailing dot is the absolute form of the same name ("pypi.org.");
	// more than one is an empty label, and not a name.
	s = strings.TrimSuffix(s, ".")
	labels := strings.Split(s, ".")
	for i, l := range labels {
		a, err := normaliseLabel(l)
		if err != nil {
			return "", fmt.Errorf("not a valid host name: %v", err)
		}
		labels[i] = a
	}
	a := strings.Join(labels, ".")
	if len(a) > 253 {
		return "", errors.New("not a valid host name: longer than 253 characters")
	}
	// A numeric last label is how IPv4 literals in other notations look
	// ("2130706433", "127.1", "0x7f.0.0.1"): resolvers built on inet_aton
	// turn them into addresses. They are never host names.
	if numericLabel(labels[len(labels)-1]) {
		return "", errNumericHost
	}
	return a, nil
}

// idnaProfile is the one IDNA profile for allowlist rules and requested
// names alike: the lookup mapping of UTS #46 (case folding, NFC), STD3
// ASCII rules, IDNA2008 label validation (hyphens, joiners, combining marks
// first), the bidi rule of RFC 5893 and DNS lengths. Non-transitional: ß
// and ς stay themselves, as browsers have resolved them since 2017.
var idnaProfile = idna.New(
	idna.MapForLookup(),
	idna.BidiRule(),
	idna.ValidateLabels(true),
	idna.StrictDomainName(true),
	idna.VerifyDNSLength(true),
	idna.Transitional(false),
)

// idnaMapping maps without validating, to see what one character becomes.
var idnaMapping = idna.New(idna.MapForLookup(), idna.Transitional(false))

// normaliseLabel returns the ASCII form of one label.
func normaliseLabel(l string) (string, error) {
	if l == "" {
		return "", errors.New("empty label")
	}
	if !utf8.ValidString(l) {
		return "", errors.New("invalid UTF-8")
	}
	ascii := true
	for i := 0; i < len(l); i++ {
		if l[i] >= 0x80 {
			ascii = false
			break
		}
	}
	if ascii {
		a := strings.ToLower(l)
		if err := checkLDH(a); err != nil {
			return "", err
		}
		if strings.HasPrefix(a, "xn--") {
			// An A-label must be the canonical encoding of a valid
			// Unicode label, or two spellings could mean one name.
			// idna.Punycode only decodes (RFC 3492); the checks are
			// Moat's and then the strict profile's.
			u, err := idna.Punycode.ToUnicode(a)
			if err != nil || strings.HasPrefix(u, "xn--") {
				return "", fmt.Errorf("label %q is not valid punycode", l)
			}
			if err := checkULabel([]rune(u)); err != nil {
				return "", fmt.Errorf("label %q: %v", l, err)
			}
			if err := checkLookalike(u); err != nil {
				return "", fmt.Errorf("label %q: %v", l, err)
			}
			back, err := idnaProfile.ToASCII(u)
			if err != nil {
				return "", fmt.Errorf("label %q: %v", l, err)
			}
			if back != a {
				return "", fmt.Errorf("label %q is not canonical punycode (IDNA writes it %q)", l, back)
			}
		}
		return a, nil
	}
	for _, r := range l {
		if r < 0x80 {
			continue
		}
		if r >= 0xFF00 && r <= 0xFFEF {
			return "", fmt.Errorf("fullwidth or halfwidth character %U; write the plain form", r)
		}
		if !(unicode.IsLetter(r) || unicode.IsMark(r) || unicode.IsDigit(r)) {
			return "", fmt.Errorf("character %U is not allowed in a host name", r)
		}
		// IDNA maps the Kelvin sign to k, ① to 1, ﬁ to fi: a name that
		// reads as Unicode but resolves as ASCII is a trick, not a name.
		if m, _ := idnaMapping.ToUnicode(string(r)); strings.IndexFunc(m, func(c rune) bool { return c < 0x80 }) >= 0 {
			return "", fmt.Errorf("character %U stands in for ASCII %q", r, m)
		}
	}
	a, err := idnaProfile.ToASCII(l)
	if err != nil {
		return "", fmt.Errorf("label %q: %v", l, err)
	}
	if !strings.HasPrefix(a, "xn--") || strings.Contains(a, ".") {
		return "", fmt.Errorf("label %q does not map to one Unicode label (%q)", l, a)
	}
	u, err := idna.Punycode.ToUnicode(a)
	if err != nil {
		return "", fmt.Errorf("label %q: %v", l, err)
	}
	if err := checkULabel([]rune(u)); err != nil {
		return "", err
	}
	if err := checkLookalike(u); err != nil {
		return "", err
	}
	if len(a) > 63 {
		return "", errors.New("label longer than 63 characters")
	}
	// The A-label must pass the checks it gets when written as such:
	// the profile checks the bidi rule before mapping, so ℷ (GIMEL
	// SYMBOL, left-to-right) passes where the ג it maps to (right-to-
	// left) would not. One name, one verdict, however it is spelt.
	if _, err := normaliseLabel(a); err != nil {
		return "", fmt.Errorf("label %q maps to %q, which is refused: %v", l, a, err)
	}
	return a, nil
}

// lookalikeScripts are the scripts whose letters stand in for one another
// (Latin a, Cyrillic а, Greek α): a label may use one of them, not two.
// Other scripts mix with Latin in real names (Japanese with Latin letters).
var lookalikeScripts = []struct {
	name  string
	table *unicode.RangeTable
}{
	{"Latin", unicode.Latin},
	{"Greek", unicode.Greek},
	{"Cyrillic", unicode.Cyrillic},
}

// checkLookalike refuses a Unicode label that mixes two of the Latin,
// Greek and Cyrillic scripts ("аpple" with a Cyrillic а, "pаypal"): such a
// name is the same length and look as an ASCII one, and would be read as
// it in a manifest review or a log.
func checkLookalike(u string) error {
	first := -1
	for _, r := range u {
		for i, sc := range lookalikeScripts {
			if !unicode.Is(sc.table, r) {
				continue
			}
			if first < 0 {
				first = i
			} else if first != i {
				return fmt.Errorf("label %q mixes %s and %s letters (a lookalike of another name); write it in one script", u, lookalikeScripts[first].name, sc.name)
			}
		}
	}
	return nil
}

// checkLDH checks an ASCII label: letters, digits, hyphens, 1 to 63 long,
// no hyphen at either end.
func checkLDH(l string) error {
	if len(l) == 0 || len(l) > 63 {
		return errors.New("empty or over-long label")
	}
	for i := 0; i < len(l); i++ {
		c := l[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return fmt.Errorf("character %q", c)
		}
	}
	if l[0] == '-' || l[len(l)-1] == '-' {
		return errors.New("label starts or ends with a hyphen")
	}
	return nil
}

// checkULabel checks a Unicode label: it has a non-ASCII character (or it
// would be an ASCII label), and only letters, marks, digits and hyphens,
// ASCII ones lower case; no fullwidth forms, no hyphen at either end.
func checkULabel(u []rune) error {
	if len(u) == 0 {
		return errors.New("empty label")
	}
	nonASCII := false
	for _, r := range u {
		switch {
		case r >= 0xFF00 && r <= 0xFFEF:
			return fmt.Errorf("fullwidth or halfwidth character %U; write the plain form", r)
		case r < 0x80:
			if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
				return fmt.Errorf("character %q", r)
			}
		case unicode.IsLetter(r) || unicode.IsMark(r) || unicode.IsDigit(r):
			nonASCII = true
		default:
			return fmt.Errorf("character %U is not allowed in a host name", r)
		}
	}
	if !nonASCII {
		return errors.New("punycode label without non-ASCII characters")
	}
	if u[0] == '-' || u[len(u)-1] == '-' || unicode.IsMark(u[0]) {
		return errors.New("label starts or ends badly")
	}
	return nil
}

func numericLabel(l string) bool {
	if strings.HasPrefix(l, "0x") {
		return true
	}
	for i := 0; i < len(l); i++ {
		if l[i] < '0' || l[i] > '9' {
			return false
		}
	}
	return true
}

// ParseRule parses one network.allow entry: "host", "*.domain" or either
// with ":port". Case is folded, one trailing dot dropped and Unicode names
// converted to punycode. IP literals, bare "*", wildcards over a public
// suffix ("*.com", "*.co.uk", "*.github.io"), schemes, paths, user info and
// invalid ports are refused with a message that names the entry and the fix.
func ParseRule(s string) (Rule, error) {
	entry := s
	fail := func(format string, args ...any) (Rule, error) {
		return Rule{}, &RuleError{Entry: entry, Reason: fmt.Sprintf(format, args...)}
	}
	s = strings.TrimSpace(s)
	if s == "" {
		return fail(`empty; write a host name such as "pypi.org" or "*.pythonhosted.org"`)
	}
	if i := strings.Index(s, "://"); i >= 0 {
		return fail("a URL is not a rule; write the host only, without %q", s[:i+3])
	}
	if strings.ContainsAny(s, "/?#") {
		return fail(`paths and queries cannot be allowed separately; write the host only, e.g. "pypi.org"`)
	}
	if strings.Contains(s, "@") {
		return fail(`user info ("user@") is not part of a host; write the host only`)
	}
	if strings.ContainsAny(s, " \t\r\n") {
		return fail("contains white space; write one host per entry")
	}
	if a, err := netip.ParseAddr(strings.Trim(s, "[]")); err == nil {
		return fail("IP addresses belong in network.allow_addresses (as %s), not network.allow", netip.PrefixFrom(a, a.BitLen()))
	}

	host, port := s, 0
	if strings.HasPrefix(s, "[") {
		h, _, err := splitHostPort(s)
		if err == nil {
			if _, err := netip.ParseAddr(h); err == nil {
				return fail("IP addresses belong in network.allow_addresses, not network.allow")
			}
		}
		return fail(`not a host name; write "host" or "host:port"`)
	}
	if i := strings.LastIndexByte(s, ':'); i >= 0 {
		if strings.Count(s, ":") > 1 {
			return fail(`not a host name; write "host" or "host:port" (IP addresses belong in network.allow_addresses)`)
		}
		p, err := parsePort(s[i+1:])
		if err != nil {
			return fail("port %q: %v; write a port from 1 to 65535, or none for 80 and 443", s[i+1:], err)
		}
		host, port = s[:i], p
	}
	if a, err := netip.ParseAddr(strings.TrimSuffix(host, ".")); err == nil {
		return fail("IP addresses belong in network.allow_addresses (as %s), not network.allow", netip.PrefixFrom(a, a.BitLen()))
	}

	wildcard := false
	switch {
	case host == "*" || host == "*.":
		return fail(`a bare "*" would allow every host; list the hosts, or use "*.example.com" for the subdomains of one domain`)
	case strings.HasPrefix(host, "*."):
		wildcard = true
		host = host[2:]
	}
	if strings.Contains(host, "*") {
		return fail(`"*" is only allowed as the whole first label, as in "*.example.com"`)
	}
	h, err := normaliseHost(host)
	if err != nil {
		if errors.Is(err, errNumericHost) {
			return fail("%v; IP addresses belong in network.allow_addresses", err)
		}
		return fail("%v", err)
	}
	if wildcard {
		if !strings.Contains(h, ".") {
			return fail("*.%s covers a whole top-level domain; name a registrable domain, e.g. \"*.example.%s\"", h, h)
		}
		if ps, _ := publicsuffix.PublicSuffix(h); ps == h {
			return fail("*.%s covers a public suffix (anyone can register names under %q); name a domain under it, e.g. \"*.example.%s\"", h, h, h)
		}
	}
	return Rule{Host: h, Wildcard: wildcard, Port: port}, nil
}

// MustParseRule is ParseRule for rules written in code; it panics on error.
func MustParseRule(s string) Rule {
	r, err := ParseRule(s)
	if err != nil {
		panic(err)
	}
	return r
}

func parsePort(s string) (int, error) {
	if s == "" {
		return 0, errors.New("empty")
	}
	if len(s) > 5 {
		return 0, errors.New("out of range")
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, errors.New("not a number")
		}
	}
	p, _ := strconv.Atoi(s)
	if p < 1 || p > 65535 {
		return 0, errors.New("out of range")
	}
	return p, nil
}

// splitHostPort splits "host:port" or "[v6]:port" without accepting the
// oddities net.SplitHostPort tolerates; the port must be present and valid.
func splitHostPort(s string) (string, int, error) {
	var host, port string
	if strings.HasPrefix(s, "[") {
		end := strings.IndexByte(s, ']')
		if end < 0 || end+1 >= len(s) || s[end+1] != ':' {
			return "", 0, errors.New("missing port")
		}
		host, port = s[1:end], s[end+2:]
	} else {
		i := strings.LastIndexByte(s, ':')
		if i < 0 {
			return "", 0, errors.New("missing port")
		}
		host, port = s[:i], s[i+1:]
		if strings.Contains(host, ":") {
			return "", 0, errors.New("unbracketed IPv6 address")
		}
	}
	p, err := parsePort(port)
	if err != nil {
		return "", 0, fmt.Errorf("port %q: %v", port, err)
	}
	if host == "" {
		return "", 0, errors.New("missing host")
	}
	return host, p, nil
}

// String returns the rule in the form ParseRule accepts.
func (r Rule) String() string {
	s := r.Host
	if r.Wildcard {
		s = "*." + s
	}
	if r.Port != 0 {
		s += ":" + strconv.Itoa(r.Port)
	}
	return s
}

// Matches reports whether the rule grants host:port. host is normalised
// first (case, trailing dot, IDNA); a host that is not a valid name never
// matches.
func (r Rule) Matches(host string, port int) bool {
	h, err := normaliseHost(host)
	if err != nil {
		return false
	}
	return r.matches(h, port)
}

// matches is Matches for an already normalised host.
func (r Rule) matches(host string, port int) bool {
	switch r.Port {
	case 0:
		if port != 80 && port != 443 {
			return false
		}
	default:
		if port != r.Port {
			return false
		}
	}
	if !r.Wildcard {
		return host == r.Host
	}
	// The dot before the suffix is what keeps "evil-pythonhosted.org" and
	// "pythonhosted.org" itself out of "*.pythonhosted.org".
	return len(host) > len(r.Host)+1 && strings.HasSuffix(host, r.Host) && host[len(host)-len(r.Host)-1] == '.'
}
