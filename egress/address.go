package egress

import "net/netip"

// reservedRange is an address range the proxy never dials unless the
// manifest grants it (Policy.AllowAddresses), with the reason.
type reservedRange struct {
	prefix netip.Prefix
	why    string
}

// reserved4 and reserved6 follow the IANA special-purpose address registries
// (RFC 6890 and successors): everything that is not ordinary global unicast.
// The point is that a name in the allowlist whose DNS answer the sandbox's
// author controls cannot be pointed at the host itself, the LAN, the cloud
// metadata service or anything else that is not "the Internet".
var reserved4 = []reservedRange{
	{netip.MustParsePrefix("0.0.0.0/8"), "this network (0.0.0.0 reaches the host on Linux)"},
	{netip.MustParsePrefix("10.0.0.0/8"), "private (RFC 1918)"},
	{netip.MustParsePrefix("100.64.0.0/10"), "shared address space (CGNAT, RFC 6598)"},
	{netip.MustParsePrefix("127.0.0.0/8"), "loopback"},
	{netip.MustParsePrefix("169.254.0.0/16"), "link-local (incl. the 169.254.169.254 metadata service)"},
	{netip.MustParsePrefix("172.16.0.0/12"), "private (RFC 1918)"},
	{netip.MustParsePrefix("192.0.0.0/24"), "IETF protocol assignments"},
	{netip.MustParsePrefix("192.0.2.0/24"), "documentation (TEST-NET-1)"},
	{netip.MustParsePrefix("192.88.99.0/24"), "6to4 relay anycast (deprecated)"},
	{netip.MustParsePrefix("192.168.0.0/16"), "private (RFC 1918)"},
	{netip.MustParsePrefix("198.18.0.0/15"), "benchmarking (RFC 2544)"},
	{netip.MustParsePrefix("198.51.100.0/24"), "documentation (TEST-NET-2)"},
	{netip.MustParsePrefix("203.0.113.0/24"), "documentation (TEST-NET-3)"},
	{netip.MustParsePrefix("224.0.0.0/4"), "multicast"},
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved (incl. 255.255.255.255 broadcast)"},
}

var reserved6 = []reservedRange{
	// ::/8 holds the unspecified address, loopback, the deprecated
	// IPv4-compatible block and SIIT's ::ffff:0:0:0/96. IPv4-mapped
	// addresses are unmapped before this table is consulted, so a mapped
	// public address is judged as the IPv4 address it is.
	{netip.MustParsePrefix("::/8"), "unspecified, loopback or IPv4-compatible"},
	{netip.MustParsePrefix("64:ff9b:1::/48"), "local-use NAT64 (RFC 8215)"},
	{netip.MustParsePrefix("100::/64"), "discard-only (RFC 6666)"},
	{netip.MustParsePrefix("2001::/23"), "IETF protocol assignments (incl. Teredo, benchmarking)"},
	{netip.MustParsePrefix("2001:db8::/32"), "documentation"},
	// 6to4 embeds an IPv4 address the relay would reach; it is deprecated
	// (RFC 7526), so the whole block is refused rather than decoded.
	{netip.MustParsePrefix("2002::/16"), "6to4 (deprecated)"},
	{netip.MustParsePrefix("3fff::/20"), "documentation"},
	{netip.MustParsePrefix("fc00::/7"), "unique local (ULA)"},
	{netip.MustParsePrefix("fe80::/10"), "link-local"},
	{netip.MustParsePrefix("fec0::/10"), "site-local (deprecated)"},
	{netip.MustParsePrefix("ff00::/8"), "multicast"},
}

var nat64 = netip.MustParsePrefix("64:ff9b::/96")

// reservedAddress reports whether a is outside ordinary global unicast, and
// why. IPv4-mapped IPv6 addresses (::ffff:127.0.0.1) and well-known NAT64
// addresses (64:ff9b::10.0.0.1) are judged by the IPv4 address they carry.
func reservedAddress(a netip.Addr) (string, bool) {
	a = a.WithZone("").Unmap()
	if !a.IsValid() {
		return "invalid address", true
	}
	if a.Is4() {
		for _, r := range reserved4 {
			if r.prefix.Contains(a) {
				return r.why, true
			}
		}
		return "", false
	}
	if nat64.Contains(a) {
		b := a.As16()
		return reservedAddress(netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]}))
	}
	for _, r := range reserved6 {
		if r.prefix.Contains(a) {
			return r.why, true
		}
	}
	return "", false
}

// canonicalPrefix makes a grant comparable with unmapped addresses: a prefix
// written in IPv4-mapped form (::ffff:127.0.0.1/128) becomes the IPv4 prefix
// it means.
func canonicalPrefix(p netip.Prefix) (netip.Prefix, bool) {
	if !p.IsValid() {
		return netip.Prefix{}, false
	}
	a := p.Addr().WithZone("")
	if a.Is4In6() {
		if p.Bits() < 96 {
			// Covers more than the mapped block; keep it as written
			// (it cannot match an unmapped IPv4 address, which is the
			// conservative reading).
			return netip.PrefixFrom(a, p.Bits()).Masked(), true
		}
		return netip.PrefixFrom(a.Unmap(), p.Bits()-96).Masked(), true
	}
	return netip.PrefixFrom(a, p.Bits()).Masked(), true
}
