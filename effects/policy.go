package effects

import (
	"bytes"
	_ "embed"
	"errors"
	"fmt"
	"path"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Decision is what a policy says of an effect or a command.
type Decision string

// Decisions, from the least to the most strict.
const (
	Allow   Decision = "allow"
	Approve Decision = "approve" // held until a person approves it
	Deny    Decision = "deny"
)

func (d Decision) rank() int {
	switch d {
	case Allow:
		return 0
	case Approve:
		return 1
	case Deny:
		return 2
	}
	return -1
}

// Stricter reports whether d is stricter than e.
func (d Decision) Stricter(e Decision) bool { return d.rank() > e.rank() }

// Rule maps effects of one kind (optionally only those whose hosts or
// paths match a pattern) to a decision.
type Rule struct {
	Kind     Kind     `json:"kind"`
	Hosts    []string `json:"hosts,omitempty"` // patterns: example.com, *.example.com
	Paths    []string `json:"paths,omitempty"` // path.Match patterns; dir/** for anything below dir
	Decision Decision `json:"decision"`
	Reason   string   `json:"reason,omitempty"`
	Line     int      `json:"line,omitempty"` // where it was written, for messages
}

// Policy maps effects to decisions. The zero value allows everything
// no rule matches... and has no rules: use DefaultPolicy or ParsePolicy.
type Policy struct {
	Default Decision `json:"default"`
	Rules   []Rule   `json:"rules"`
	// RememberApprovals is how long a person's approval of an effect
	// holds: RememberNone (the default: every held command is asked
	// again) or RememberSession (an effect identical in Kind and Detail
	// to one already approved in the same sandbox session is not asked
	// again; approval fatigue is how approval screens fail).
	RememberApprovals string `json:"remember_approvals,omitempty"`
}

// The values of Policy.RememberApprovals.
const (
	RememberNone    = "none"
	RememberSession = "session"
)

//go:embed default-policy.yaml
var defaultPolicyYAML []byte

// DefaultPolicyYAML returns the text of the policy Moat ships.
func DefaultPolicyYAML() []byte { return append([]byte(nil), defaultPolicyYAML...) }

// DefaultPolicy returns the policy Moat ships (default-policy.yaml).
func DefaultPolicy() *Policy {
	p, err := ParsePolicy(defaultPolicyYAML)
	if err != nil {
		// The embedded file is tested; this cannot happen in a build
		// that passed its tests. Fail closed rather than panic.
		return &Policy{Default: Deny}
	}
	return p
}

// Verdict is a policy's decision on a command's effects.
type Verdict struct {
	Decision Decision `json:"decision"`
	// Because are the effects that caused Decision (all effects at the
	// strictest level), with the reason of the rule that decided each.
	Because []Decided `json:"because,omitempty"`
}

// Decided is one effect with the decision a rule gave it.
type Decided struct {
	Effect   Effect   `json:"effect"`
	Decision Decision `json:"decision"`
	Reason   string   `json:"reason,omitempty"`
	RuleLine int      `json:"rule_line,omitempty"` // 0: the policy's default
}

// DecideOne returns the decision for one effect: the first rule that
// matches it, or the default.
func (p *Policy) DecideOne(e Effect) Decided {
	for _, r := range p.Rules {
		if r.matches(e) {
			return Decided{Effect: e, Decision: r.Decision, Reason: r.Reason, RuleLine: r.Line}
		}
	}
	d := p.Default
	if d == "" {
		d = Approve
	}
	return Decided{Effect: e, Decision: d, Reason: "no rule matches; the policy's default"}
}

// Decide returns the strictest decision over effects and the effects
// that caused it. No effects: Allow.
func (p *Policy) Decide(effects []Effect) Verdict {
	v := Verdict{Decision: Allow}
	for _, e := range effects {
		d := p.DecideOne(e)
		switch {
		case d.Decision.Stricter(v.Decision):
			v.Decision = d.Decision
			v.Because = []Decided{d}
		case d.Decision == v.Decision && d.Decision != Allow:
			v.Because = append(v.Because, d)
		}
	}
	return v
}

func (r Rule) matches(e Effect) bool {
	if r.Kind != e.Kind {
		return false
	}
	if len(r.Hosts) > 0 && !anyMatch(r.Hosts, e.Hosts, hostMatch) {
		return false
	}
	if len(r.Paths) > 0 && !anyMatch(r.Paths, e.Paths, pathMatch) {
		return false
	}
	return true
}

func anyMatch(patterns, values []string, match func(p, v string) bool) bool {
	for _, p := range patterns {
		for _, v := range values {
			if match(p, v) {
				return true
			}
		}
	}
	return false
}

// hostMatch: exact (case-insensitive), or *.d for d's subdomains (not d).
func hostMatch(p, h string) bool {
	p, h = strings.ToLower(p), strings.ToLower(strings.TrimSuffix(h, "."))
	if strings.HasPrefix(p, "*.") {
		return strings.HasSuffix(h, p[1:])
	}
	return p == h
}

// pathMatch: path.Match, or dir/** for dir and anything below it.
func pathMatch(p, v string) bool {
	if strings.HasSuffix(p, "/**") {
		d := strings.TrimSuffix(p, "/**")
		return v == d || strings.HasPrefix(v, d+"/")
	}
	if ok, err := path.Match(p, v); err == nil && ok {
		return true
	}
	// rm -rf /tmp/ and rm -rf /tmp name the same directory.
	if len(v) > 1 && strings.HasSuffix(v, "/") {
		ok, err := path.Match(p, strings.TrimSuffix(v, "/"))
		return err == nil && ok
	}
	return false
}

// MaxPolicyBytes bounds a policy file.
const MaxPolicyBytes = 1 << 20

// PolicyError is one problem in a policy file: where, which field, the
// value, and what to do.
type PolicyError struct {
	Line    int
	Field   string
	Value   string
	Problem string
}

func (e *PolicyError) Error() string {
	var b strings.Builder
	b.WriteString("policy")
	if e.Line > 0 {
		fmt.Fprintf(&b, " line %d", e.Line)
	}
	if e.Field != "" {
		fmt.Fprintf(&b, ": %s", e.Field)
	}
	if e.Value != "" {
		fmt.Fprintf(&b, ": %q", e.Value)
	}
	fmt.Fprintf(&b, ": %s", e.Problem)
	return b.String()
}

func kindList() string {
	s := make([]string, len(Kinds))
	for i, k := range Kinds {
		s[i] = string(k)
	}
	return strings.Join(s, ", ")
}

// ParsePolicy reads a policy file strictly: unknown fields, unknown
// kinds or decisions, bad patterns, anchors and aliases are errors that
// name the line, the field and the fix (all of them, joined).
func ParsePolicy(data []byte) (*Policy, error) {
	if len(data) > MaxPolicyBytes {
		return nil, &PolicyError{Problem: fmt.Sprintf("the file is %d bytes, more than %d; a policy is a few rules", len(data), MaxPolicyBytes)}
	}
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err != nil {
		if err.Error() == "EOF" {
			return nil, &PolicyError{Problem: "the file is empty; write at least `default: approve` (see moat analyse --default-policy)"}
		}
		return nil, &PolicyError{Problem: fmt.Sprintf("not valid YAML: %v", err)}
	}
	var second yaml.Node
	if err := dec.Decode(&second); err == nil {
		return nil, &PolicyError{Line: second.Line, Problem: "a second YAML document; a policy is one document: remove the ---"}
	}
	var errs []error
	fail := func(n *yaml.Node, field, value, problem string) {
		line := 0
		if n != nil {
			line = n.Line
		}
		errs = append(errs, &PolicyError{Line: line, Field: field, Value: value, Problem: problem})
	}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	if hasAlias(root) {
		return nil, &PolicyError{Line: root.Line, Problem: "anchors and aliases (&, *) are not accepted in a policy: write each rule out"}
	}
	if root.Kind != yaml.MappingNode {
		return nil, &PolicyError{Line: root.Line, Problem: "want a mapping with `default` and `rules`"}
	}
	p := &Policy{Default: Approve}
	seen := map[string]bool{}
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		if seen[k.Value] {
			fail(k, k.Value, "", "given twice; keep one")
			continue
		}
		seen[k.Value] = true
		switch k.Value {
		case "default":
			d, ok := decision(v)
			if !ok {
				fail(v, "default", v.Value, "not a decision; use allow, approve or deny")
				continue
			}
			p.Default = d
		case "rules":
			if v.Kind != yaml.SequenceNode {
				fail(v, "rules", v.Value, "want a list of rules (- kind: ... decision: ...)")
				continue
			}
			for j, rn := range v.Content {
				r, rerrs := parseRule(rn, fmt.Sprintf("rules[%d]", j))
				errs = append(errs, rerrs...)
				if len(rerrs) == 0 {
					p.Rules = append(p.Rules, r)
				}
			}
		case "remember_approvals":
			if v.Kind != yaml.ScalarNode || (v.Value != RememberNone && v.Value != RememberSession) {
				fail(v, "remember_approvals", v.Value, "use none (ask every time) or session (an effect approved once is not asked again in the same session)")
				continue
			}
			p.RememberApprovals = v.Value
		default:
			fail(k, k.Value, "", "unknown field; a policy has `default`, `rules` and `remember_approvals`")
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return p, nil
}

func hasAlias(n *yaml.Node) bool {
	if n.Kind == yaml.AliasNode || n.Anchor != "" {
		return true
	}
	for _, c := range n.Content {
		if hasAlias(c) {
			return true
		}
	}
	return false
}

func decision(n *yaml.Node) (Decision, bool) {
	if n.Kind != yaml.ScalarNode {
		return "", false
	}
	d := Decision(n.Value)
	return d, d.rank() >= 0
}

func parseRule(n *yaml.Node, field string) (Rule, []error) {
	var errs []error
	fail := func(at *yaml.Node, f, value, problem string) {
		errs = append(errs, &PolicyError{Line: at.Line, Field: f, Value: value, Problem: problem})
	}
	r := Rule{Line: n.Line}
	if n.Kind != yaml.MappingNode {
		fail(n, field, n.Value, "want a rule: a mapping with kind and decision")
		return r, errs
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		f := field + "." + k.Value
		if seen[k.Value] {
			fail(k, f, "", "given twice; keep one")
			continue
		}
		seen[k.Value] = true
		switch k.Value {
		case "kind":
			r.Kind = Kind(v.Value)
			if v.Kind != yaml.ScalarNode || !r.Kind.Valid() {
				fail(v, f, v.Value, "not a kind of effect; use one of: "+kindList())
			}
		case "decision":
			d, ok := decision(v)
			if !ok {
				fail(v, f, v.Value, "not a decision; use allow, approve or deny")
			}
			r.Decision = d
		case "reason":
			if v.Kind != yaml.ScalarNode {
				fail(v, f, "", "want a sentence")
			}
			r.Reason = v.Value
		case "hosts", "paths":
			if v.Kind != yaml.SequenceNode || len(v.Content) == 0 {
				fail(v, f, v.Value, "want a non-empty list of patterns, e.g. [\"*.example.com\"]")
				continue
			}
			for j, pn := range v.Content {
				pf := fmt.Sprintf("%s[%d]", f, j)
				if pn.Kind != yaml.ScalarNode || pn.Value == "" {
					fail(pn, pf, pn.Value, "want a non-empty pattern")
					continue
				}
				if k.Value == "paths" {
					if _, err := path.Match(strings.TrimSuffix(pn.Value, "/**"), ""); err != nil {
						fail(pn, pf, pn.Value, "not a valid pattern (path.Match: "+err.Error()+"); check the brackets")
						continue
					}
					r.Paths = append(r.Paths, pn.Value)
				} else {
					h := pn.Value
					if strings.ContainsAny(h, "/:@ ") || strings.Contains(strings.TrimPrefix(h, "*."), "*") {
						fail(pn, pf, h, "not a host pattern; write a host name (example.com) or *.example.com for its subdomains")
						continue
					}
					r.Hosts = append(r.Hosts, h)
				}
			}
		default:
			fail(k, f, "", "unknown field; a rule has kind, decision, hosts, paths and reason")
		}
	}
	if !seen["kind"] {
		fail(n, field+".kind", "", "missing; every rule names a kind of effect: "+kindList())
	}
	if !seen["decision"] {
		fail(n, field+".decision", "", "missing; add decision: allow, approve or deny")
	}
	return r, errs
}
