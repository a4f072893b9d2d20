package e2b

import (
	"encoding/json"
	"fmt"
	"net"
	"strings"

	"github.com/moat-sandbox/moat/manifest"
)

// Internet is what "internet" means for an E2B sandbox that asks for it
// (allow_internet_access true, which e2b JS 2.x before 2.51 and the
// Python SDK send by default, or left unset, E2B's default): the
// operator's choice (moat serve --e2b-internet), never the open internet.
// The zero value is "none": such a sandbox gets no network beyond
// loopback, and the create answer says so (X-Moat-Notice).
type Internet struct {
	// Refuse answers allow_internet_access true with 400, as Moat did
	// before (--e2b-internet=refuse).
	Refuse bool
	// Allow is the allowlist such a sandbox gets: host names (with
	// Moat's "*." wildcards) and IP addresses or CIDRs, as
	// network.allowOut takes them. Empty: none.
	Allow []string
}

// NoticeHeader is the response header by which create tells an E2B client
// what network its sandbox got, when it asked for internet access and got
// less (the E2B SDKs have no field for it; curl and logs see it).
const NoticeHeader = "X-Moat-Notice"

// ParseInternet parses --e2b-internet: "none" (or empty), "refuse", or a
// comma-separated allowlist of hosts and addresses, each checked as the
// manifest checks network.allow and network.allow_addresses.
func ParseInternet(spec string) (Internet, error) {
	switch s := strings.TrimSpace(spec); s {
	case "", "none":
		return Internet{}, nil
	case "refuse":
		return Internet{Refuse: true}, nil
	}
	var in Internet
	for _, a := range strings.Split(spec, ",") {
		a = strings.TrimSpace(a)
		if a == "" {
			return Internet{}, fmt.Errorf("--e2b-internet %q: an empty entry; give none, refuse, or hosts and addresses separated by commas (pypi.org,*.npmjs.org,192.0.2.0/24)", spec)
		}
		if a == "*" || a == "0.0.0.0/0" || a == "::/0" {
			return Internet{}, fmt.Errorf("--e2b-internet %q: %q is the open internet, which Moat never grants; list the hosts E2B sandboxes may reach", spec, a)
		}
		in.Allow = append(in.Allow, a)
	}
	// The manifest's own checks, so a typo fails at startup rather than
	// in every create.
	if _, err := manifest.Parse(networkDoc(in.Allow), "--e2b-internet"); err != nil {
		return Internet{}, fmt.Errorf("--e2b-internet %q: %w", spec, err)
	}
	return in, nil
}

// String is the flag's spelling of in.
func (in Internet) String() string {
	switch {
	case in.Refuse:
		return "refuse"
	case len(in.Allow) == 0:
		return "none"
	}
	return strings.Join(in.Allow, ",")
}

// splitAllow separates addresses (IPs, CIDRs) from host names.
func splitAllow(allow []string) (hosts, addrs []string) {
	for _, a := range allow {
		if _, _, err := net.ParseCIDR(a); err == nil || net.ParseIP(a) != nil {
			addrs = append(addrs, a)
		} else {
			hosts = append(hosts, a)
		}
	}
	return hosts, addrs
}

// networkSection is the manifest's network section granting allow, or nil
// for none.
func networkSection(allow []string) map[string]any {
	if len(allow) == 0 {
		return nil
	}
	hosts, addrs := splitAllow(allow)
	n := map[string]any{"mode": "allowlist"}
	if len(hosts) > 0 {
		n["allow"] = hosts
	}
	if len(addrs) > 0 {
		n["allow_addresses"] = addrs
	}
	return n
}

// networkDoc is a manifest of the default image with allow as its
// network, for checking an allowlist.
func networkDoc(allow []string) []byte {
	data, _ := json.Marshal(map[string]any{"image": manifest.Default().Image, "network": networkSection(allow)})
	return data
}
