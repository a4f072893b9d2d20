package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/moat-sandbox/moat/effects"
	"github.com/moat-sandbox/moat/output"
)

// The approval gate of `moat run`: the command is analysed for its
// effects (package effects) before anything runs, and the operator's
// effects policy allows it, refuses it (exit 4, exitDeny), or wants a
// person: on a terminal moat asks y/N; with no terminal it refuses (exit
// 3, exitApprove) unless --approve says the caller has approved.

// effectsOff is the --effects-policy value that turns the analysis off.
const effectsOff = "off"

// loadEffectsPolicy reads --effects-policy: "" is the default policy,
// "off" none (nil).
func loadEffectsPolicy(path string) (*effects.Policy, error) {
	switch path {
	case "":
		return effects.DefaultPolicy(), nil
	case effectsOff:
		return nil, nil
	}
	data, err := readLimited(path, effects.MaxPolicyBytes)
	if err != nil {
		return nil, fmt.Errorf("--effects-policy: %w", err)
	}
	p, err := effects.ParsePolicy(data)
	if err != nil {
		return nil, fmt.Errorf("--effects-policy %s: %w", path, err)
	}
	return p, nil
}

// gateEffects decides argv's effects. terminal returns the terminal to
// ask on (nil: none), called only when a person must be asked; approved
// is --approve. It returns -1 to run, or the exit status.
func gateEffects(pol *effects.Policy, argv []string, approved bool, terminal func() io.ReadWriter, stderr io.Writer) int {
	if pol == nil || len(argv) == 0 {
		return -1
	}
	effs := effects.NewSession().Exec(argv)
	v := pol.Decide(effs)
	switch v.Decision {
	case effects.Allow:
		return -1
	case effects.Deny:
		fmt.Fprintf(stderr, "moat run: refused by the effects policy (nothing ran):\n%s", plainVerdict(v))
		return exitDeny
	}
	if approved {
		fmt.Fprintf(stderr, "moat run: approved with --approve:\n%s", plainVerdict(v))
		return -1
	}
	tty := terminal()
	if tty == nil {
		fmt.Fprintf(stderr, "moat run: the effects policy wants a person to approve this command, and there is no terminal to ask on (nothing ran):\n%s"+
			"run it on a terminal, or add --approve once you have read the effects above\n", plainVerdict(v))
		return exitApprove
	}
	fmt.Fprintf(tty, "moat run: this command needs your approval:\n%sRun it? [y/N] ", plainVerdict(v))
	line, _ := bufio.NewReader(io.LimitReader(tty, 256)).ReadString('\n')
	switch strings.ToLower(strings.TrimSpace(line)) {
	case "y", "yes":
		return -1
	}
	fmt.Fprintln(stderr, "moat run: not approved; nothing ran")
	return exitApprove
}

// plainVerdict is the effects behind a verdict in plain words, one a
// line, sanitised: command text in a detail is hostile (terminal escapes).
func plainVerdict(v effects.Verdict) string {
	var b bytes.Buffer
	for _, d := range v.Because {
		fmt.Fprintf(&b, "  - %s", d.Effect.Detail)
		if d.Reason != "" {
			fmt.Fprintf(&b, " (%s)", d.Reason)
		}
		b.WriteString("\n")
	}
	return string(output.Sanitize(b.Bytes()))
}

// openTerminal returns the controlling terminal to ask on, or nil when
// moat has none (a pipe, a CI job): /dev/tty rather than stdin, so that
// --stdin's input is the program's, not an answer.
func openTerminal() *os.File {
	if !isTerminal(os.Stderr) {
		return nil
	}
	f, err := os.OpenFile("/dev/tty", os.O_RDWR, 0)
	if err != nil {
		return nil
	}
	if !isTerminal(f) {
		f.Close()
		return nil
	}
	return f
}
