package effects

import (
	"fmt"
	"net/url"
	"path"
	"regexp"
	"strings"

	"mvdan.cc/sh/v3/syntax"
)

// wrappers run the rest of their arguments as a command.
var wrappers = map[string]bool{
	"sudo": true, "doas": true, "nohup": true, "nice": true, "exec": true, "command": true,
	"builtin": true, "time": true, "stdbuf": true, "setsid": true, "chroot": false, "ionice": true,
	"strace": true, "ltrace": true, "unbuffer": true, "busybox": true, "env": true, "timeout": true,
}

var shells = map[string]bool{"sh": true, "bash": true, "dash": true, "zsh": true, "ksh": true, "ash": true, "mksh": true, "fish": true}

var interpreters = map[string]bool{"python": true, "python2": true, "python3": true, "perl": true, "ruby": true, "node": true, "php": true, "lua": true, "Rscript": true, "deno": true, "bun": true}

var encoders = map[string]bool{"base64": true, "base32": true, "basenc": true, "xxd": true, "od": true, "hexdump": true, "gzip": true, "bzip2": true, "xz": true, "zstd": true, "uuencode": true, "openssl": true, "gpg": true, "rev": true}

// sensitive names are worth an obfuscation effect when spelled in pieces.
var sensitive = map[string]bool{"curl": true, "wget": true, "nc": true, "ncat": true, "rm": true, "bash": true, "sh": true, "eval": true, "python": true, "python3": true, "chmod": true, "crontab": true, "base64": true, "kill": true, "dd": true}

// name is the command a word names: its base name.
func name(w word) string {
	return path.Base(w.val)
}

// call analyses one simple command with its words resolved.
func (a *analyser) call(args []word, in origin, depth int) origin {
	// Unwrap sudo, env A=b, timeout 5, nohup ...
	for len(args) > 0 {
		n := name(args[0])
		if !wrappers[n] {
			break
		}
		args = args[1:]
		for len(args) > 0 && (strings.HasPrefix(args[0].val, "-") || strings.Contains(args[0].val, "=") || (n == "timeout" && isNumberish(args[0].val))) {
			args = args[1:]
		}
	}
	if len(args) == 0 {
		return in
	}
	cmd := args[0]
	n := name(cmd)
	if !cmd.plain {
		if !cmd.flow.empty() {
			a.runContent(cmd.flow, "runs a command whose name comes from", nil)
		}
		a.add(Opaque, fmt.Sprintf("command %d runs a program whose name (%s) is computed at run time", a.idx, cmd.val), nil, nil)
		return in
	}
	if cmd.split && sensitive[n] {
		a.add(Opaque, fmt.Sprintf("command %d spells %s in quoted or escaped pieces, a common way to hide it from reviewers", a.idx, n), nil, nil)
	}
	rest := args[1:]
	// Secret paths named as arguments of commands that read files.
	if readsArgs(n) {
		for _, w := range rest {
			if !strings.HasPrefix(w.val, "-") || strings.Contains(w.val, "=") {
				v := w.val
				if i := strings.Index(v, "="); i >= 0 && strings.HasPrefix(v, "-") {
					v = v[i+1:]
				}
				v = strings.TrimPrefix(v, "@")
				a.reads = append(a.reads, a.key(v))
				in = in.merge(a.readArg(v))
			}
		}
	}
	// Content of arguments (a substitution that fetched) flows on.
	var argFlow origin
	for _, w := range rest {
		argFlow = argFlow.merge(w.flow)
	}
	if body, ok := a.funcs[n]; ok {
		delete(a.funcs, n) // no recursion: each function analysed once per line
		defer func() { a.funcs[n] = body }()
		return a.stmt(toStmt(body), in, depth+1)
	}
	switch {
	case n == "curl" || n == "wget" || n == "aria2c" || n == "fetch" || n == "http" || n == "https" || n == "httpie":
		return a.fetchTool(n, rest, in)
	case n == "nc" || n == "ncat" || n == "netcat" || n == "socat" || n == "telnet" || n == "ssh" || n == "scp" || n == "rsync" || n == "ftp" || n == "sftp" || n == "dig" || n == "nslookup" || n == "host":
		return a.netTool(n, rest, in)
	case n == "git":
		return a.git(rest, in)
	case n == "pip" || n == "pip3" || n == "npm" || n == "yarn" || n == "pnpm" || n == "gem" || n == "cargo" || n == "go" || n == "apt" || n == "apt-get" || n == "apk" || n == "uv" || n == "poetry" || n == "conda" || n == "npx":
		return a.packages(n, rest, in)
	case shells[n]:
		return a.shell(n, rest, in, depth)
	case interpreters[n] || strings.HasPrefix(n, "python3."):
		return a.interpreter(n, rest, in, depth)
	case n == "eval":
		return a.eval(rest, depth)
	case n == "source" || n == ".":
		if len(rest) > 0 {
			o, _ := a.fileOrigin(rest[0].val)
			a.runContent(o.merge(rest[0].flow), "reads into the shell and runs "+rest[0].val, []string{rest[0].val})
			if !rest[0].plain {
				a.add(Opaque, fmt.Sprintf("command %d sources a file whose name (%s) is computed at run time", a.idx, rest[0].val), nil, nil)
			}
		}
		return origin{}
	case n == "xargs":
		return a.xargs(rest, in, depth)
	case n == "find":
		return a.find(rest, in, depth)
	case n == "rm" || n == "unlink" || n == "rmdir":
		a.rm(n, rest, in)
		return origin{}
	case n == "shred" || n == "wipe" || n == "srm" || strings.HasPrefix(n, "mkfs") || n == "wipefs" || n == "blkdiscard":
		a.add(Destroy, fmt.Sprintf("command %d runs %s %s, which destroys data beyond recovery", a.idx, n, joinVals(rest)), nil, vals(rest))
		return origin{}
	case n == "dd":
		for _, w := range rest {
			if strings.HasPrefix(w.val, "of=") {
				a.add(Destroy, fmt.Sprintf("command %d overwrites %s with dd", a.idx, w.val[3:]), nil, []string{w.val[3:]})
				a.writeFile(w.val[3:], in, false)
			}
			if strings.HasPrefix(w.val, "if=") {
				in = in.merge(a.readArg(w.val[3:]))
			}
		}
		return in
	case n == "truncate":
		for i, w := range rest {
			if (w.val == "-s" || w.val == "--size") && i+1 < len(rest) && (rest[i+1].val == "0" || strings.HasPrefix(rest[i+1].val, "-")) ||
				w.val == "-s0" || w.val == "--size=0" {
				a.add(Destroy, fmt.Sprintf("command %d truncates %s", a.idx, joinVals(nonFlags(rest))), nil, vals(nonFlags(rest)))
				break
			}
		}
		return origin{}
	case n == "crontab":
		for _, w := range rest {
			if w.val == "-l" {
				return origin{}
			}
		}
		a.add(Persist, fmt.Sprintf("command %d installs a crontab: commands that run later, on a schedule", a.idx), nil, nil)
		return origin{}
	case n == "at" || n == "batch":
		for _, w := range rest {
			if w.val == "-l" {
				return origin{}
			}
		}
		a.add(Persist, fmt.Sprintf("command %d schedules commands with %s to run later", a.idx, n), nil, nil)
		return origin{}
	case n == "systemctl":
		for _, w := range rest {
			if w.val == "enable" || w.val == "link" || w.val == "edit" || w.val == "daemon-reload" {
				a.add(Persist, fmt.Sprintf("command %d runs systemctl %s: a service that starts again later", a.idx, w.val), nil, nil)
				break
			}
		}
		return origin{}
	case n == "kill" || n == "pkill" || n == "killall" || n == "killall5":
		a.kill(n, rest)
		return origin{}
	case n == "tee" || n == "cp" || n == "mv" || n == "install" || n == "ln" || n == "sed" || n == "rsync":
		return a.copyLike(n, rest, in)
	case n == "chmod":
		return origin{}
	case n == "cd" || n == "pushd":
		if len(rest) > 0 && rest[0].plain {
			a.cwd = a.key(rest[0].val)
		}
		return origin{}
	case n == "tar" || n == "zip" || n == "7z":
		return a.archive(n, rest, in.merge(argFlow))
	case encoders[n] || n == "gunzip" || n == "zcat" || n == "bunzip2" || n == "unxz":
		dec := n == "gunzip" || n == "zcat" || n == "bunzip2" || n == "unxz"
		for _, w := range rest {
			if w.val == "-d" || w.val == "--decode" || w.val == "-D" || w.val == "-r" || w.val == "-x" || w.val == "xf" || w.val == "-xf" || w.val == "-xzf" || w.val == "xzf" {
				dec = true
			}
		}
		out := in.merge(argFlow)
		if n == "rev" {
			return out
		}
		if dec {
			out.decoded = true
			out.encoded = false
		} else {
			out.encoded = true
		}
		return out
	}
	// A path run directly (./f, /tmp/f) or a bare name the session wrote.
	if strings.Contains(cmd.val, "/") {
		if o, ok := a.fileOrigin(cmd.val); ok {
			a.runContent(o, "runs "+cmd.val, []string{cmd.val})
		}
	}
	return in.merge(argFlow)
}

func toStmt(x any) *syntax.Stmt {
	s, _ := x.(*syntax.Stmt)
	return s
}

func isNumberish(s string) bool {
	return s != "" && strings.Trim(s, "0123456789.smhd") == ""
}

func vals(ws []word) []string {
	out := make([]string, 0, len(ws))
	for _, w := range ws {
		out = append(out, w.val)
	}
	return out
}

func joinVals(ws []word) string { return strings.Join(vals(ws), " ") }

func nonFlags(ws []word) []word {
	var out []word
	skip := false
	for _, w := range ws {
		if skip {
			skip = false
			continue
		}
		if w.val == "-s" || w.val == "--size" {
			skip = true
			continue
		}
		if !strings.HasPrefix(w.val, "-") {
			out = append(out, w)
		}
	}
	return out
}

// readsArgs says whether a command reads the files its arguments name
// (so a secret path among them is read), as opposed to listing,
// creating or deleting them.
func readsArgs(n string) bool {
	switch n {
	case "ls", "mkdir", "touch", "rm", "rmdir", "chmod", "chown", "stat", "test", "[", "echo", "printf", "cd", "which", "file", "shred", "unlink", "truncate", "kill", "crontab":
		return false
	}
	return true
}

func (a *analyser) readArg(v string) origin {
	// Longer than PATH_MAX: not a path (and not worth a regexp scan).
	if v == "" || len(v) > 4096 {
		return origin{}
	}
	o, _ := a.fileOrigin(v)
	if isSecretPath(v) {
		return o.merge(a.readFile(v, "reads"))
	}
	return o
}

// runContent adds the effect of running content of origin o.
func (a *analyser) runContent(o origin, what string, paths []string) {
	switch {
	case o.decoded:
		a.add(Opaque, fmt.Sprintf("command %d %s content decoded at run time (base64 -d, gunzip ...), which cannot be read in advance", a.idx, what), nil, paths)
		fallthrough
	case len(o.fetched) > 0:
		if len(o.fetched) > 0 {
			by := unionInt(o.fetchCmd, []int{a.idx})
			a.add(ExecFetched, fmt.Sprintf("command %d %s, which %s downloaded from %s", a.idx, what, cmdWords(o.fetchCmd), strings.Join(o.fetched, ", ")), hostsOf(o.fetched), paths, by...)
		}
	case len(o.written) > 0:
		a.add(ExecWritten, fmt.Sprintf("command %d %s, which %s wrote", a.idx, what, cmdWords(o.written)), nil, paths, unionInt(o.written, []int{a.idx})...)
	}
}

var urlRe = regexp.MustCompile(`(?i)\b((?:https?|ftp|git|ssh|s3)://[^\s'"<>()]+)`)

func hostsOf(urls []string) []string {
	var out []string
	for _, u := range urls {
		out = union(out, []string{hostOf(u)})
	}
	return out
}

func hostOf(u string) string {
	if !strings.Contains(u, "://") {
		u = "http://" + u
	}
	p, err := url.Parse(u)
	if err != nil || p.Hostname() == "" {
		return u
	}
	return strings.ToLower(p.Hostname())
}

// target picks the URL (or host) among a network tool's arguments.
func target(rest []word) string {
	for _, w := range rest {
		if m := urlRe.FindString(w.val); m != "" {
			return m
		}
	}
	for _, w := range rest {
		v := w.val
		if !strings.HasPrefix(v, "-") && strings.Contains(v, ".") && !strings.Contains(v, "/") && !strings.HasPrefix(v, "@") {
			return v
		}
	}
	for _, w := range rest {
		if !strings.HasPrefix(w.val, "-") {
			return w.val
		}
	}
	return "an unnamed address"
}

func (a *analyser) fetched(src string) origin {
	return origin{fetched: []string{src}, fetchCmd: []int{a.idx}}
}

func (a *analyser) fetchTool(n string, rest []word, in origin) origin {
	src := target(rest)
	host := hostOf(src)
	a.add(Fetch, fmt.Sprintf("command %d downloads %s with %s", a.idx, src, n), []string{host}, nil)
	out := a.fetched(src)
	var sent origin
	sending := false
	toStdout := n == "curl" || n == "http" || n == "https"
	for i := 0; i < len(rest); i++ {
		v := rest[i].val
		next := ""
		if i+1 < len(rest) {
			next = rest[i+1].val
		}
		switch {
		case v == "-o" || v == "--output" || (n == "wget" && v == "-O") || v == "--output-document":
			if next == "-" {
				toStdout = true
			} else if next != "" {
				a.writeFile(next, out, false)
				toStdout = false
			}
			i++
		case strings.HasPrefix(v, "--output-document=") || strings.HasPrefix(v, "--output="):
			f := v[strings.Index(v, "=")+1:]
			if f == "-" {
				toStdout = true
			} else {
				a.writeFile(f, out, false)
			}
		case n == "curl" && isShortCluster(v) && strings.HasSuffix(v, "o"):
			if next != "" && next != "-" {
				a.writeFile(next, out, false)
				toStdout = false
			}
			i++
		case n == "curl" && (v == "-O" || v == "--remote-name" || isShortCluster(v) && strings.Contains(v, "O")):
			a.writeFile(path.Base(src), out, false)
			toStdout = false
		case v == "-d" || v == "--data" || v == "--data-binary" || v == "--data-raw" || v == "--data-urlencode" || v == "-F" || v == "--form" || v == "-T" || v == "--upload-file" || v == "--post-file" || v == "--body-file":
			sending = true
			d := next
			if j := strings.Index(d, "=@"); j >= 0 {
				d = d[j+1:]
			}
			if d == "@-" || d == "-" || d == "@/dev/stdin" {
				sent = sent.merge(in)
			} else if strings.HasPrefix(d, "@") || v == "-T" || v == "--upload-file" || v == "--post-file" || v == "--body-file" {
				sent = sent.merge(a.readArg(strings.TrimPrefix(d, "@")))
			}
			if i+1 < len(rest) {
				sent = sent.merge(rest[i+1].flow)
			}
			i++
		case strings.HasPrefix(v, "--post-data=") || strings.HasPrefix(v, "--data=") || strings.HasPrefix(v, "--post-file=") || strings.HasPrefix(v, "--body-file="):
			sending = true
			sent = sent.merge(rest[i].flow)
			if strings.HasPrefix(v, "--post-file=") || strings.HasPrefix(v, "--body-file=") {
				sent = sent.merge(a.readArg(v[strings.Index(v, "=")+1:]))
			}
		}
	}
	// Data carried in the URL or headers: curl https://x/?d=$(base64 f).
	for _, w := range rest {
		if !w.flow.empty() {
			sent = sent.merge(w.flow)
			sending = true
		}
	}
	if !sending && n == "wget" && !toStdout {
		// wget saves under the URL's base name by default.
		explicit := false
		for _, w := range rest {
			if w.val == "-O" || strings.HasPrefix(w.val, "--output-document") || w.val == "-qO-" || w.val == "-O-" {
				explicit = true
			}
		}
		if !explicit {
			a.writeFile(path.Base(src), out, false)
		}
	}
	for _, w := range rest {
		if w.val == "-qO-" || w.val == "-O-" || w.val == "-qO" {
			toStdout = true
		}
	}
	a.sends(n, host, sent)
	if toStdout {
		return out
	}
	return origin{}
}

// sends adds what sending data of origin o to host means.
func (a *analyser) sends(tool, host string, o origin) {
	if o.encoded {
		a.add(EncodeSend, fmt.Sprintf("command %d sends encoded data to %s with %s%s", a.idx, host, tool, secretTail(o)), []string{host}, o.secrets, unionInt(o.secCmd, []int{a.idx})...)
	} else if len(o.secrets) > 0 {
		a.add(EncodeSend, fmt.Sprintf("command %d sends %s to %s with %s", a.idx, strings.Join(o.secrets, ", "), host, tool), []string{host}, o.secrets, unionInt(o.secCmd, []int{a.idx})...)
	}
}

func secretTail(o origin) string {
	if len(o.secrets) == 0 {
		return ""
	}
	return fmt.Sprintf(" (made from %s, read by %s)", strings.Join(o.secrets, ", "), cmdWords(o.secCmd))
}

func (a *analyser) netTool(n string, rest []word, in origin) origin {
	dest := target(rest)
	if n == "scp" || n == "rsync" || n == "sftp" {
		for _, w := range rest {
			if strings.Contains(w.val, ":") && !strings.HasPrefix(w.val, "-") {
				dest = w.val
			}
		}
	}
	host := hostOf(dest)
	if i := strings.Index(host, ":"); i >= 0 {
		host = host[:i]
	}
	if at := strings.LastIndex(host, "@"); at >= 0 {
		host = host[at+1:]
	}
	a.add(Fetch, fmt.Sprintf("command %d connects to %s with %s", a.idx, dest, n), []string{host}, nil)
	sent := in
	for _, w := range rest {
		sent = sent.merge(w.flow)
		if !strings.HasPrefix(w.val, "-") && !strings.Contains(w.val, ":") {
			sent = sent.merge(a.readArg(w.val))
		}
	}
	a.sends(n, host, sent)
	return a.fetched(dest)
}

func (a *analyser) git(rest []word, in origin) origin {
	if len(rest) == 0 {
		return origin{}
	}
	sub := rest[0].val
	switch sub {
	case "clone", "fetch", "pull", "submodule":
		var pos []word
		for _, w := range rest[1:] {
			if !strings.HasPrefix(w.val, "-") {
				pos = append(pos, w)
			}
		}
		src := target(rest[1:])
		a.add(Fetch, fmt.Sprintf("command %d runs git %s from %s", a.idx, sub, src), []string{hostOf(src)}, nil)
		if sub == "clone" && len(pos) > 0 {
			dir := strings.TrimSuffix(path.Base(pos[0].val), ".git")
			if len(pos) > 1 {
				dir = pos[1].val
			}
			a.s.files[a.key(dir)] = a.fetched(src)
		}
	case "push":
		a.add(Fetch, fmt.Sprintf("command %d pushes with git to %s", a.idx, target(rest[1:])), nil, nil)
	}
	return origin{}
}

func (a *analyser) packages(n string, rest []word, in origin) origin {
	if len(rest) == 0 {
		return origin{}
	}
	sub := rest[0].val
	install := false
	switch n {
	case "pip", "pip3", "uv", "poetry", "conda":
		install = sub == "install" || sub == "add" || sub == "download" || (n == "uv" && sub == "pip")
	case "npm", "pnpm":
		install = sub == "install" || sub == "i" || sub == "ci" || sub == "add" || sub == "exec"
	case "yarn":
		install = sub == "add" || sub == "install"
	case "npx":
		install = true
	case "gem", "cargo":
		install = sub == "install"
	case "go":
		install = sub == "get" || sub == "install" || (sub == "mod" && len(rest) > 1 && rest[1].val == "download")
	case "apt", "apt-get", "apk":
		install = sub == "install" || sub == "add" || sub == "update"
	}
	if !install {
		return origin{}
	}
	var pkgs []string
	for i := 1; i < len(rest); i++ {
		v := rest[i].val
		if (v == "-r" || v == "--requirement" || v == "-c" || v == "--constraint") && i+1 < len(rest) {
			// A file that lists packages, not a package.
			pkgs = append(pkgs, "the packages listed in "+rest[i+1].val)
			i++
			continue
		}
		if !strings.HasPrefix(v, "-") {
			pkgs = append(pkgs, v)
		}
	}
	what := strings.Join(pkgs, " ")
	if what == "" {
		what = "the project's dependencies"
	}
	var hosts []string
	for _, p := range pkgs {
		if m := urlRe.FindString(p); m != "" {
			hosts = append(hosts, hostOf(m))
		}
	}
	a.add(Fetch, fmt.Sprintf("command %d installs %s with %s %s (downloads, and may run install scripts)", a.idx, what, n, sub), hosts, nil)
	return origin{}
}

func (a *analyser) shell(n string, rest []word, in origin, depth int) origin {
	for i := 0; i < len(rest); i++ {
		v := rest[i].val
		if v == "-c" || (strings.HasPrefix(v, "-") && strings.HasSuffix(v, "c") && !strings.HasPrefix(v, "--")) {
			if i+1 >= len(rest) {
				return origin{}
			}
			code := rest[i+1]
			if !code.flow.empty() {
				a.runContent(code.flow, "runs, as a "+n+" script, text", nil)
			}
			if !code.plain && code.flow.empty() {
				a.add(Opaque, fmt.Sprintf("command %d runs %s -c with text built at run time (%s)", a.idx, n, code.val), nil, nil)
			}
			if code.plain {
				return a.script(code.val, in, depth+1)
			}
			return origin{}
		}
		if v == "-s" || v == "-" {
			break
		}
		if strings.HasPrefix(v, "-") {
			continue
		}
		// sh FILE
		o, _ := a.fileOrigin(v)
		o = o.merge(rest[i].flow)
		a.runContent(o, "runs "+v+" with "+n, []string{v})
		return origin{}
	}
	// sh reading its script from stdin: curl | sh, sh <<EOF.
	if a.hdoc != nil && a.hdoc.plain {
		body := a.hdoc.val
		a.hdoc = nil
		a.runContent(in, "runs a here-document with "+n, nil)
		return a.script(body, origin{}, depth+1)
	}
	a.runContent(in, "runs with "+n+" what it reads from its input", nil)
	return origin{}
}

var pyNet = regexp.MustCompile(`\b(urllib|urlopen|requests\.|http\.client|httpx|socket\.|aiohttp|urlretrieve|fetch\(|https?\.get|XMLHttpRequest|LWP::|Net::HTTP|open-uri|file_get_contents\(['"]https?)`)
var pyExec = regexp.MustCompile(`\b(exec|eval|compile)\s*\(`)
var pyDecode = regexp.MustCompile(`b64decode|fromhex|decode\(['"]base64|zlib\.decompress|atob\(|Buffer\.from\(`)

func (a *analyser) interpreter(n string, rest []word, in origin, depth int) origin {
	for i := 0; i < len(rest); i++ {
		v := rest[i].val
		if v == "-c" || v == "-e" || v == "-E" || v == "-r" || v == "--eval" || v == "-p" {
			if i+1 >= len(rest) {
				return origin{}
			}
			code := rest[i+1]
			if !code.flow.empty() {
				a.runContent(code.flow, "runs, as "+n+" code, text", nil)
			}
			a.codeText(n, code.val)
			return in.merge(code.flow)
		}
		if v == "-m" {
			if i+1 < len(rest) && (rest[i+1].val == "pip") && i+2 < len(rest) {
				return a.packages("pip", rest[i+2:], in)
			}
			if i+1 < len(rest) && (rest[i+1].val == "http.server") {
				return origin{}
			}
			return origin{}
		}
		if strings.HasPrefix(v, "-") {
			continue
		}
		o, _ := a.fileOrigin(v)
		o = o.merge(rest[i].flow)
		a.runContent(o, "runs "+v+" with "+n, []string{v})
		return origin{}
	}
	if a.hdoc != nil && a.hdoc.plain {
		a.codeText(n, a.hdoc.val)
		a.hdoc = nil
	}
	a.runContent(in, "runs with "+n+" what it reads from its input", nil)
	return origin{}
}

// codeText looks into an interpreter's program text for network use,
// secrets and run-time decoding: a heuristic, like all of this package.
func (a *analyser) codeText(n, code string) {
	if pyNet.MatchString(code) {
		u := urlRe.FindString(code)
		if u == "" {
			u = "an address in the code"
		}
		a.add(Fetch, fmt.Sprintf("command %d runs %s code that opens network connections (%s)", a.idx, n, u), hostsOf(nonEmpty(urlRe.FindString(code))), nil)
	}
	if pyExec.MatchString(code) && (pyNet.MatchString(code) || pyDecode.MatchString(code)) {
		a.add(Opaque, fmt.Sprintf("command %d runs %s code that executes text it downloads or decodes at run time", a.idx, n), nil, nil)
		if pyNet.MatchString(code) {
			u := urlRe.FindString(code)
			a.add(ExecFetched, fmt.Sprintf("command %d runs %s code that downloads code (%s) and executes it", a.idx, n, u), hostsOf(nonEmpty(u)), nil)
		}
	}
	for _, p := range secretInText(code) {
		a.add(SecretRead, fmt.Sprintf("command %d runs %s code that names %s, a likely secret", a.idx, n, p), nil, []string{p})
	}
	if persistRe.MatchString(code) {
		a.add(Persist, fmt.Sprintf("command %d runs %s code that names a start-up file or schedule (%s)", a.idx, n, persistRe.FindString(code)), nil, nil)
	}
}

func nonEmpty(s string) []string {
	if s == "" {
		return nil
	}
	return []string{s}
}

func (a *analyser) eval(rest []word, depth int) origin {
	var b []string
	var fl origin
	plain := true
	for _, w := range rest {
		b = append(b, w.val)
		fl = fl.merge(w.flow)
		plain = plain && w.plain
	}
	if !fl.empty() {
		a.runContent(fl, "evaluates text", nil)
	}
	if !plain {
		a.add(Opaque, fmt.Sprintf("command %d evaluates text built at run time (eval %s)", a.idx, strings.Join(b, " ")), nil, nil)
		return origin{}
	}
	return a.script(strings.Join(b, " "), origin{}, depth+1)
}

func (a *analyser) xargs(rest []word, in origin, depth int) origin {
	i := 0
	for i < len(rest) && strings.HasPrefix(rest[i].val, "-") {
		v := rest[i].val
		if v == "-I" || v == "-n" || v == "-P" || v == "-d" || v == "-L" || v == "-s" || v == "-E" {
			i++
		}
		i++
	}
	var sub []word
	if i < len(rest) {
		sub = rest[i:]
	}
	if len(sub) == 0 {
		sub = []word{{val: "echo", plain: true}}
	}
	// The items read from stdin become arguments.
	cp := append([]word(nil), sub...)
	cp = append(cp, word{val: "{}", plain: true, flow: in})
	return a.call(cp, in, depth+1)
}

func (a *analyser) find(rest []word, in origin, depth int) origin {
	root := "."
	if len(rest) > 0 && !strings.HasPrefix(rest[0].val, "-") {
		root = rest[0].val
	}
	for i := 0; i < len(rest); i++ {
		v := rest[i].val
		switch v {
		case "-delete":
			a.add(Destroy, fmt.Sprintf("command %d deletes what find matches under %s", a.idx, root), nil, []string{root})
		case "-exec", "-execdir", "-ok", "-okdir":
			j := i + 1
			for j < len(rest) && rest[j].val != ";" && rest[j].val != "+" {
				j++
			}
			sub := rest[i+1 : j]
			if len(sub) > 0 {
				if n := name(sub[0]); n == "rm" || n == "shred" || n == "unlink" {
					a.add(Destroy, fmt.Sprintf("command %d deletes what find matches under %s (find %s %s)", a.idx, root, v, n), nil, []string{root})
				} else {
					a.call(sub, in, depth+1)
				}
			}
			i = j
		}
	}
	return origin{}
}

func (a *analyser) rm(n string, rest []word, in origin) {
	recursive, force := false, false
	var targets []string
	for _, w := range rest {
		v := w.val
		switch {
		case v == "--recursive" || v == "-r" || v == "-R":
			recursive = true
		case v == "--force":
			force = true
		case strings.HasPrefix(v, "-") && !strings.HasPrefix(v, "--"):
			recursive = recursive || strings.ContainsAny(v, "rR")
			force = force || strings.Contains(v, "f")
		case v == "{}" && !w.flow.empty():
			targets = append(targets, "the paths it is given")
		default:
			targets = append(targets, v)
		}
	}
	if n == "rm" && recursive {
		how := "recursively"
		if force {
			how = "recursively and without asking"
		}
		a.add(Destroy, fmt.Sprintf("command %d deletes %s %s", a.idx, strings.Join(targets, " "), how), nil, targets)
		return
	}
	for _, t := range targets {
		if isSecretPath(t) || isPersistPath(t) || t == "/" || strings.HasPrefix(t, "/etc") || strings.HasPrefix(t, "/usr") || strings.HasPrefix(t, "/bin") {
			a.add(Destroy, fmt.Sprintf("command %d deletes %s", a.idx, t), nil, []string{t})
		}
	}
}

func (a *analyser) kill(n string, rest []word) {
	if n != "kill" {
		a.add(KillInit, fmt.Sprintf("command %d kills processes by name with %s %s: it may hit the sandbox's init or everything at once", a.idx, n, joinVals(rest)), nil, nil)
		return
	}
	for _, w := range rest {
		switch w.val {
		case "1":
			a.add(KillInit, fmt.Sprintf("command %d signals process 1, the sandbox's init", a.idx), nil, nil)
		case "-1", "--", "0":
			if w.val != "--" {
				a.add(KillInit, fmt.Sprintf("command %d signals every process it may (kill %s)", a.idx, joinVals(rest)), nil, nil)
			}
		}
	}
}

func (a *analyser) copyLike(n string, rest []word, in origin) origin {
	var pos []word
	inplace := false
	for i := 0; i < len(rest); i++ {
		v := rest[i].val
		if n == "sed" && (v == "-e" || v == "-f") {
			i++
			continue
		}
		if n == "sed" && strings.HasPrefix(v, "-i") {
			inplace = true
		}
		if n == "install" && (v == "-m" || v == "-o" || v == "-g") {
			i++
			continue
		}
		if !strings.HasPrefix(v, "-") {
			pos = append(pos, rest[i])
		}
	}
	switch n {
	case "tee":
		for _, w := range pos {
			a.writeFile(w.val, in, false)
		}
		return in
	case "sed":
		if inplace && len(pos) > 1 {
			for _, w := range pos[1:] {
				a.persistWrite(w.val)
			}
		}
		return in
	}
	if len(pos) < 2 {
		return origin{}
	}
	dst := pos[len(pos)-1].val
	var o origin
	for _, w := range pos[:len(pos)-1] {
		src, _ := a.fileOrigin(w.val)
		o = o.merge(src).merge(a.readArg(w.val))
	}
	if n == "ln" {
		a.persistWrite(dst)
		return origin{}
	}
	a.writeFile(dst, o, false)
	if len(pos) == 2 && isDir(dst) {
		a.writeFile(strings.TrimSuffix(dst, "/")+"/"+path.Base(pos[0].val), o, false)
	}
	return origin{}
}

func isDir(p string) bool {
	return strings.HasSuffix(p, "/") || p == "." || p == "/tmp" || p == "~"
}

// persistWrite adds a Persist effect when p is a start-up or schedule file.
func (a *analyser) persistWrite(p string) {
	if isPersistPath(p) {
		a.add(Persist, fmt.Sprintf("command %d writes %s, which runs again later (at login, boot or on a schedule)", a.idx, p), nil, []string{p})
	}
}

func isShortCluster(v string) bool {
	return len(v) > 2 && v[0] == '-' && v[1] != '-'
}

// archive follows tar and zip: reading an archive out (x) decodes, making
// one (c) encodes what it reads, into the named file or onto stdout.
func (a *analyser) archive(n string, rest []word, in origin) origin {
	out := in
	file := ""
	create := n == "zip" || n == "7z" && len(rest) > 0 && rest[0].val == "a"
	for i, w := range rest {
		v := w.val
		if n == "tar" && i == 0 && !strings.HasPrefix(v, "-") && !strings.Contains(v, "/") {
			v = "-" + v // tar czf: the old form without a dash
		}
		if n == "tar" && strings.HasPrefix(v, "-") && !strings.HasPrefix(v, "--") {
			if strings.ContainsAny(v, "cr") {
				create = true
			}
			if strings.ContainsAny(v, "x") {
				out.decoded = true
			}
			if strings.HasSuffix(v, "f") && i+1 < len(rest) {
				file = rest[i+1].val
			}
		}
		if (n == "zip" || n == "7z") && file == "" && !strings.HasPrefix(v, "-") && v != "a" {
			file = v
		}
	}
	if create {
		out.encoded = true
		out.decoded = false
	}
	if file != "" && file != "-" && create {
		a.writeFile(file, out, false)
		return origin{}
	}
	if file != "" && file != "-" {
		o, _ := a.fileOrigin(file)
		return o
	}
	return out
}
