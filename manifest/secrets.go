package manifest

import (
	"fmt"
	"path"
	"strings"
	"unicode/utf8"

	"github.com/moat-sandbox/moat/egress"
)

// MaxSecrets bounds the secrets of one manifest.
const MaxSecrets = 32

// maxSecretHosts bounds the hosts of one secret.
const maxSecretHosts = 32

// maxPathPrefix bounds secrets[].path_prefix.
const maxPathPrefix = 1024

// proxyVars are set by the engine for every run with a network; a secret's
// placeholder may not take their place.
var proxyVars = []string{"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "all_proxy", "no_proxy"}

// DefaultSecretEnv is the variable a secret's placeholder goes in when the
// manifest names none: the name upper-cased, with '-' turned into '_'.
func DefaultSecretEnv(name string) string {
	return strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// validateSecrets checks the secrets section. The safer rule for hosts: a
// secret's hosts must already be granted by network.allow, so binding a
// secret never widens where the program may connect, and a reviewer reads
// every destination in one list.
func (m *Manifest) validateSecrets(errs *errorList) {
	if len(m.Secrets) == 0 {
		return
	}
	if len(m.Secrets) > MaxSecrets {
		errs.add("secrets", fmt.Sprint(len(m.Secrets), " secrets"), fmt.Sprintf("is too many; at most %d", MaxSecrets))
		return
	}
	if m.Network.Mode != "allowlist" {
		errs.add("secrets", fmt.Sprint(len(m.Secrets), " secrets"), "needs network.mode: allowlist with each secret's hosts in network.allow (a secret is only ever sent through the egress proxy)")
	}
	var allow []egress.Rule
	for _, s := range m.Network.Allow {
		if r, err := egress.ParseRule(s); err == nil {
			allow = append(allow, r)
		}
	}
	names := map[string]int{}
	envs := map[string]int{}
	files := map[string]int{}
	for i, s := range m.Secrets {
		f := func(field string) string { return fmt.Sprintf("secrets[%d].%s", i, field) }
		switch {
		case !egress.ValidSecretName(s.Name):
			errs.add(f("name"), s.Name, "is not a secret name; give 1 to 64 of a-z 0-9 _ -, starting with a letter or digit, e.g. github-token")
		case names[s.Name] > 0:
			errs.add(f("name"), s.Name, fmt.Sprintf("is also the name of secrets[%d]; bind each secret once, listing all its hosts", names[s.Name]-1))
		default:
			names[s.Name] = i + 1
		}
		m.validateSecretHosts(errs, i, s, allow)
		if s.Header != "" && !isHeaderName(s.Header) {
			errs.add(f("header"), s.Header, "is not an HTTP header name; write a name such as Authorization or X-Api-Key")
		} else if h := strings.ToLower(s.Header); h == "host" || h == "content-length" || h == "transfer-encoding" || h == "proxy-authorization" {
			errs.add(f("header"), s.Header, "is a header the proxy controls; bind the secret to the header the API reads it from, e.g. Authorization")
		}
		switch {
		case s.PathPrefix == "":
		case !strings.HasPrefix(s.PathPrefix, "/"):
			errs.add(f("path_prefix"), s.PathPrefix, `does not start with "/"; write a URL path such as /v1/`)
		case len(s.PathPrefix) > maxPathPrefix || !utf8.ValidString(s.PathPrefix) || strings.IndexFunc(s.PathPrefix, func(r rune) bool { return r <= ' ' || r == 0x7f || r == '?' || r == '#' }) >= 0:
			errs.add(f("path_prefix"), s.PathPrefix, fmt.Sprintf("is not a plain URL path of at most %d bytes (no spaces, control characters, ? or #)", maxPathPrefix))
		}
		switch {
		case !isEnvName(s.Env):
			errs.add(f("env"), s.Env, "is not a valid variable name; names match [A-Za-z_][A-Za-z0-9_]*")
		case containsString(proxyVars, s.Env):
			errs.add(f("env"), s.Env, "is set by moat to reach the egress proxy; choose another variable")
		case m.Env[s.Env] != "":
			errs.add(f("env"), s.Env, "is also set in env; remove it there or choose another variable for the placeholder")
		case envs[s.Env] > 0:
			errs.add(f("env"), s.Env, fmt.Sprintf("is also the env of secrets[%d]; give each secret its own variable", envs[s.Env]-1))
		default:
			envs[s.Env] = i + 1
		}
		m.validateSecretFile(errs, i, s.File, files)
	}
}

// validateSecretFile checks secrets[i].file: a path under /workspace as
// inputs[].dst are written, where no input lands and no other secret's
// file is.
func (m *Manifest) validateSecretFile(errs *errorList, i int, file string, files map[string]int) {
	if file == "" {
		return
	}
	field := fmt.Sprintf("secrets[%d].file", i)
	if problem := dstProblem(file); problem != "" {
		errs.add(field, file, strings.Replace(problem, `such as "task"`, `such as ".secrets/api-token"`, 1))
		return
	}
	for j, in := range m.Inputs {
		if in.Dst == file || strings.HasPrefix(file, in.Dst+"/") || strings.HasPrefix(in.Dst, file+"/") {
			errs.add(field, file, fmt.Sprintf("is where inputs[%d] (dst %q) is copied; choose a path no input uses, e.g. .secrets/%s", j, in.Dst, path.Base(file)))
			return
		}
	}
	if j := files[file]; j > 0 {
		errs.add(field, file, fmt.Sprintf("is also the file of secrets[%d]; give each secret its own file", j-1))
		return
	}
	files[file] = i + 1
}

func (m *Manifest) validateSecretHosts(errs *errorList, i int, s Secret, allow []egress.Rule) {
	field := fmt.Sprintf("secrets[%d].hosts", i)
	switch {
	case len(s.Hosts) == 0:
		errs.add(field, "", "is empty; name the hosts the secret may be sent to, e.g. hosts: [api.github.com]")
		return
	case len(s.Hosts) > maxSecretHosts:
		errs.add(field, fmt.Sprint(len(s.Hosts), " hosts"), fmt.Sprintf("is too long; at most %d", maxSecretHosts))
		return
	}
	for j, h := range s.Hosts {
		hf := fmt.Sprintf("%s[%d]", field, j)
		r, err := egress.ParseRule(h)
		if err != nil {
			errs.add(hf, h, ruleProblem(err))
			continue
		}
		covered := false
		for _, a := range allow {
			if a.Covers(r) {
				covered = true
				break
			}
		}
		if !covered && m.Network.Mode == "allowlist" {
			errs.add(hf, h, "is not granted by network.allow; add "+r.String()+" to network.allow too (a secret never widens where the program may connect)")
		}
	}
}

// isHeaderName reports whether s is an RFC 9110 token of at most 64 bytes.
func isHeaderName(s string) bool {
	if len(s) > 64 {
		return false
	}
	for _, c := range []byte(s) {
		if !(isAlnum(c) || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return s != ""
}

func containsString(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
