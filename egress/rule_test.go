package egress

import (
	"net/netip"
	"strings"
	"testing"
)

func TestParseRule(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    Rule
		wantErr string // substring of the error; "" means success
	}{
		{name: "exact", in: "pypi.org", want: Rule{Host: "pypi.org"}},
		{name: "wildcard", in: "*.pythonhosted.org", want: Rule{Host: "pythonhosted.org", Wildcard: true}},
		{name: "port", in: "api.example.com:443", want: Rule{Host: "api.example.com", Port: 443}},
		{name: "wildcard port", in: "*.example.com:8443", want: Rule{Host: "example.com", Wildcard: true, Port: 8443}},
		{name: "case folded", in: "PyPI.ORG", want: Rule{Host: "pypi.org"}},
		{name: "trailing dot", in: "pypi.org.", want: Rule{Host: "pypi.org"}},
		{name: "surrounding space", in: "  pypi.org ", want: Rule{Host: "pypi.org"}},
		{name: "unicode to punycode", in: "bücher.example", want: Rule{Host: "xn--bcher-kva.example"}},
		{name: "unicode upper case", in: "BÜCHER.example", want: Rule{Host: "xn--bcher-kva.example"}},
		{name: "punycode kept", in: "XN--BCHER-KVA.example", want: Rule{Host: "xn--bcher-kva.example"}},
		{name: "single label", in: "localhost", want: Rule{Host: "localhost"}},
		{name: "wildcard private registry domain", in: "*.s3.example.com", want: Rule{Host: "s3.example.com", Wildcard: true}},

		{name: "empty", in: "", wantErr: "empty"},
		{name: "bare star", in: "*", wantErr: `bare "*"`},
		{name: "star dot", in: "*.", wantErr: `bare "*"`},
		{name: "tld wildcard", in: "*.com", wantErr: "whole top-level domain"},
		{name: "public suffix wildcard", in: "*.co.uk", wantErr: "public suffix"},
		{name: "private public suffix wildcard", in: "*.github.io", wantErr: "public suffix"},
		{name: "inner star", in: "a.*.example.com", wantErr: "whole first label"},
		{name: "partial star", in: "*foo.example.com", wantErr: "whole first label"},
		{name: "double star", in: "*.*.example.com", wantErr: "whole first label"},
		{name: "ipv4", in: "127.0.0.1", wantErr: "allow_addresses"},
		{name: "ipv4 port", in: "10.0.0.1:443", wantErr: "allow_addresses"},
		{name: "ipv4 trailing dot", in: "1.2.3.4.", wantErr: "allow_addresses"},
		{name: "ipv6", in: "::1", wantErr: "allow_addresses"},
		{name: "ipv6 bracket", in: "[::1]", wantErr: "allow_addresses"},
		{name: "ipv6 bracket port", in: "[fd00::1]:443", wantErr: "allow_addresses"},
		{name: "numeric ipv4 form", in: "2130706433", wantErr: "allow_addresses"},
		{name: "short ipv4 form", in: "127.1", wantErr: "allow_addresses"},
		{name: "hex ipv4 form", in: "0x7f.0.0.1", wantErr: "allow_addresses"},
		{name: "scheme", in: "https://pypi.org", wantErr: `without "https://"`},
		{name: "path", in: "pypi.org/simple", wantErr: "paths"},
		{name: "query", in: "pypi.org?x", wantErr: "paths"},
		{name: "userinfo", in: "allowed.com@evil.test", wantErr: "user info"},
		{name: "space inside", in: "a b.com", wantErr: "white space"},
		{name: "port zero", in: "pypi.org:0", wantErr: "out of range"},
		{name: "port too big", in: "pypi.org:65536", wantErr: "out of range"},
		{name: "port not number", in: "pypi.org:https", wantErr: "not a number"},
		{name: "port empty", in: "pypi.org:", wantErr: "empty"},
		{name: "port sign", in: "pypi.org:+443", wantErr: "not a number"},
		{name: "two colons", in: "a:1:2", wantErr: "not a host name"},
		{name: "underscore", in: "a_b.example.com", wantErr: "character"},
		{name: "empty label", in: "a..example.com", wantErr: "empty label"},
		{name: "two trailing dots", in: "pypi.org..", wantErr: "empty label"},
		{name: "leading hyphen", in: "-a.example.com", wantErr: "hyphen"},
		{name: "long label", in: strings.Repeat("a", 64) + ".com", wantErr: "over-long"},
		{name: "long name", in: strings.Repeat("a.", 127) + "com", wantErr: "253"},
		{name: "bad punycode", in: "xn--zz-.example", wantErr: "hyphen"},
		{name: "punycode of a control character", in: "xn--abc.example", wantErr: "not allowed in a host name"},
		{name: "fullwidth", in: "ａllowed.com", wantErr: "fullwidth"},
		{name: "kelvin sign", in: "\u212Aey.example", wantErr: "stands in for ASCII"},
		{name: "ideographic full stop", in: "allowed\u3002com", wantErr: "not allowed"},
		{name: "control char", in: "a\x00b.com", wantErr: "character"},
		{name: "invalid utf8", in: "a\xffb.com", wantErr: "UTF-8"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseRule(tc.in)
			if tc.wantErr != "" {
				if err == nil {
					t.Fatalf("ParseRule(%q) = %+v, want error containing %q", tc.in, got, tc.wantErr)
				}
				if !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ParseRule(%q) error %q, want it to contain %q", tc.in, err, tc.wantErr)
				}
				// The message names the entry, so a manifest author finds it.
				if !strings.Contains(err.Error(), "network.allow entry") {
					t.Fatalf("error %q does not name the entry", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseRule(%q): %v", tc.in, err)
			}
			if got != tc.want {
				t.Fatalf("ParseRule(%q) = %+v, want %+v", tc.in, got, tc.want)
			}
			// String round-trips.
			again, err := ParseRule(got.String())
			if err != nil || again != got {
				t.Fatalf("round trip %q -> %+v, %v", got.String(), again, err)
			}
		})
	}
}

func TestRuleMatches(t *testing.T) {
	tests := []struct {
		name string
		rule string
		host string
		port int
		want bool
	}{
		{"exact 443", "allowed.com", "allowed.com", 443, true},
		{"exact 80", "allowed.com", "allowed.com", 80, true},
		{"exact other port", "allowed.com", "allowed.com", 8080, false},
		{"explicit port", "allowed.com:8080", "allowed.com", 8080, true},
		{"explicit port excludes 443", "allowed.com:8080", "allowed.com", 443, false},
		{"case", "allowed.com", "ALLOWED.COM", 443, true},
		{"trailing dot", "allowed.com", "allowed.com.", 443, true},
		{"two trailing dots", "allowed.com", "allowed.com..", 443, false},
		{"suffix trick", "allowed.com", "allowed.com.evil.test", 443, false},
		{"prefix trick", "allowed.com", "evil-allowed.com", 443, false},
		{"subdomain of exact", "allowed.com", "a.allowed.com", 443, false},
		{"userinfo trick", "allowed.com", "allowed.com@evil.test", 443, false},
		{"port in host", "allowed.com", "allowed.com:443", 443, false},
		{"unicode lookalike", "allowed.com", "аllowed.com", 443, false}, // Cyrillic а
		{"fullwidth", "allowed.com", "ａｌｌｏｗｅｄ.com", 443, false},
		{"punycode vs unicode", "xn--bcher-kva.example", "bücher.example", 443, true},
		{"unicode vs punycode", "bücher.example", "xn--bcher-kva.example", 443, true},
		{"unicode upper", "bücher.example", "BÜCHER.example", 443, true},
		{"null byte", "allowed.com", "allowed.com\x00.evil.test", 443, false},
		{"wildcard one level", "*.pythonhosted.org", "files.pythonhosted.org", 443, true},
		{"wildcard two levels", "*.pythonhosted.org", "a.b.pythonhosted.org", 443, true},
		{"wildcard not apex", "*.pythonhosted.org", "pythonhosted.org", 443, false},
		{"wildcard not sibling", "*.pythonhosted.org", "evilpythonhosted.org", 443, false},
		{"wildcard not suffix trick", "*.pythonhosted.org", "a.pythonhosted.org.evil.test", 443, false},
		{"wildcard empty label", "*.pythonhosted.org", ".pythonhosted.org", 443, false},
		{"wildcard case", "*.pythonhosted.org", "A.PythonHosted.ORG.", 80, true},
		{"wildcard port", "*.example.com:8443", "a.example.com", 8443, true},
		{"wildcard port mismatch", "*.example.com:8443", "a.example.com", 443, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := MustParseRule(tc.rule)
			if got := r.Matches(tc.host, tc.port); got != tc.want {
				t.Fatalf("%s matches %q:%d = %v, want %v", tc.rule, tc.host, tc.port, got, tc.want)
			}
		})
	}
}

func TestPolicyValidate(t *testing.T) {
	good := Policy{Allow: []Rule{MustParseRule("pypi.org"), MustParseRule("*.pythonhosted.org")}}
	if err := good.Validate(); err != nil {
		t.Fatalf("valid policy: %v", err)
	}
	tests := []struct {
		name string
		rule Rule
	}{
		{"upper case host", Rule{Host: "PyPI.org"}},
		{"star in host", Rule{Host: "*.pypi.org"}},
		{"ip literal", Rule{Host: "127.0.0.1"}},
		{"public suffix wildcard", Rule{Host: "com", Wildcard: true}},
		{"bad port", Rule{Host: "pypi.org", Port: 70000}},
		{"empty", Rule{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := Policy{Allow: []Rule{tc.rule}}
			if err := p.Validate(); err == nil {
				t.Fatalf("Validate accepted %+v", tc.rule)
			}
			// And the compiled policy never matches it (fail closed).
			c := compilePolicy(p)
			if len(c.rules) != 0 {
				t.Fatalf("invalid rule %+v compiled to %+v", tc.rule, c.rules)
			}
		})
	}
}

func TestReservedAddress(t *testing.T) {
	tests := []struct {
		addr string
		want bool
	}{
		{"127.0.0.1", true},
		{"127.255.255.254", true},
		{"10.1.2.3", true},
		{"172.16.0.1", true},
		{"172.31.255.255", true},
		{"192.168.1.1", true},
		{"169.254.169.254", true},
		{"100.64.0.1", true},
		{"100.127.255.255", true},
		{"0.0.0.0", true},
		{"0.1.2.3", true},
		{"224.0.0.1", true},
		{"239.255.255.250", true},
		{"255.255.255.255", true},
		{"240.0.0.1", true},
		{"192.0.2.1", true},
		{"198.51.100.1", true},
		{"203.0.113.1", true},
		{"198.18.0.1", true},
		{"192.0.0.1", true},
		{"::", true},
		{"::1", true},
		{"::ffff:127.0.0.1", true},
		{"::ffff:10.0.0.1", true},
		{"::ffff:169.254.169.254", true},
		{"::127.0.0.1", true},
		{"fd00::1", true},
		{"fc00::1", true},
		{"fe80::1", true},
		{"fe80::1%eth0", true},
		{"fec0::1", true},
		{"ff02::1", true},
		{"2001:db8::1", true},
		{"2001::1", true},
		{"2002:7f00:1::1", true},
		{"64:ff9b::7f00:1", true},
		{"64:ff9b::a9fe:a9fe", true},
		{"64:ff9b:1::1", true},
		{"100::1", true},
		// Ordinary global unicast (never dialed by any test).
		{"8.8.8.8", false},
		{"1.1.1.1", false},
		{"172.32.0.1", false},
		{"100.128.0.1", false},
		{"::ffff:8.8.8.8", false},
		{"64:ff9b::808:808", false},
		{"2606:4700::1111", false},
		{"2a00:1450::1", false},
	}
	for _, tc := range tests {
		t.Run(tc.addr, func(t *testing.T) {
			why, got := reservedAddress(netip.MustParseAddr(tc.addr))
			if got != tc.want {
				t.Fatalf("reservedAddress(%s) = %v (%s), want %v", tc.addr, got, why, tc.want)
			}
		})
	}
}

// TestIDNA: every spelling of one international name (composed, decomposed,
// upper case, punycode) normalises to the one A-label IDNA gives it, in
// rules and in requests; invalid punycode and lookalikes are refused.
func TestIDNA(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    string // normalised; "" with wantErr
		wantErr string
	}{
		{name: "composed", in: "caf\u00e9.com", want: "xn--caf-dma.com"},
		{name: "decomposed", in: "cafe\u0301.com", want: "xn--caf-dma.com"},
		{name: "upper decomposed", in: "CAFE\u0301.COM", want: "xn--caf-dma.com"},
		{name: "punycode", in: "xn--caf-dma.com", want: "xn--caf-dma.com"},
		{name: "punycode upper", in: "XN--CAF-DMA.com", want: "xn--caf-dma.com"},
		{name: "german", in: "bücher.example", want: "xn--bcher-kva.example"},
		{name: "cyrillic", in: "пример.test", want: "xn--e1afmkfd.test"},
		{name: "han", in: "测试.test", want: "xn--0zwm56d.test"},
		{name: "sharp s kept (non-transitional)", in: "faß.de", want: "xn--fa-hia.de"},
		{name: "japanese with latin", in: "tokyoの.jp", want: "xn--tokyo-ud4d.jp"},

		{name: "invalid punycode digits", in: "xn--a-.com", wantErr: "hyphen"},
		{name: "punycode that decodes badly", in: "xn--99999999999.com", wantErr: "punycode"},
		{name: "punycode of ascii only", in: "xn--abc-.com", wantErr: "hyphen"},
		{name: "punycode not canonical (decomposed inside)", in: "xn--cafe-yvc.com", wantErr: "canonical"},
		{name: "punycode of upper case", in: "xn--CAF-dma.com", want: "xn--caf-dma.com"},
		{name: "punycode of a disallowed symbol", in: "xn--n3h.com", wantErr: "not allowed"},
		{name: "leading combining mark", in: "\u0301cafe.com", wantErr: "label"},
		{name: "bidi rule", in: "a\u05d0.com", wantErr: "label"},
		{name: "cyrillic a in latin name", in: "\u0430llowed.com", wantErr: "mixes Cyrillic and Latin"},
		{name: "cyrillic a in latin name, punycode", in: "xn--llowed-2nf.com", wantErr: "mixes Cyrillic and Latin"},
		{name: "greek omicron in latin name", in: "g\u03bfogle.com", wantErr: "mixes Latin and Greek"},
		{name: "kelvin sign", in: "\u212Aey.example", wantErr: "stands in for ASCII"},
		{name: "circled digit", in: "a\u2460.example", wantErr: "not allowed"},
		{name: "ligature fi", in: "\ufb01le.example", wantErr: "stands in for ASCII"},
		{name: "fullwidth", in: "\uff41llowed.com", wantErr: "fullwidth"},
		{name: "ideographic full stop", in: "allowed\u3002com", wantErr: "not allowed"},
		{name: "zero width joiner", in: "ca\u200dfe.com", wantErr: "not allowed"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := normaliseHost(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("normaliseHost(%q) = %q, %v; want error containing %q", tc.in, got, err, tc.wantErr)
				}
				if _, err := ParseRule(tc.in); err == nil {
					t.Fatalf("ParseRule(%q) accepted what normaliseHost refuses", tc.in)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("normaliseHost(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
			}
			// A rule in this spelling matches every other spelling.
			r, err := ParseRule(tc.in)
			if err != nil || r.Host != tc.want {
				t.Fatalf("ParseRule(%q) = %+v, %v; want host %q", tc.in, r, err, tc.want)
			}
		})
	}
	t.Run("decomposed, composed and punycode rules match each other", func(t *testing.T) {
		forms := []string{"cafe\u0301.com", "caf\u00e9.com", "xn--caf-dma.com", "CAF\u00c9.com", "xn--caf-dma.com."}
		for _, rule := range forms {
			r := MustParseRule(rule)
			for _, host := range forms {
				if !r.Matches(host, 443) {
					t.Errorf("rule %q does not match %q", rule, host)
				}
			}
			if r.Matches("cafe.com", 443) {
				t.Errorf("rule %q matches the ASCII cafe.com", rule)
			}
		}
	})
}

func TestCanonicalPrefix(t *testing.T) {
	p, ok := canonicalPrefix(netip.MustParsePrefix("::ffff:127.0.0.1/128"))
	if !ok || p != netip.MustParsePrefix("127.0.0.1/32") {
		t.Fatalf("mapped prefix = %v, %v", p, ok)
	}
	pol := compilePolicy(Policy{AllowAddresses: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}})
	if !pol.granted(netip.MustParseAddr("::ffff:127.0.0.1")) {
		t.Fatal("a mapped address is not granted by its IPv4 prefix")
	}
	if pol.granted(netip.MustParseAddr("127.0.0.2")) {
		t.Fatal("127.0.0.2 granted by 127.0.0.1/32")
	}
}
