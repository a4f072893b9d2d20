package imagebuild

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
)

// maxDockerfileBytes bounds what the reader reads: a Dockerfile is a
// few kilobytes; a larger file is a mistake (-f pointing at an archive).
const maxDockerfileBytes = 1 << 20

// ReadDockerfile reads the Dockerfile at path into a Plan whose COPY and
// ADD sources are relative to contextDir. buildArgs override the ARG
// defaults; a build arg the file declares no ARG for is an error (Docker
// warns and goes on; a misspelt --build-arg silently building something
// else is worse than a refusal). Errors name the file and the line.
func ReadDockerfile(path, contextDir string, buildArgs map[string]string) (*Plan, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read Dockerfile: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxDockerfileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read Dockerfile %s: %w", path, err)
	}
	if len(data) > maxDockerfileBytes {
		return nil, fmt.Errorf("read Dockerfile %s: larger than %d bytes; is -f pointing at the right file?", path, maxDockerfileBytes)
	}
	plan, err := parseDockerfile(filepath.Base(path), data, buildArgs)
	if err != nil {
		return nil, err
	}
	plan.File, plan.Context = path, contextDir
	if err := checkAddSources(filepath.Base(path), plan, contextDir); err != nil {
		return nil, err
	}
	return plan, nil
}

// logicalLine is one instruction after joining continuation lines.
type logicalLine struct {
	line int // first physical line, 1-based
	text string
}

// directiveRE matches a parser directive ("# escape=`").
var directiveRE = regexp.MustCompile(`^#\s*([a-zA-Z][a-zA-Z0-9]*)\s*=\s*(.*?)\s*$`)

// heredocRE matches the start of a heredoc (RUN <<EOF, COPY <<EOF /x).
var heredocRE = regexp.MustCompile(`(^|\s)<<-?\s*["']?[A-Za-z_][A-Za-z0-9_]*`)

// splitLines applies the parser directives and joins continuation
// lines, dropping comments and blank lines.
func splitLines(name string, data []byte) (lines []logicalLine, escape byte, err error) {
	escape = '\\'
	phys := strings.Split(strings.ReplaceAll(string(data), "\r\n", "\n"), "\n")
	i := 0
	// Parser directives: only at the very top, before any comment,
	// blank line or instruction (Docker's rule).
	seen := map[string]bool{}
	for ; i < len(phys); i++ {
		m := directiveRE.FindStringSubmatch(phys[i])
		if m == nil {
			break
		}
		key := strings.ToLower(m[1])
		if seen[key] {
			return nil, 0, fmt.Errorf("%s:%d: parser directive %q given twice", name, i+1, key)
		}
		seen[key] = true
		switch key {
		case "escape":
			switch m[2] {
			case `\`:
				escape = '\\'
			case "`":
				escape = '`'
			default:
				return nil, 0, fmt.Errorf("%s:%d: escape=%q is not supported: the escape character is \\ or `", name, i+1, m[2])
			}
		default:
			// syntax= names a BuildKit frontend image; Moat reads the file
			// itself, so it (and check=) is ignored. Unknown directives
			// are comments, as in Docker.
		}
	}
	var cur strings.Builder
	start := 0
	for ; i < len(phys); i++ {
		l := phys[i]
		trimmed := strings.TrimLeft(l, " \t")
		if strings.HasPrefix(trimmed, "#") || strings.TrimSpace(l) == "" {
			continue // comments and blank lines, also inside a continuation
		}
		if cur.Len() == 0 {
			start = i + 1
		}
		body := strings.TrimRight(l, " \t")
		if strings.HasSuffix(body, string(escape)) {
			cur.WriteString(strings.TrimSuffix(body, string(escape)))
			continue
		}
		cur.WriteString(l)
		lines = append(lines, logicalLine{start, strings.TrimSpace(cur.String())})
		cur.Reset()
	}
	if strings.TrimSpace(cur.String()) != "" {
		lines = append(lines, logicalLine{start, strings.TrimSpace(cur.String())}) // continued past the end, as Docker allows
	}
	return lines, escape, nil
}

// ignored instructions are accepted with a note: they describe the image
// to tools Moat does not have and change nothing in the tree.
var ignored = map[string]string{
	"LABEL":       "Moat images carry no labels",
	"MAINTAINER":  "Moat images carry no labels",
	"EXPOSE":      "a Moat sandbox takes no inbound connections",
	"STOPSIGNAL":  "Moat stops a run by its timeout and kills the whole sandbox",
	"HEALTHCHECK": "Moat runs are commands, not services",
}

// refused instructions, with what to do instead.
var refused = map[string]string{
	"SHELL":   "RUN's shell form always runs /bin/sh -c; use the JSON form to run another shell",
	"VOLUME":  "a Moat run's only writable mount is its workspace; drop the line",
	"ONBUILD": "Moat images are not used as bases by other Dockerfiles' builders; drop the line",
}

// parseDockerfile reads a Dockerfile's bytes; name is for messages.
func parseDockerfile(name string, data []byte, buildArgs map[string]string) (*Plan, error) {
	lines, escape, err := splitLines(name, data)
	if err != nil {
		return nil, err
	}
	p := &Plan{}
	used := map[string]bool{}
	// args: ARG values in scope (global before FROM, the stage's after);
	// globals: the ARGs declared before FROM, which a later bare ARG
	// inherits (Docker's rule).
	args, globals := map[string]string{}, map[string]string{}
	var argOrder []string
	env := map[string]string{} // ENV set in this file
	fromSeen := false
	workdir := ""
	for _, ll := range lines {
		errf := func(format string, a ...any) error {
			return fmt.Errorf("%s:%d: %s", name, ll.line, fmt.Sprintf(format, a...))
		}
		kw, rest := ll.text, ""
		if i := strings.IndexAny(ll.text, " \t"); i >= 0 {
			kw, rest = ll.text[:i], ll.text[i+1:]
		}
		kw = strings.ToUpper(kw)
		rest = strings.TrimSpace(rest)
		lookup := func(n string) (string, bool) {
			if v, ok := env[n]; ok {
				return v, true
			}
			v, ok := args[n]
			return v, ok
		}
		word := func(s string, keepUnknown bool) (string, bool, error) {
			w, unres, err := expandWords(s, escape, lookup, wordMode{keepUnknown: keepUnknown})
			if err != nil {
				return "", false, errf("%s: %v", kw, err)
			}
			return w[0], unres, nil
		}
		if !fromSeen && kw != "FROM" && kw != "ARG" {
			return nil, errf("%s before FROM: a Dockerfile starts with FROM (only ARG may come before it)", kw)
		}
		step := Step{Op: Op(kw), Line: ll.line, Text: ll.text}
		if kw == "RUN" || kw == "COPY" || kw == "ADD" {
			if heredocRE.MatchString(rest) {
				return nil, errf("%s with a heredoc (<<) is not supported: put the text in a file in the build context and COPY it", kw)
			}
		}
		switch kw {
		case "FROM":
			if fromSeen {
				return nil, errf("a second FROM is not supported: multi-stage builds are not supported; build each stage as its own image")
			}
			fromSeen = true
			flags, rest, err := cutFlags(rest)
			if err != nil {
				return nil, errf("FROM: %v", err)
			}
			if len(flags) > 0 {
				return nil, errf("FROM --%s is not supported: Moat builds for the host's platform from an image it stores", flags[0].name)
			}
			fields := strings.Fields(rest)
			if len(fields) == 3 && strings.EqualFold(fields[1], "AS") {
				return nil, errf("FROM ... AS %s is not supported: multi-stage builds are not supported; build each stage as its own image", fields[2])
			}
			if len(fields) != 1 {
				return nil, errf("FROM wants one image name, got %q", rest)
			}
			img, _, err := word(fields[0], false)
			if err != nil {
				return nil, err
			}
			switch {
			case img == "":
				return nil, errf("FROM %s: the image name is empty after substitution", fields[0])
			case img == "scratch":
				return nil, errf("FROM scratch is not supported: start from an image Moat has (`moat image list`), or import a root filesystem with `moat image import NAME rootfs:FILE.tar`")
			case strings.ContainsAny(img, ":/@"):
				return nil, errf("FROM %s: Moat images are named without registry, tag or digest (like python); import it first with `moat image import NAME docker-archive:FILE` and use FROM NAME", img)
			}
			p.Base.Image = img
			p.Base.Line, p.Base.Text = ll.line, "FROM "+img
			// The stage starts with no ARGs in scope (Docker's rule).
			args = map[string]string{}
			argOrder = nil
			continue
		case "ARG":
			if rest == "" {
				return nil, errf("ARG wants NAME or NAME=default")
			}
			for _, decl := range strings.Fields(rest) {
				k, v, hasDefault := strings.Cut(decl, "=")
				if k == "" || !validVarName(k) {
					return nil, errf("ARG %q: a name is letters, digits and _, not starting with a digit", k)
				}
				if hasDefault {
					var err error
					if v, _, err = word(v, false); err != nil {
						return nil, err
					}
				} else if g, ok := globals[k]; ok && fromSeen {
					v, hasDefault = g, true
				}
				if b, ok := buildArgs[k]; ok {
					v, hasDefault = b, true
					used[k] = true
				}
				if !fromSeen {
					if hasDefault {
						globals[k] = v
					}
				}
				if hasDefault {
					args[k] = v
				} else {
					delete(args, k)
				}
				if !slices.Contains(argOrder, k) && fromSeen {
					argOrder = append(argOrder, k)
				}
			}
			continue
		case "RUN":
			flags, rest, err := cutFlags(rest)
			if err != nil {
				return nil, errf("RUN: %v", err)
			}
			if len(flags) > 0 {
				return nil, errf("RUN --%s is not supported: a RUN step runs in a Moat sandbox with no mounts but its tree and no network", flags[0].name)
			}
			if step.Argv, err = commandArgv(rest); err != nil {
				return nil, errf("RUN: %v", err)
			}
			for _, k := range argOrder {
				if v, ok := args[k]; ok {
					step.BuildEnv = append(step.BuildEnv, k+"="+v)
				}
			}
		case "CMD", "ENTRYPOINT":
			var err error
			if step.Argv, err = commandArgv(rest); err != nil {
				return nil, errf("%s: %v", kw, err)
			}
			if step.Argv == nil {
				step.Argv = []string{}
			}
		case "COPY", "ADD":
			step.Op = OpCopy
			flags, rest, err := cutFlags(rest)
			if err != nil {
				return nil, errf("%s: %v", kw, err)
			}
			for _, f := range flags {
				if f.name != "chown" {
					return nil, errf("%s --%s is not supported: only --chown (root or sandbox) is; for --from, build the stage as its own image and COPY from the context", kw, f.name)
				}
				v, _, err := word(f.value, false)
				if err != nil {
					return nil, err
				}
				if step.Chown, err = chownID(v); err != nil {
					return nil, errf("%s --chown=%s: %v", kw, f.value, err)
				}
			}
			var words []string
			if strings.HasPrefix(rest, "[") {
				if err := json.Unmarshal([]byte(rest), &words); err != nil {
					return nil, errf("%s: %s is not a JSON array of strings: %v", kw, rest, err)
				}
				for i, w := range words {
					if words[i], _, err = word(w, false); err != nil {
						return nil, err
					}
				}
			} else if words, _, err = expandWords(rest, escape, lookup, wordMode{split: true}); err != nil {
				return nil, errf("%s: %v", kw, err)
			}
			if len(words) < 2 {
				return nil, errf("%s wants at least one source and a destination, got %q", kw, rest)
			}
			step.Sources, step.Dest = words[:len(words)-1], words[len(words)-1]
			for _, src := range step.Sources {
				if kw == "ADD" && (strings.Contains(src, "://") || strings.HasPrefix(src, "git@")) {
					return nil, errf("ADD %s is not supported: a build fetches nothing outside its sandboxed RUN steps; download it into the build context first", src)
				}
				if err := checkSource(src); err != nil {
					return nil, errf("%s %s: %v", kw, src, err)
				}
			}
			if !path.IsAbs(step.Dest) && workdir != "" {
				trail := strings.HasSuffix(step.Dest, "/")
				step.Dest = path.Join(workdir, step.Dest)
				if trail {
					step.Dest += "/"
				}
			}
		case "ENV":
			pairs, err := envPairs(rest, escape, lookup)
			if err != nil {
				return nil, errf("ENV: %v", err)
			}
			for _, kv := range pairs {
				s := step
				s.Key, s.Value, s.Expand = kv.key, kv.value, kv.unresolved
				p.Steps = append(p.Steps, s)
				env[kv.key] = kv.value
			}
			continue
		case "WORKDIR":
			dir, unres, err := word(rest, true)
			if err != nil {
				return nil, err
			}
			if dir == "" {
				return nil, errf("WORKDIR wants a directory")
			}
			if !path.IsAbs(dir) && workdir != "" {
				dir = path.Join(workdir, dir)
			}
			if path.IsAbs(dir) {
				dir = path.Clean(dir)
			}
			step.Dir, step.Expand = dir, unres
			if !unres && path.IsAbs(dir) {
				workdir = dir
			}
		case "USER":
			u, _, err := word(rest, false)
			if err != nil {
				return nil, err
			}
			if u == "" {
				return nil, errf("USER wants a user name or id")
			}
			step.User = u
		default:
			if why, ok := ignored[kw]; ok {
				p.Notes = append(p.Notes, fmt.Sprintf("%s:%d: %s ignored: %s", name, ll.line, kw, why))
				continue
			}
			if why, ok := refused[kw]; ok {
				return nil, errf("%s is not supported: %s", kw, why)
			}
			return nil, errf("%s is not supported: not a Dockerfile instruction Moat knows (FROM, RUN, COPY, ADD, ENV, WORKDIR, USER, ARG, ENTRYPOINT, CMD)", kw)
		}
		p.Steps = append(p.Steps, step)
	}
	if !fromSeen {
		return nil, fmt.Errorf("%s: no FROM instruction: a Dockerfile starts with FROM and the name of an image Moat has", name)
	}
	var unused []string
	for k := range buildArgs {
		if !used[k] {
			unused = append(unused, k)
		}
	}
	if len(unused) > 0 {
		sort.Strings(unused)
		return nil, fmt.Errorf("%s: --build-arg %s: the Dockerfile declares no ARG of that name", name, strings.Join(unused, ", "))
	}
	return p, nil
}

type flag struct{ name, value string }

// cutFlags takes the leading --name=value words off an instruction.
func cutFlags(s string) ([]flag, string, error) {
	var flags []flag
	for strings.HasPrefix(s, "--") {
		w, rest := s, ""
		if i := strings.IndexAny(s, " \t"); i >= 0 {
			w, rest = s[:i], s[i+1:]
		}
		n, v, _ := strings.Cut(strings.TrimPrefix(w, "--"), "=")
		if n == "" {
			return nil, "", fmt.Errorf("flag %q has no name", w)
		}
		flags = append(flags, flag{n, v})
		s = strings.TrimSpace(rest)
	}
	return flags, s, nil
}

// commandArgv reads RUN/CMD/ENTRYPOINT's exec form (a JSON array of
// strings) or shell form (run by /bin/sh -c). Docker substitutes no
// variables here: the shell does, at run time.
func commandArgv(s string) ([]string, error) {
	if strings.HasPrefix(s, "[") {
		var argv []string
		if err := json.Unmarshal([]byte(s), &argv); err == nil {
			return argv, nil
		}
		// Not JSON: Docker runs it as a shell command; so do we.
	}
	if s == "" {
		return nil, fmt.Errorf("no command")
	}
	return []string{"/bin/sh", "-c", s}, nil
}

// checkSource refuses a COPY source that leaves the build context by
// its name (symlinks are checked when the builder copies).
func checkSource(src string) error {
	if src == "" {
		return fmt.Errorf("empty source")
	}
	c := path.Clean("/" + src)
	if c != "/" && strings.HasPrefix(path.Clean(src), "..") {
		return fmt.Errorf("source is outside the build context; sources are paths inside --context")
	}
	if _, err := path.Match(src, ""); err != nil {
		return fmt.Errorf("bad pattern: %v", err)
	}
	return nil
}

// chownID maps COPY --chown's value to the two owners a Moat image has.
func chownID(v string) (string, error) {
	u, g, hasGroup := strings.Cut(v, ":")
	id := map[string]string{"root": "0", "0": "0", "sandbox": "1000", "1000": "1000"}
	uid, ok := id[u]
	if !ok || (hasGroup && id[g] != uid) {
		return "", fmt.Errorf("owner %q is not supported: a Moat image has root (0) and the sandbox user (1000); use --chown=root or --chown=sandbox", v)
	}
	return uid, nil
}

type envPair struct {
	key, value string
	unresolved bool
}

// envPairs reads ENV's "K=V K2=V2" form or its legacy "K V" form.
func envPairs(rest string, escape byte, lookup lookupFunc) ([]envPair, error) {
	if rest == "" {
		return nil, fmt.Errorf("want NAME=value")
	}
	first := rest
	if i := strings.IndexAny(rest, " \t"); i >= 0 {
		first = rest[:i]
	}
	if !strings.Contains(first, "=") {
		// Legacy form: the rest of the line, blanks included, is the value.
		if !validVarName(first) {
			return nil, fmt.Errorf("%q is not a variable name", first)
		}
		v := strings.TrimSpace(strings.TrimPrefix(rest, first))
		w, unres, err := expandWords(v, escape, lookup, wordMode{keepUnknown: true})
		if err != nil {
			return nil, err
		}
		return []envPair{{first, w[0], unres}}, nil
	}
	// Split into raw words first, then expand each value: every pair
	// sees the variables as they were before the line (Docker's rule).
	words, err := rawWords(rest, escape)
	if err != nil {
		return nil, err
	}
	var out []envPair
	for _, w := range words {
		k, v, ok := strings.Cut(w, "=")
		if !ok || !validVarName(k) {
			return nil, fmt.Errorf("%q is not NAME=value (quote values with blanks)", w)
		}
		ex, unres, err := expandWords(v, escape, lookup, wordMode{keepUnknown: true})
		if err != nil {
			return nil, err
		}
		out = append(out, envPair{k, ex[0], unres})
	}
	return out, nil
}

// rawWords splits s at unquoted blanks, keeping quotes and escapes for
// the expansion that follows.
func rawWords(s string, escape byte) ([]string, error) {
	var words []string
	var cur bytes.Buffer
	var quote byte
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case quote != 0:
			cur.WriteByte(c)
			if c == escape && quote == '"' && i+1 < len(s) {
				i++
				cur.WriteByte(s[i])
			} else if c == quote {
				quote = 0
			}
		case c == escape && i+1 < len(s):
			cur.WriteByte(c)
			i++
			cur.WriteByte(s[i])
		case c == '"' || c == '\'':
			quote = c
			cur.WriteByte(c)
		case c == ' ' || c == '\t':
			if cur.Len() > 0 {
				words = append(words, cur.String())
				cur.Reset()
			}
		default:
			cur.WriteByte(c)
		}
	}
	if quote != 0 {
		return nil, fmt.Errorf("unterminated %c quote in %q", quote, s)
	}
	if cur.Len() > 0 {
		words = append(words, cur.String())
	}
	return words, nil
}

func validVarName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !isNameByte(s[i], i == 0) {
			return false
		}
	}
	return true
}

// archiveMagic are the leading bytes of the archives Docker's ADD would
// extract (tar at offset 257 is checked separately).
var archiveMagic = [][]byte{
	{0x1f, 0x8b},                     // gzip
	[]byte("BZh"),                    // bzip2
	{0xfd, '7', 'z', 'X', 'Z', 0x00}, // xz
	{0x28, 0xb5, 0x2f, 0xfd},         // zstd
}

// checkAddSources refuses ADD of a local archive: Docker extracts it,
// and a copy of the archive would silently build something else.
func checkAddSources(name string, p *Plan, contextDir string) error {
	for _, s := range p.Steps {
		if s.Op != OpCopy || !strings.HasPrefix(strings.ToUpper(s.Text), "ADD") {
			continue
		}
		for _, src := range s.Sources {
			matches, _ := filepath.Glob(filepath.Join(contextDir, filepath.FromSlash(src)))
			for _, m := range matches {
				if isArchive(m) {
					return fmt.Errorf("%s:%d: ADD %s is not supported: it is an archive, which Docker would extract; COPY it and RUN tar -x (in the sandbox) instead", name, s.Line, src)
				}
			}
		}
	}
	return nil
}

func isArchive(p string) bool {
	fi, err := os.Lstat(p)
	if err != nil || !fi.Mode().IsRegular() {
		return false
	}
	f, err := os.Open(p)
	if err != nil {
		return false
	}
	defer f.Close()
	head := make([]byte, 512)
	n, _ := io.ReadFull(f, head)
	head = head[:n]
	for _, m := range archiveMagic {
		if bytes.HasPrefix(head, m) {
			return true
		}
	}
	return n >= 262 && string(head[257:262]) == "ustar"
}
