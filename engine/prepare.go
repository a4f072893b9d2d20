package engine

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"

	"github.com/moat-sandbox/moat/egress"
	"github.com/moat-sandbox/moat/image"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/output"
	"github.com/moat-sandbox/moat/result"
	"github.com/moat-sandbox/moat/tier"
)

// prepared is a sandbox with everything the engine set up around it: its
// run-directory claim (for GC), its egress proxy, its environment. Run,
// Session and the warm pools hold sandboxes in this form.
type prepared struct {
	id      string
	tier    tier.Tier
	img     *image.Image
	lim     tier.Limits
	spec    *tier.Spec
	sb      tier.Sandbox
	egress  *egressRun
	release func(clean bool)
	// leftovers: the tier could not undo its failed Prepare.
	leftovers bool
	pooled    bool

	closeOnce sync.Once
	closeErr  error

	// egressMu guards egress, network and netSummary: a session's Close
	// stops the proxy while its commands start and finish.
	egressMu    sync.Mutex
	network     []result.NetworkAttempt
	netSummary  *result.NetworkSummary
	secretsUsed []result.SecretUse

	// secretEnv holds the placeholders of the manifest's secrets, by
	// variable, for the sandbox's life (a session's commands share them).
	// The values go to the proxy, and to redactValues for the
	// output-channel guard; never into the sandbox.
	secretEnv map[string]string
	// secretFiles holds the same placeholders by workspace path, for the
	// secrets whose manifest entry names a file (plantSecretFiles).
	secretFiles map[string]string
	// redactValues are the secrets' real values, which the guard
	// removes from the captured output (guard.go).
	redactValues []output.Secret
	// canaries are the run's decoys (manifest output.canaries), nil
	// without; canarySeen is set when the proxy saw one (under egressMu).
	canaries   *output.Canaries
	canarySeen bool
}

// liveEgress is the sandbox's proxy while it serves (nil without one, or
// once stopped).
func (p *prepared) liveEgress() *egressRun {
	p.egressMu.Lock()
	defer p.egressMu.Unlock()
	return p.egress
}

// resolve picks the tier and the image of a manifest, refusing what the
// tier cannot honour.
func (e *Engine) resolve(ctx context.Context, m *manifest.Manifest, session bool) (tier.Tier, *image.Image, error) {
	t, err := e.Tier(m.Tier)
	if err != nil {
		return nil, nil, err
	}
	caps := t.Capabilities()
	if m.Network.Mode == "allowlist" && !caps.NetworkEgress {
		return nil, nil, &manifest.FieldError{Field: "network.mode", Value: "allowlist", Problem: "is not supported by the " + t.Name() + " tier"}
	}
	if session && !caps.Sessions {
		return nil, nil, &manifest.FieldError{Field: "tier", Value: t.Name(), Problem: "cannot run sandboxes with sessions (many commands); use one-shot runs"}
	}
	img, err := e.image(ctx, m.Image)
	if errors.Is(err, image.ErrUnknown) {
		return nil, nil, &manifest.FieldError{Field: "image", Value: m.Image, Problem: fmt.Sprintf(
			"is an unknown image: this host has or can build %s; import or build it first (`moat image list` shows the store)",
			strings.Join(e.images.Names(), ", "))}
	}
	if err != nil {
		return nil, nil, err
	}
	return t, img, nil
}

// prepare builds a new sandbox for m: claim, egress (resolving with res,
// nil for the host's resolver), tier Prepare. On error nothing is left, or,
// when the tier could not undo its failed Prepare (tier.ErrLeftovers), the
// run's directory stays for GC.
func (e *Engine) prepare(ctx context.Context, t tier.Tier, img *image.Image, m *manifest.Manifest, session bool, res egress.Resolver) (_ *prepared, err error) {
	id := newID()
	claimed, err := e.claim(id)
	if err != nil {
		return nil, err
	}
	// The sandbox keeps its image's build from `moat image rm` and `gc`
	// until it is destroyed (image.Store.Use).
	unuse, err := e.images.Use(ctx, img)
	if err != nil {
		claimed(true)
		return nil, err
	}
	release := func(clean bool) {
		claimed(clean)
		unuse()
	}
	p := &prepared{id: id, tier: t, img: img, lim: limits(m), release: release}
	defer func() {
		if err != nil {
			p.close()
		}
	}()
	p.spec = &tier.Spec{
		ID:           id,
		ImageRoot:    img.Root,
		ImageEnv:     img.Env,
		ImageDigest:  img.Digest,
		Limits:       p.lim,
		AllowMissing: m.Security.AllowMissing,
		Session:      session,
		StateDir:     filepath.Join(e.opts.Home, "runs", id),
	}
	if m.Network.Mode == "allowlist" {
		bindings, env, err := e.secretBindings(m)
		if err != nil {
			return nil, err
		}
		p.secretEnv = env
		for _, s := range m.Secrets {
			if s.File != "" {
				if p.secretFiles == nil {
					p.secretFiles = map[string]string{}
				}
				p.secretFiles[s.File] = env[s.Env]
			}
		}
		for _, b := range bindings {
			p.redactValues = append(p.redactValues, output.Secret{Name: b.Name, Value: b.Value})
		}
		if m.Output.Canaries {
			if p.canaries, err = output.NewCanaries(); err != nil {
				return nil, err
			}
		}
		if p.egress, err = e.startEgressGuarded(filepath.Join(e.opts.Home, "runs", id), m.Network, res, bindings, p.canaryTokens()); err != nil {
			return nil, err
		}
		p.spec.EgressSocket = p.egress.socket
		if m.Packages.Granted() {
			if err = p.egress.startIndex(m.Packages, filepath.Join(e.opts.Home, "runs", id)); err != nil {
				return nil, err
			}
		}
		if err = trustRunCA(t, p.spec, p.egress.proxy); err != nil {
			return nil, err
		}
	}
	if p.sb, err = t.Prepare(ctx, p.spec); err != nil {
		p.leftovers = errors.Is(err, tier.ErrLeftovers)
		return nil, fmt.Errorf("prepare sandbox: %w", err)
	}
	return p, nil
}

// env is the program's environment in this sandbox.
func (p *prepared) env(m *manifest.Manifest, extra map[string]string) []string {
	if p.egress != nil {
		// The proxy's variables win over the manifest's: there is no
		// other way out to configure. The manifest refuses a secret's
		// variable that is also in env or a proxy variable.
		return environment(p.img.Env, p.canaryEnv(), m.Env, extra, p.secretEnv, proxyEnv(), indexEnv(m.Packages), trustEnv(p.spec))
	}
	return environment(p.img.Env, p.canaryEnv(), m.Env, extra)
}

// stopEgress closes the proxy (and every connection through it) and keeps
// its log and summary (nil without a proxy).
func (p *prepared) stopEgress() ([]result.NetworkAttempt, *result.NetworkSummary) {
	log, sum, _ := p.stopEgressSecrets()
	return log, sum
}

// stopEgressSecrets is stopEgress with the secrets the proxy put into
// requests.
func (p *prepared) stopEgressSecrets() ([]result.NetworkAttempt, *result.NetworkSummary, []result.SecretUse) {
	p.egressMu.Lock()
	defer p.egressMu.Unlock()
	if p.egress != nil {
		p.canarySeen = p.egress.proxy.CanarySeen()
		p.network, p.netSummary, p.secretsUsed = p.egress.stop()
		p.egress = nil
	}
	if p.network == nil {
		return []result.NetworkAttempt{}, p.netSummary, p.secretsUsed
	}
	return p.network, p.netSummary, p.secretsUsed
}

// close destroys the sandbox and releases everything around it.
func (p *prepared) close() error {
	p.closeOnce.Do(func() {
		var errs []error
		if p.sb != nil {
			if err := p.sb.Destroy(); err != nil {
				errs = append(errs, fmt.Errorf("destroy sandbox %s: %w", p.id, err))
			}
		}
		p.stopEgress()
		if p.release != nil {
			p.release(len(errs) == 0 && !p.leftovers)
		}
		p.closeErr = errors.Join(errs...)
	})
	return p.closeErr
}
