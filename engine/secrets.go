package engine

import (
	"fmt"
	"sort"
	"strings"

	"github.com/moat-sandbox/moat/egress"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/result"
	"github.com/moat-sandbox/moat/workspace"
)

// SecretSource gives the real value of a secret a manifest names (the
// host's secret store, secretstore.Store). Its errors must never hold the
// value.
type SecretSource interface {
	Value(name string) (string, error)
}

// secretBindings resolves the manifest's secrets into the proxy's
// bindings, each with a fresh placeholder, and returns the variables that
// give the program the placeholders. The values go to the proxy only: the
// engine keeps the placeholders (env), never the values.
func (e *Engine) secretBindings(m *manifest.Manifest) ([]egress.SecretBinding, map[string]string, error) {
	if len(m.Secrets) == 0 {
		return nil, nil, nil
	}
	if e.opts.Secrets == nil {
		return nil, nil, &manifest.FieldError{Field: "secrets[0].name", Value: m.Secrets[0].Name,
			Problem: "cannot be given a value: this moat has no secret store (the engine was started without one)"}
	}
	bindings := make([]egress.SecretBinding, 0, len(m.Secrets))
	env := make(map[string]string, len(m.Secrets))
	for i, s := range m.Secrets {
		field := fmt.Sprintf("secrets[%d].name", i)
		v, err := e.opts.Secrets.Value(s.Name)
		if err != nil {
			return nil, nil, &manifest.FieldError{Field: field, Value: s.Name, Problem: "has no usable value on this host: " + err.Error()}
		}
		ph, err := egress.NewPlaceholder(s.Name)
		if err != nil {
			return nil, nil, &manifest.FieldError{Field: field, Value: s.Name, Problem: err.Error()}
		}
		b := egress.SecretBinding{Name: s.Name, Placeholder: ph, Value: v, Header: s.Header, PathPrefix: s.PathPrefix, Query: s.Query, Body: s.Body}
		for j, h := range s.Hosts {
			r, err := egress.ParseRule(h)
			if err != nil {
				return nil, nil, &manifest.FieldError{Field: fmt.Sprintf("secrets[%d].hosts[%d]", i, j), Value: h, Problem: err.Error()}
			}
			b.Hosts = append(b.Hosts, r)
		}
		bindings = append(bindings, b)
		env[s.Env] = ph
	}
	return bindings, env, nil
}

// secretUses is the result's form of the proxy's secret uses after
// before (a session command's share; nil before for the whole run), by
// name and host.
func secretUses(now, before []egress.SecretUse) []result.SecretUse {
	type key struct{ name, host string }
	prev := map[key]int{}
	for _, u := range before {
		prev[key{u.Name, u.Host}] += u.Requests
	}
	sum := map[key]int{}
	for _, u := range now {
		sum[key{u.Name, u.Host}] += u.Requests
	}
	var out []result.SecretUse
	for k, n := range sum {
		if n -= prev[k]; n > 0 {
			out = append(out, result.SecretUse{Name: k.name, Host: k.host, Requests: n})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		return out[i].Host < out[j].Host
	})
	return out
}

// exfiltrationViolation is the run's violation for the requests the proxy
// refused because they carried a placeholder to a host its secret is not
// bound to, listed or only counted; nil when there were none.
func exfiltrationViolation(log []result.NetworkAttempt, sum *result.NetworkSummary) *result.Violation {
	n, first := 0, ""
	for _, a := range log {
		if a.Reason == egress.ReasonSecretExfiltration {
			if n == 0 {
				first = fmt.Sprintf("%s:%d", a.Host, a.Port)
			}
			n++
		}
	}
	if sum != nil {
		n += sum.OmittedReasons[egress.ReasonSecretExfiltration]
	}
	if n == 0 {
		return nil
	}
	d := fmt.Sprintf("%d request(s) carried a secret's placeholder to a host the secret is not bound to and were refused", n)
	if first != "" {
		d += " (first: " + first + ")"
	}
	return &result.Violation{Kind: result.ViolationSecretExfiltration, Detail: d}
}

// plantSecretFiles writes each placeholder a manifest asks for in a file
// (secrets[].file) into the workspace, 0600 and owned by the program, as
// inputs are written (no symlink followed, the workspace's limits
// counted). One-shot runs write them before the diff's baseline is
// taken, so they are in the diff only if the program changes them. The
// file holds the placeholder only, never the value.
func (p *prepared) plantSecretFiles(wsDir string, owner workspace.Owner, lim workspace.Limits) error {
	if len(p.secretFiles) == 0 {
		return nil
	}
	fs, err := workspace.OpenFiles(wsDir, owner, lim)
	if err != nil {
		return err
	}
	defer fs.Close()
	for path, ph := range p.secretFiles {
		if _, err := fs.WriteFile(path, strings.NewReader(ph), 0o600); err != nil {
			return fmt.Errorf("write the placeholder file %s: %w", path, err)
		}
	}
	return nil
}
