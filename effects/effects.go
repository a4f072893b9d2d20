// Package effects reads what a program is asked to run (shell command
// lines and exec argv) and names the effects they would have once
// composed: a fetch followed by running what was fetched, a secret read
// then encoded then sent, a file truncated, a crontab written. A Policy
// (policy.go) maps those effects to allow, approve or deny.
//
// It is advisory only and must never be mistaken for a boundary: any
// analysis of text can be evaded (a program can write its own
// interpreter), so the sandbox stays what contains a run. The analyser
// never runs, expands against the host, or looks up anything it reads:
// no environment, no file system, no user database.
package effects

import (
	"fmt"
	"sort"
	"strings"
)

// Kind is the closed set of effects the analyser names.
type Kind string

// The kinds of effect. Every Effect has exactly one of these.
const (
	// Fetch: content comes from the network (curl, wget, a python
	// urllib/requests one-liner, pip/npm install, git clone, nc).
	Fetch Kind = "fetch"
	// ExecFetched: content fetched from the network is run (curl | sh,
	// bash f after curl -o f, python -c "$(curl ...)", source of it).
	ExecFetched Kind = "exec-fetched"
	// ExecWritten: a file written earlier in the session is run
	// (chmod +x f then ./f, bash f after cat > f).
	ExecWritten Kind = "exec-written"
	// Destroy: files are destroyed (rm -rf, find -delete, find -exec rm,
	// truncation of an input, dd of=, shred, mkfs).
	Destroy Kind = "destroy"
	// SecretRead: a likely secret path is read (~/.ssh, .aws/credentials,
	// .netrc, /proc/*/environ, .env, id_rsa ...).
	SecretRead Kind = "secret-read"
	// EncodeSend: data is encoded (base64, xxd, gzip ...) and the
	// encoded form is sent by a network tool.
	EncodeSend Kind = "encode-send"
	// Persist: something is set up to run later or at login (crontab,
	// at, shell start-up files, systemd units, authorized_keys).
	Persist Kind = "persist"
	// KillInit: processes are killed wholesale or init itself (kill 1,
	// kill -9 -1, pkill, killall).
	KillInit Kind = "kill-init"
	// Opaque: what runs cannot be read in advance: the text does not
	// parse, is obfuscated, is decoded or built at run time and then
	// run, or is too large or deep to analyse.
	Opaque Kind = "opaque"
)

// Kinds lists every Kind, in the order documentation shows them.
var Kinds = []Kind{Fetch, ExecFetched, ExecWritten, Destroy, SecretRead, EncodeSend, Persist, KillInit, Opaque}

// Valid reports whether k is one of Kinds.
func (k Kind) Valid() bool {
	for _, x := range Kinds {
		if x == k {
			return true
		}
	}
	return false
}

// Effect is one effect a command (or several commands of a session,
// composed) would have.
type Effect struct {
	Kind Kind `json:"kind"`
	// Detail says it in plain words a person can judge, naming the
	// commands by their 1-based index in the session.
	Detail string `json:"detail"`
	// Commands are the 1-based indexes of the session's commands
	// involved, in increasing order: more than one for a composed effect.
	Commands []int `json:"commands"`
	// Hosts and Paths are what policy patterns match against: the hosts
	// reached, the paths read, run or destroyed (as written, ~ unexpanded).
	Hosts []string `json:"hosts,omitempty"`
	Paths []string `json:"paths,omitempty"`
}

func (e Effect) String() string {
	return fmt.Sprintf("%s: %s", e.Kind, e.Detail)
}

// Limits that keep analysis bounded on hostile input: a command is
// untrusted text, and deep nesting ($( $( ... ))) or sh -c inside sh -c
// must not make the analyser's time or stack grow without bound.
const (
	// MaxCommandBytes is the longest command text analysed; a longer
	// one is an Opaque effect.
	MaxCommandBytes = 64 << 10
	// MaxDepth bounds nested shells, substitutions, eval and functions.
	MaxDepth = 16
	// MaxSteps bounds the statements analysed per command.
	MaxSteps = 20000
	// MaxParseBytes bounds the text parsed per command, counting nested
	// sh -c, eval and here-document text each time it is parsed.
	MaxParseBytes = 1 << 20
	// MaxSessionCommands bounds how many commands a session remembers.
	MaxSessionCommands = 10000
)

// origin says where a file's or a stream's content came from.
type origin struct {
	fetched  []string // URLs or hosts it was downloaded from
	fetchCmd []int    // commands that fetched it
	written  []int    // commands that wrote it (not from the network)
	encoded  bool     // an encoding of something (base64, gzip ...)
	decoded  bool     // decoded at run time (base64 -d ...): unreadable in advance
	secrets  []string // secret paths it carries
	secCmd   []int
}

func (o origin) empty() bool {
	return len(o.fetched) == 0 && len(o.written) == 0 && !o.encoded && !o.decoded && len(o.secrets) == 0
}

func (o origin) merge(p origin) origin {
	return origin{
		fetched:  union(o.fetched, p.fetched),
		fetchCmd: unionInt(o.fetchCmd, p.fetchCmd),
		written:  unionInt(o.written, p.written),
		encoded:  o.encoded || p.encoded,
		decoded:  o.decoded || p.decoded,
		secrets:  union(o.secrets, p.secrets),
		secCmd:   unionInt(o.secCmd, p.secCmd),
	}
}

func union(a, b []string) []string {
	out := append([]string(nil), a...)
	for _, x := range b {
		found := false
		for _, y := range out {
			if x == y {
				found = true
				break
			}
		}
		if !found {
			out = append(out, x)
		}
	}
	return out
}

func unionInt(a, b []int) []int {
	out := append([]int(nil), a...)
	for _, x := range b {
		found := false
		for _, y := range out {
			if x == y {
				found = true
				break
			}
		}
		if !found {
			out = append(out, x)
		}
	}
	sort.Ints(out)
	return out
}

// Session remembers what earlier commands of one session did to files,
// so that a file fetched by command 1 and run by command 3 is one
// composed effect naming both. The zero value is not ready: use
// NewSession. A Session is not safe for concurrent use.
type Session struct {
	files map[string]origin
	n     int
}

// NewSession returns an empty session.
func NewSession() *Session {
	return &Session{files: map[string]origin{}}
}

// Commands returns how many commands the session has analysed.
func (s *Session) Commands() int { return s.n }

// Shell analyses one shell command line (as sh -c would run it) as the
// session's next command and returns its effects, composed with what
// earlier commands did.
func (s *Session) Shell(line string) (effects []Effect) {
	a := s.begin()
	defer a.recover(&effects)
	if len(line) > MaxCommandBytes {
		a.add(Opaque, fmt.Sprintf("command %d is %d bytes long, more than the %d the analyser reads", a.idx, len(line), MaxCommandBytes), nil, nil, a.idx)
		return a.finish()
	}
	a.script(line, origin{}, 0)
	return a.finish()
}

// Exec analyses one exec request's argv (no shell between: words are
// taken literally) as the session's next command.
func (s *Session) Exec(argv []string) (effects []Effect) {
	a := s.begin()
	defer a.recover(&effects)
	total := 0
	for _, w := range argv {
		total += len(w)
	}
	if total > MaxCommandBytes {
		a.add(Opaque, fmt.Sprintf("command %d is %d bytes long, more than the %d the analyser reads", a.idx, total, MaxCommandBytes), nil, nil, a.idx)
		return a.finish()
	}
	if len(argv) > 0 {
		args := make([]word, len(argv))
		for i, v := range argv {
			args[i] = word{val: v, plain: true}
		}
		a.call(args, origin{}, 0)
	}
	return a.finish()
}

// Analyse returns the effects of one shell command line on its own.
func Analyse(line string) []Effect {
	return NewSession().Shell(line)
}

// AnalyseSession analyses lines as the commands of one session and
// returns all their effects.
func AnalyseSession(lines []string) []Effect {
	s := NewSession()
	var out []Effect
	for _, l := range lines {
		out = append(out, s.Shell(l)...)
	}
	return out
}

func (s *Session) begin() *analyser {
	if s.files == nil {
		s.files = map[string]origin{}
	}
	if s.n < MaxSessionCommands {
		s.n++
	}
	return &analyser{s: s, idx: s.n, vars: map[string]word{}, funcs: map[string]any{}}
}

func (a *analyser) add(k Kind, detail string, hosts, paths []string, cmds ...int) {
	cmds = unionInt(nil, cmds)
	if len(cmds) == 0 {
		cmds = []int{a.idx}
	}
	for _, e := range a.out {
		if e.Kind == k && e.Detail == detail {
			return
		}
	}
	a.out = append(a.out, Effect{Kind: k, Detail: detail, Commands: cmds, Hosts: hosts, Paths: paths})
}

func (a *analyser) finish() []Effect {
	return a.out
}

// cmdWords names commands in plain words: "command 1", "commands 1 and 3".
func cmdWords(cmds []int) string {
	cmds = unionInt(nil, cmds)
	switch len(cmds) {
	case 0:
		return "this command"
	case 1:
		return fmt.Sprintf("command %d", cmds[0])
	}
	parts := make([]string, len(cmds))
	for i, c := range cmds {
		parts[i] = fmt.Sprint(c)
	}
	return "commands " + strings.Join(parts[:len(parts)-1], ", ") + " and " + parts[len(parts)-1]
}

// Clone returns an independent copy of the session, so that a caller
// can analyse a command on the copy and keep the result only once the
// command is allowed or approved (a denied command's writes must not
// count for later commands).
func (s *Session) Clone() *Session {
	c := &Session{files: make(map[string]origin, len(s.files)), n: s.n}
	for k, v := range s.files {
		c.files[k] = v
	}
	return c
}

// analyserFailed starts the detail of the effect a bug in the analyser
// becomes: FuzzAnalyse fails on it.
const analyserFailed = "the analyser failed on command"

// recover turns a bug of the analyser into an Opaque effect instead of a
// panic across the package boundary (a server's request must not take
// the server down): a command the analyser could not read is unreadable.
func (a *analyser) recover(effects *[]Effect) {
	if r := recover(); r != nil {
		a.add(Opaque, fmt.Sprintf("%s %d (%v): what it does was not analysed", analyserFailed, a.idx, r), nil, nil)
		*effects = a.finish()
	}
}
