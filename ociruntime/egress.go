package ociruntime

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/moat-sandbox/moat/egress"
	"github.com/moat-sandbox/moat/tier"
)

// Annotations that give a container Moat's network instead of the
// engine's. Annotations come from the engine's users (a pod's author,
// docker run --annotation), so each is checked against the operator's
// policy (EgressPolicy) and can only narrow what the container reaches.
const (
	// AnnotationEgress is "none" (the container's own network namespace,
	// loopback only) or a comma-separated allowlist in the manifest's
	// network.allow syntax ("pypi.org", "*.pythonhosted.org:443"): the
	// container's own network namespace, whose only way out is Moat's
	// egress proxy (HTTP_PROXY and friends point at it), which lets
	// through only those destinations and logs every attempt.
	AnnotationEgress = "moat.sandbox/egress"
	// AnnotationEgressAddresses is a comma-separated list of IP
	// addresses or prefixes the allowlisted names may resolve to even
	// though they are private or reserved (an in-cluster service), as the
	// manifest's network.allow_addresses; each must be inside the
	// policy's egress.addresses.
	AnnotationEgressAddresses = "moat.sandbox/egress-addresses"
	// annotationContainerType is containerd's CRI annotation naming a
	// pod's pause container ("sandbox"), which does no networking: the
	// pod's annotations reach it too, and it is left on the pod's network.
	annotationContainerType = "io.kubernetes.cri.container-type"
)

// EgressPolicy is the operator's say over the egress annotations.
type EgressPolicy struct {
	// Default applies to a container without AnnotationEgress: "" (the
	// engine's network, as without Moat), "none", or an allowlist in the
	// annotation's syntax.
	Default string `yaml:"default"`
	// Ceiling, when not empty, is the allowlist an annotation must stay
	// inside: each of its rules covered by one of these.
	Ceiling []string `yaml:"ceiling"`
	// Addresses are the prefixes AnnotationEgressAddresses may name;
	// empty: none (a container's proxy refuses private and reserved
	// addresses).
	Addresses []string `yaml:"addresses"`
}

// Egress is a container's network through Moat: its own network
// namespace (never the pod's), loopback only, and Moat's egress proxy
// to the Allow destinations when there are any.
type Egress struct {
	Allow     []string `json:"allow,omitempty"`     // normalised rules
	Addresses []string `json:"addresses,omitempty"` // prefixes
}

// Proxied says whether the container has a proxy (an allowlist).
func (e *Egress) Proxied() bool { return e != nil && len(e.Allow) > 0 }

// Policy returns the proxy's policy for e.
func (e *Egress) Policy() (egress.Policy, error) {
	var pol egress.Policy
	for _, s := range e.Allow {
		r, err := egress.ParseRule(s)
		if err != nil {
			return pol, err
		}
		pol.Allow = append(pol.Allow, r)
	}
	for _, s := range e.Addresses {
		p, err := egress.ParsePrefix(s)
		if err != nil {
			return pol, err
		}
		pol.AllowAddresses = append(pol.AllowAddresses, p)
	}
	return pol, nil
}

// proxyEnv points the program's HTTP clients at the in-container end of
// the proxy, as a Moat run's.
func proxyEnv() []string {
	url := "http://127.0.0.1:" + strconv.Itoa(tier.EgressPort)
	var env []string
	for _, k := range []string{"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"} {
		env = append(env, k+"="+url)
	}
	return append(env, "NO_PROXY=", "no_proxy=")
}

// mapEgress reads the egress annotations (or the policy's default) into
// c.Egress. It refuses what is malformed or outside the policy, naming the
// annotation, the value and the fix.
func mapEgress(c *Container, ann map[string]string, pol *Policy) error {
	value, set := ann[AnnotationEgress]
	field := "annotations[" + strconv.Quote(AnnotationEgress) + "]"
	if !set {
		value = pol.Egress.Default
		field = "the runtime policy's egress.default"
	}
	addrs, addrsSet := ann[AnnotationEgressAddresses]
	if value == "" && !set {
		if addrsSet {
			return refuse("annotations["+strconv.Quote(AnnotationEgressAddresses)+"]", strconv.Quote(addrs), "it only widens an allowlist; add "+AnnotationEgress+" with the destinations")
		}
		return nil
	}
	if ann[annotationContainerType] == "sandbox" {
		// The pause container holds the pod's network namespace for the
		// others; it makes no connection of its own.
		return nil
	}
	e := &Egress{}
	value = strings.TrimSpace(value)
	if value == "" {
		return refuse(field, `""`, `give "none" or a comma-separated allowlist such as "pypi.org,*.pythonhosted.org:443"`)
	}
	if value != "none" {
		var ceiling []egress.Rule
		for _, s := range pol.Egress.Ceiling {
			r, err := egress.ParseRule(s)
			if err != nil {
				return refuse("the runtime policy's egress.ceiling", strconv.Quote(s), err.Error())
			}
			ceiling = append(ceiling, r)
		}
		for _, s := range strings.Split(value, ",") {
			s = strings.TrimSpace(s)
			r, err := egress.ParseRule(s)
			if err != nil {
				return refuse(field, strconv.Quote(s), err.Error())
			}
			if len(ceiling) > 0 && !slices.ContainsFunc(ceiling, func(c egress.Rule) bool { return c.Covers(r) }) {
				return refuse(field, strconv.Quote(s), fmt.Sprintf("outside the runtime policy's egress.ceiling %v; ask the operator to widen it, or remove the destination", pol.Egress.Ceiling))
			}
			if !slices.Contains(e.Allow, r.String()) {
				e.Allow = append(e.Allow, r.String())
			}
		}
	}
	if addrsSet {
		afield := "annotations[" + strconv.Quote(AnnotationEgressAddresses) + "]"
		if !e.Proxied() {
			return refuse(afield, strconv.Quote(addrs), "it only widens an allowlist, and "+AnnotationEgress+" is none")
		}
		var allowed []netip.Prefix
		for _, s := range pol.Egress.Addresses {
			p, err := egress.ParsePrefix(s)
			if err != nil {
				return refuse("the runtime policy's egress.addresses", strconv.Quote(s), err.Error())
			}
			allowed = append(allowed, p)
		}
		for _, s := range strings.Split(addrs, ",") {
			s = strings.TrimSpace(s)
			p, err := egress.ParsePrefix(s)
			if err != nil {
				return refuse(afield, strconv.Quote(s), err.Error())
			}
			if !slices.ContainsFunc(allowed, func(a netip.Prefix) bool { return a.Bits() <= p.Bits() && a.Contains(p.Addr()) }) {
				return refuse(afield, strconv.Quote(s), fmt.Sprintf("private and reserved addresses are refused unless inside the runtime policy's egress.addresses %v; ask the operator to add it, or remove it", pol.Egress.Addresses))
			}
			e.Addresses = append(e.Addresses, p.String())
		}
	}
	c.Egress = e
	// Never the pod's network: the container's own namespace, in which
	// nothing but loopback (and the proxy's end on it) exists.
	if p, ok := c.Join["network"]; ok {
		c.Notes = append(c.Notes, fmt.Sprintf("network namespace %s not joined: %s gives the container its own, whose only way out is Moat's egress proxy", p, AnnotationEgress))
		delete(c.Join, "network")
	}
	if e.Proxied() {
		c.Env = withProxyEnv(c.Env)
	}
	return nil
}

// withProxyEnv is env with the proxy variables pointing at the
// in-container end of the proxy; the spec's own values of them would lead
// clients elsewhere (getenv takes the first), so they are replaced.
func withProxyEnv(env []string) []string {
	px := proxyEnv()
	keep := slices.DeleteFunc(slices.Clone(env), func(kv string) bool {
		k, _, _ := strings.Cut(kv, "=")
		return slices.ContainsFunc(px, func(p string) bool { return strings.HasPrefix(p, k+"=") })
	})
	return append(keep, px...)
}
