package e2b

import (
	"encoding/json"
	"maps"
	"slices"
	"strconv"
)

// E2B's network.rules (per-host transforms, and E2B Secrets, which are
// such transforms with a stored secret in a header value) ask E2B's proxy
// to SET request headers on the sandbox's behalf: the program sends no
// credential at all. Moat's secrets work the other way round: the program
// holds a per-run placeholder and sends it; the proxy only replaces it,
// only towards the secret's hosts (manifest secrets, issue 20). No rule
// field has the same meaning, so none is mapped: each is refused with the
// field it names and where Moat's equivalent lives, rather than accepted
// with a behaviour the caller did not ask for (a request without the
// header the caller expected E2B to add).

// e2bRule is one entry of network.rules[HOST], as far as the refusal
// needs to name its fields.
type e2bRule struct {
	Transform *struct {
		Headers map[string]json.RawMessage `json:"headers"`
	} `json:"transform"`
}

const secretsHint = "Moat never adds a header for the sandbox: bind the secret in a Moat manifest (secrets: name, hosts, header), whose per-run placeholder the program sends and the egress proxy replaces (Moat's own API, POST /v1/sandboxes; see README, The manifest)"

// rulesError refuses a network.rules value, naming the first field whose
// meaning Moat cannot honour.
func rulesError(raw json.RawMessage) *apiError {
	var rules map[string][]e2bRule
	if err := json.Unmarshal(raw, &rules); err != nil || len(rules) == 0 {
		return badField("network.rules", "are not supported: "+secretsHint+"; limit the hosts with network.allowOut")
	}
	// The first host, in sorted order, and its first rule: one refusal
	// names one field.
	host := slices.Sorted(maps.Keys(rules))[0]
	field := "network.rules[" + strconv.Quote(host) + "]"
	if len(rules[host]) == 0 {
		return badField(field, "is not supported: an empty rule list grants nothing in Moat; list the host in network.allowOut, and "+secretsHint)
	}
	f := field + "[0]"
	if r := rules[host][0]; r.Transform != nil && len(r.Transform.Headers) > 0 {
		name := slices.Sorted(maps.Keys(r.Transform.Headers))[0]
		return badField(f+".transform.headers."+name, "is not supported: E2B's transform sets this header on requests to %s; %s", host, secretsHint)
	}
	return badField(f, "is not supported: Moat applies no per-host transform; %s", secretsHint)
}
