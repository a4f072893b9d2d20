package engine

import (
	"bytes"
	"fmt"
	"io"
	"strings"

	"github.com/moat-sandbox/moat/egress"
	"github.com/moat-sandbox/moat/output"
	"github.com/moat-sandbox/moat/result"
	"github.com/moat-sandbox/moat/workspace"
)

// The output-channel guard's place in a run (issue 21 §3): the detectors
// are output's; here they are pointed at what the run produced, and the
// verdict is written into the result.

// Bounds of the scan of the diff's files: a file is scanned up to
// maxScanFile bytes, the diff up to maxScanFiles in all. A canary past
// them is not seen (docs/THREATS.md says so).
const (
	maxScanFile  = 1 << 20
	maxScanFiles = 16 << 20
)

// withheldNotice replaces the output of a withheld run.
const withheldNotice = "[moat: output withheld: the run was flagged (a canary was seen); see violations and findings]\n"

// canaryTokens are the run's canary strings (nil without canaries).
func (p *prepared) canaryTokens() []string {
	if p.canaries == nil {
		return nil
	}
	return p.canaries.Tokens
}

// canaryEnv are the canaries' variables (nil without canaries). The
// manifest's env is layered after them: a variable it sets wins.
func (p *prepared) canaryEnv() map[string]string {
	if p.canaries == nil {
		return nil
	}
	return p.canaries.Env
}

// plantCanaries writes the run's decoy files into the workspace before
// the diff's baseline is taken, so they are not part of the diff unless
// the program changes them.
func (p *prepared) plantCanaries(wsDir string, owner workspace.Owner, lim workspace.Limits) error {
	if p.canaries == nil {
		return nil
	}
	fs, err := workspace.OpenFiles(wsDir, owner, lim)
	if err != nil {
		return err
	}
	defer fs.Close()
	for path, data := range p.canaries.Files {
		// 0600, as a real key's file is (ssh refuses others).
		if _, err := fs.WriteFile(path, bytes.NewReader(data), 0o600); err != nil {
			return fmt.Errorf("plant canary %s: %w", path, err)
		}
	}
	return nil
}

// egressCanarySeen reports whether the run's proxy saw a canary, while it
// serves or after it stopped.
func (p *prepared) egressCanarySeen() bool {
	p.egressMu.Lock()
	defer p.egressMu.Unlock()
	return p.canarySeen || (p.egress != nil && p.egress.proxy.CanarySeen())
}

// redact is the first half of the guard over a finished command: it
// removes the secrets' real values from the captured output, before the
// result's streams are taken from it (fillOutcome). report, after the
// diff, is the second half.
func (x *execution) redact() []result.Finding {
	var found []result.Finding
	found = append(found, x.stdout.Redact("stdout", x.p.redactValues)...)
	found = append(found, x.stderr.Redact("stderr", x.p.redactValues)...)
	return found
}

// report finds what looks like data on its way out in stdout, stderr and
// the diff's files, unsafe file names, and writes a canary violation
// naming where a canary was seen; it withholds the output of a flagged
// run when the manifest asks.
func (x *execution) report(res *result.Result, redacted []result.Finding, egressCanary bool) {
	tok := output.Tokens{Canaries: x.p.canaryTokens()}
	var findings []result.Finding
	findings = append(findings, redacted...)
	findings = append(findings, output.Scan(x.stdout.Bytes(), "stdout", tok)...)
	findings = append(findings, output.Scan(x.stderr.Bytes(), "stderr", tok)...)
	findings = append(findings, x.scanFiles(res.Files, tok)...)
	for _, f := range res.Files {
		for _, name := range []string{f.Path, f.Target} {
			if name != "" && output.UnsafeName(name) {
				findings = append(findings, result.Finding{Kind: output.KindFilename, Where: "files", Length: len(name), Preview: output.Display(name)})
				res.Violations = append(res.Violations, result.Violation{Kind: result.ViolationFilename,
					Detail: "a file name in the diff holds characters a terminal acts on (controls, escapes or bidi overrides): " + output.Display(name)})
			}
		}
	}
	var seen []string
	for _, f := range findings {
		if f.Kind == output.KindCanary {
			seen = append(seen, fmt.Sprintf("%s at offset %d", f.Where, f.Offset))
		}
	}
	if egressCanary {
		n, first := 0, ""
		for _, a := range res.Network {
			if !a.Allowed && a.Reason == egress.ReasonSecretExfiltration {
				if n == 0 {
					first = fmt.Sprintf("%s:%d", a.Host, a.Port)
				}
				n++
			}
		}
		w := "egress (a request, host name or body through the proxy; refused)"
		if n > 0 {
			w = fmt.Sprintf("egress (%d refused request(s), first to %s)", n, first)
		}
		seen = append(seen, w)
		findings = append(findings, result.Finding{Kind: output.KindCanaryEgress, Where: "egress"})
	}
	if len(findings) > 0 {
		res.Findings = findings
	}
	if len(seen) == 0 {
		return
	}
	if len(seen) > 8 {
		seen = append(seen[:8], fmt.Sprintf("and %d more", len(seen)-8))
	}
	res.Violations = append(res.Violations, result.Violation{Kind: result.ViolationCanary,
		Detail: "a planted decoy credential left the sandbox: seen in " + strings.Join(seen, ", ")})
	if x.m.Output.WithholdFlagged {
		// The evidence of the incident keeps what the caller is not
		// given (keepEvidence).
		full := *res
		x.unwithheld = &full
		res.Withheld = true
		for _, s := range []*result.Stream{&res.Stdout, &res.Stderr} {
			*s = result.Stream{Data: withheldNotice, Encoding: "utf-8", Bytes: s.Bytes, Truncated: s.Truncated}
		}
		res.Files = []result.FileChange{}
	}
}

// scanFiles scans the regular files the diff added or modified, bounded,
// through the workspace's safe opener (no symlink is followed, a FIFO
// does not block).
func (x *execution) scanFiles(files []result.FileChange, tok output.Tokens) []result.Finding {
	if len(files) == 0 {
		return nil
	}
	ws := x.p.sb.Workspace()
	fs, err := workspace.OpenFiles(x.wsDir, workspace.Owner{UID: ws.UID, GID: ws.GID}, workspace.Limits{})
	if err != nil {
		return nil
	}
	defer fs.Close()
	var out []result.Finding
	budget := int64(maxScanFiles)
	for _, f := range files {
		if budget <= 0 {
			break
		}
		if f.Type != "file" || f.Change == result.Deleted {
			continue
		}
		fh, _, err := fs.Open(f.Path)
		if err != nil {
			continue
		}
		data, _ := io.ReadAll(io.LimitReader(fh, min(int64(maxScanFile), budget)))
		fh.Close()
		budget -= int64(len(data))
		out = append(out, output.Scan(data, "file:"+f.Path, tok)...)
	}
	return out
}
