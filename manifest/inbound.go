package manifest

import (
	"fmt"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// PortRange is one entry of network.inbound: a TCP port inside the
// sandbox ("8000", or 8000 in YAML and JSON) or an inclusive range
// ("8000-8100", "1-65535" for every port). It is kept as the text it
// normalises to, so that 8000 and "8000" have one digest.
type PortRange string

// maxInbound bounds network.inbound.
const maxInbound = 64

// UnmarshalYAML takes an integer or a string; Validate checks the value.
func (p *PortRange) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode || (n.ShortTag() != "!!int" && n.ShortTag() != "!!str") {
		return &FieldError{Value: n.Value, Problem: "is not a port (8000) or a range of ports (\"8000-8100\")"}
	}
	*p = PortRange(strings.TrimSpace(n.Value))
	return nil
}

// Bounds returns the first and last port of p, or an error that says why
// p is not a port or a range of ports.
func (p PortRange) Bounds() (first, last int, err error) {
	lo, hi, isRange := strings.Cut(string(p), "-")
	first, err = parsePort(lo)
	if err != nil {
		return 0, 0, err
	}
	last = first
	if isRange {
		if last, err = parsePort(hi); err != nil {
			return 0, 0, err
		}
		if last < first {
			return 0, 0, fmt.Errorf("is a range whose last port %d is below its first %d", last, first)
		}
	}
	return first, last, nil
}

// Contains reports whether port is in p (false for an invalid p).
func (p PortRange) Contains(port int) bool {
	first, last, err := p.Bounds()
	return err == nil && first <= port && port <= last
}

func parsePort(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > 65535 || strings.HasPrefix(s, "+") || (len(s) > 1 && s[0] == '0') {
		return 0, fmt.Errorf("is not a TCP port (1-65535) or a range of them such as \"8000-8100\"")
	}
	return n, nil
}

// InboundAllows reports whether network.inbound grants connections from
// the host to port inside the sandbox.
func (n Network) InboundAllows(port int) bool {
	for _, p := range n.Inbound {
		if p.Contains(port) {
			return true
		}
	}
	return false
}

// validateInbound checks network.inbound. It is independent of
// network.mode: inbound connections come from the host through Moat, not
// through the sandbox's egress.
func (m *Manifest) validateInbound(errs *errorList) {
	in := m.Network.Inbound
	if len(in) > maxInbound {
		errs.add("network.inbound", fmt.Sprint(len(in), " entries"), fmt.Sprintf("is too long; at most %d entries (use a range such as \"8000-8100\")", maxInbound))
		return
	}
	for i, p := range in {
		if _, _, err := p.Bounds(); err != nil {
			errs.add(fmt.Sprintf("network.inbound[%d]", i), string(p), err.Error())
		}
	}
}

// inboundPorts is the number of ports network.inbound grants (a port in
// two entries counts twice), for Widenings.
func (n Network) inboundPorts() int {
	total := 0
	for _, p := range n.Inbound {
		if first, last, err := p.Bounds(); err == nil {
			total += last - first + 1
		}
	}
	return total
}
