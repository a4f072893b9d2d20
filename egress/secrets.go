package egress

// Secrets outside the sandbox (issue 20 §1): the sandbox holds only a
// per-run placeholder; the proxy puts the real value into requests to the
// hosts the secret is bound to, and nowhere else. This file is the
// contract between the host side (manifest, secret store, engine) and the
// proxy; the mechanism lives in the proxy.

// ReasonSecretExfiltration is the Attempt.Reason of a request refused
// because it carried a secret's placeholder (in any form the proxy
// recognises) to a host the secret is not bound to.
const ReasonSecretExfiltration = "secret-exfiltration"

// SecretBinding is one secret a run may use. Value is the real secret:
// it is never logged, never put in an Attempt, a Summary or an error.
type SecretBinding struct {
	// Name is the secret's name (manifest secrets[].name).
	Name string
	// Placeholder is what the sandbox holds instead of Value: random,
	// unique per run, recognisable (NewPlaceholder).
	Placeholder string
	// Value is the real secret, from the host.
	Value string
	// Hosts are where the secret may be sent (manifest rules, as
	// network.allow). The proxy terminates TLS for these hosts only.
	Hosts []Rule
	// Header, when set, is the only request header the placeholder is
	// replaced in (e.g. "Authorization"); empty: any header.
	Header string
	// PathPrefix, when set, limits the replacement to requests whose
	// URL path starts with it.
	PathPrefix string
	// Query and Body also replace the placeholder in the query string and
	// the body of requests to the bound hosts.
	Query, Body bool
}

// SecretUse says that a secret was put into requests to one host.
type SecretUse struct {
	Name     string `json:"name"`
	Host     string `json:"host"`
	Requests int    `json:"requests"`
}
