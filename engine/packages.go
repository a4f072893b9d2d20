package engine

import (
	"cmp"
	"fmt"
	"strconv"

	"github.com/moat-sandbox/moat/egress"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/pkgguard"
	"github.com/moat-sandbox/moat/result"
	"github.com/moat-sandbox/moat/tier"
)

// indexBase is the guarded index as the sandbox reaches it: the egress
// proxy's in-sandbox address.
func indexBase() string {
	return "http://127.0.0.1:" + strconv.Itoa(tier.EgressPort) + "/moat-index"
}

// startIndex serves the manifest's packages grant on the run's proxy.
func (r *egressRun) startIndex(pk manifest.Packages, spoolDir string) error {
	cfg := pkgguard.Config{Typosquat: pk.Typosquat, NewPackagesDays: pk.NewPackagesDays, Yanked: pk.Yanked}
	for _, ix := range []struct {
		eco  pkgguard.Ecosystem
		m    manifest.PackageIndex
		def  string
		into **pkgguard.Index
	}{{pkgguard.PyPI, pk.PyPI, manifest.DefaultPyPIIndex, &cfg.PyPI}, {pkgguard.NPM, pk.NPM, manifest.DefaultNPMIndex, &cfg.NPM}} {
		if len(ix.m.Allow) == 0 {
			continue
		}
		out := &pkgguard.Index{URL: cmp.Or(ix.m.Index, ix.def)}
		for i, s := range ix.m.Allow {
			rq, err := pkgguard.ParseRequirement(ix.eco, s)
			if err != nil {
				return &manifest.FieldError{Field: fmt.Sprintf("packages.%s.allow[%d]", ix.eco, i), Value: s, Problem: err.Error()}
			}
			out.Allow = append(out.Allow, rq)
		}
		*ix.into = out
	}
	g, err := pkgguard.New(cfg, pkgguard.Options{
		Transport: r.proxy.UpstreamTransport(),
		BaseURL:   indexBase(),
		SpoolDir:  spoolDir,
		Report: func(e pkgguard.Event) {
			r.proxy.LogPackage(egress.Attempt{Host: "moat-index/" + string(e.Ecosystem), Allowed: e.Allowed, Reason: e.Reason,
				Package: e.Package + cmp.Or(map[bool]string{true: "==" + e.Version}[e.Version != ""], ""), Resembles: e.Resembles})
		},
	})
	if err != nil {
		return err
	}
	r.proxy.ServeIndex(g)
	return nil
}

// indexEnv points pip and npm at the guarded index.
func indexEnv(pk manifest.Packages) map[string]string {
	env := map[string]string{}
	if len(pk.PyPI.Allow) > 0 {
		env["PIP_INDEX_URL"] = indexBase() + "/pypi/simple/"
		// Plain HTTP to the proxy on the sandbox's loopback: nothing
		// crosses a network there, and the guard verifies every file.
		env["PIP_TRUSTED_HOST"] = "127.0.0.1"
	}
	if len(pk.NPM.Allow) > 0 {
		env["npm_config_registry"] = indexBase() + "/npm/"
	}
	return env
}

// packageViolations turns the guarded index's refusals into violations:
// a typosquat, a package not allowed or a tampered file is an attempt the
// program made against its grant, not a network hiccup.
func packageViolations(net []result.NetworkAttempt) []result.Violation {
	var out []result.Violation
	for _, a := range net {
		switch {
		case a.Allowed:
		case a.Reason == egress.ReasonTyposquat:
			out = append(out, result.Violation{Kind: "package", Detail: fmt.Sprintf("%s refused as a likely typosquat of %s", a.Package, a.Resembles)})
		case a.Reason == egress.ReasonPackageNotAllowed, a.Reason == egress.ReasonHashMismatch:
			out = append(out, result.Violation{Kind: "package", Detail: fmt.Sprintf("%s refused: %s", a.Package, a.Reason)})
		}
	}
	return out
}
