package engine

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"

	"github.com/moat-sandbox/moat/egress"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/result"
	"github.com/moat-sandbox/moat/tier"
)

// egressRun is one run's egress proxy: started before the sandbox, closed
// (every connection and goroutine with it) after the program ended.
type egressRun struct {
	proxy  *egress.Proxy
	socket string
	done   chan error
}

// maxSocketPath is the longest path a Unix socket may be bound at
// (sun_path is 108 bytes with its terminating NUL).
const maxSocketPath = 107

// startEgress serves the manifest's allowlist on a Unix socket in the run's
// private directory. The sandbox reaches it only through the descriptor
// the tier hands to its init. res resolves the names the proxy looks up
// (nil: the host's resolver).
func (e *Engine) startEgress(runDir string, n manifest.Network, res egress.Resolver) (*egressRun, error) {
	return e.startEgressGuarded(runDir, n, res, nil, nil)
}

// startEgressGuarded is startEgress with the run's secret bindings, which
// the proxy puts into requests to their hosts, and its canaries, which it
// refuses everywhere (egress.Policy.Canaries).
func (e *Engine) startEgressGuarded(runDir string, n manifest.Network, res egress.Resolver, secrets []egress.SecretBinding, canaries []string) (*egressRun, error) {
	pol, err := egressPolicy(n)
	if err != nil {
		return nil, err
	}
	pol.Secrets = secrets
	pol.Canaries = canaries
	sock := filepath.Join(runDir, "egress.sock")
	if len(sock) > maxSocketPath {
		// The kernel's limit on a socket's name (sun_path): bind would
		// fail with a bare "invalid argument".
		return nil, fmt.Errorf("egress: the proxy's socket %s is %d bytes, more than a Unix socket's name may have (%d): Moat's home directory (MOAT_HOME or --home) is too deep; use a shorter path", sock, len(sock), maxSocketPath)
	}
	l, err := net.Listen("unix", sock)
	if err != nil {
		return nil, fmt.Errorf("egress: listen on %s: %w", sock, err)
	}
	// The run directory is private to root; the socket itself must be
	// connectable by the sandbox's unprivileged init, through its fd.
	if err := os.Chmod(sock, 0o666); err != nil {
		l.Close()
		return nil, fmt.Errorf("egress: %w", err)
	}
	r := &egressRun{proxy: egress.New(pol, egress.Options{Resolver: res, RootCAs: e.opts.UpstreamRootCAs}), socket: sock, done: make(chan error, 1)}
	go func() { r.done <- r.proxy.Serve(l) }()
	return r, nil
}

// stop closes the proxy and returns what it logged and its account of
// every attempt, with the secrets it put into requests.
func (r *egressRun) stop() ([]result.NetworkAttempt, *result.NetworkSummary, []result.SecretUse) {
	r.proxy.Close()
	<-r.done
	os.Remove(r.socket)
	s := r.proxy.Summary()
	return r.attempts(0), networkSummary(s), secretUses(s.SecretsUsed, nil)
}

// networkSummary is the result's form of the proxy's Summary.
func networkSummary(s egress.Summary) *result.NetworkSummary { return egress.ResultSummary(s) }

// attempts returns the proxy's log from entry n on.
func (r *egressRun) attempts(n int) []result.NetworkAttempt {
	all := r.proxy.Attempts()
	return egress.ResultAttempts(all[min(n, len(all)):])
}

func egressPolicy(n manifest.Network) (egress.Policy, error) {
	pol := egress.Policy{Limits: egress.Limits{
		MaxConns:       n.MaxConnections,
		ConnRate:       n.ConnectionsPerSecond,
		MaxBytesOut:    int64(n.MaxBytesOut),
		MaxBytesIn:     int64(n.MaxBytesIn),
		NamesPerSecond: n.NamesPerSecond,
	}}
	for i, s := range n.Allow {
		r, err := egress.ParseRule(s)
		if err != nil {
			return pol, &manifest.FieldError{Field: fmt.Sprintf("network.allow[%d]", i), Value: s, Problem: err.Error()}
		}
		pol.Allow = append(pol.Allow, r)
	}
	for i, s := range n.AllowAddresses {
		p, err := egress.ParsePrefix(s)
		if err != nil {
			return pol, &manifest.FieldError{Field: fmt.Sprintf("network.allow_addresses[%d]", i), Value: s, Problem: err.Error()}
		}
		pol.AllowAddresses = append(pol.AllowAddresses, p)
	}
	return pol, nil
}

// proxyEnv points every common client at the in-sandbox end of the proxy.
func proxyEnv() map[string]string {
	url := "http://127.0.0.1:" + strconv.Itoa(tier.EgressPort)
	return map[string]string{
		"HTTP_PROXY": url, "HTTPS_PROXY": url, "ALL_PROXY": url,
		"http_proxy": url, "https_proxy": url, "all_proxy": url,
		"NO_PROXY": "", "no_proxy": "",
	}
}
