package e2b

import (
	"encoding/json"
	"net/http"
	"slices"

	"github.com/moat-sandbox/moat/audit"
)

// networkUpdate is the body of PUT /sandboxes/{id}/network (the SDKs'
// updateNetwork): the sandbox's whole egress configuration, a field left
// out being cleared.
type networkUpdate struct {
	AllowOut            []string        `json:"allowOut"`
	DenyOut             []string        `json:"denyOut"`
	AllowInternetAccess *bool           `json:"allow_internet_access"`
	EgressProxy         json.RawMessage `json:"egressProxy"`
	Rules               json.RawMessage `json:"rules"`
}

// allowlist is the allowlist an update asks for, by create's rules
// (translate): network.allowOut as asked, plus what this server calls
// internet (Internet) when the update asks for internet access (true, or
// left out without denying everything), never the open internet.
func (u *networkUpdate) allowlist(internet Internet) ([]string, *apiError) {
	switch {
	case isSet(u.Rules):
		return nil, rulesError(u.Rules)
	case isSet(u.EgressProxy):
		return nil, badField("egressProxy", "is not supported: a Moat sandbox reaches the network only through Moat's own egress proxy; leave it unset")
	}
	explicit := u.AllowInternetAccess != nil && *u.AllowInternetAccess
	if explicit && internet.Refuse {
		return nil, badField("allow_internet_access", "true is refused by this server (moat serve --e2b-internet=refuse): Moat grants no unrestricted internet access; list the hosts the sandbox may reach in allowOut")
	}
	denyAll := false
	for _, d := range u.DenyOut {
		if d != "0.0.0.0/0" && d != "::/0" {
			return nil, badField("denyOut", "%q is not supported: Moat denies everything not in allowOut, so only 0.0.0.0/0 may be given", truncate(d, 64))
		}
		denyAll = true
	}
	if len(u.AllowOut) > 0 && u.AllowInternetAccess != nil && !*u.AllowInternetAccess {
		return nil, badField("allowOut", "contradicts allow_internet_access false: give one or the other")
	}
	allow := slices.Clone(u.AllowOut)
	if wants := u.AllowInternetAccess == nil || *u.AllowInternetAccess; wants && !denyAll {
		for _, a := range internet.Allow {
			if !slices.Contains(allow, a) {
				allow = append(allow, a)
			}
		}
	}
	return allow, nil
}

// updateNetwork is PUT /sandboxes/{id}/network: the sandbox's allowlist
// replaced for its new connections, within the key's policy ceiling,
// audited (service.UpdateNetwork). 204 as E2B answers.
func (h *Handler) updateNetwork(w http.ResponseWriter, r *http.Request, key audit.Key) *apiError {
	var u networkUpdate
	if e := decodeOptional(r, &u); e != nil {
		return e
	}
	allow, e := u.allowlist(h.cfg.Internet)
	if e != nil {
		return e
	}
	hosts, addrs := splitAllow(allow)
	if _, err := h.svc.UpdateNetwork(r.Context(), key, r.PathValue("id"), hosts, addrs); err != nil {
		return h.fromService(err)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
