package effects

import (
	"fmt"
	"path"
	"strconv"
	"strings"

	"mvdan.cc/sh/v3/syntax"
)

// word is a shell word as far as it can be known without running
// anything: its literal value (unknown parts kept as written, e.g.
// "$x"), whether it is fully known, and where its content came from
// (a command substitution that fetched, say).
type word struct {
	val   string
	plain bool // fully literal: no unknown variable or substitution
	split bool // quoted or escaped in pieces (c'u'rl): a sign of obfuscation
	flow  origin
}

type analyser struct {
	s      *Session
	idx    int
	vars   map[string]word
	funcs  map[string]any // name -> *syntax.Stmt body
	cwd    string
	steps  int
	out    []Effect
	over   bool
	parsed int      // bytes of text parsed for this command, nested ones too
	hdoc   *word    // the here-document the current command reads, if any
	reads  []string // paths the current statement reads, to spot cmd f > f
}

// script parses text as a shell script and analyses it with stdin in.
// It returns the flow of its standard output.
func (a *analyser) script(text string, in origin, depth int) origin {
	if depth > MaxDepth {
		a.tooDeep()
		return origin{}
	}
	// Nested text (sh -c, eval, here-documents, function bodies run many
	// times) is parsed again at each level: bound the total, or a
	// function that runs sh -c on a long string 20000 times would cost
	// gigabytes of parsing.
	a.parsed += len(text)
	if a.parsed > MaxParseBytes {
		a.tooDeep()
		return origin{}
	}
	p := syntax.NewParser(syntax.Variant(syntax.LangBash))
	f, err := p.Parse(strings.NewReader(text), "")
	if err != nil {
		a.add(Opaque, fmt.Sprintf("command %d does not parse as a shell command line (%s), so what it runs cannot be told", a.idx, shortErr(err)), nil, nil)
		return origin{}
	}
	return a.stmts(f.Stmts, in, depth)
}

func shortErr(err error) string {
	s := err.Error()
	if len(s) > 120 {
		s = s[:120] + "..."
	}
	return s
}

func (a *analyser) tooDeep() {
	if a.over {
		return
	}
	a.over = true
	a.add(Opaque, fmt.Sprintf("command %d nests shells, substitutions or functions deeper than %d levels, has more than %d statements or %d bytes of nested text: the rest was not analysed", a.idx, MaxDepth, MaxSteps, MaxParseBytes), nil, nil)
}

func (a *analyser) stmts(list []*syntax.Stmt, in origin, depth int) origin {
	var out origin
	for _, s := range list {
		out = out.merge(a.stmt(s, in, depth))
	}
	return out
}

func (a *analyser) stmt(s *syntax.Stmt, in origin, depth int) origin {
	if s == nil {
		return origin{}
	}
	a.steps++
	if a.over || a.steps > MaxSteps || depth > MaxDepth {
		a.tooDeep()
		return origin{}
	}
	// Input redirections decide stdin before the command runs.
	var outs []*syntax.Redirect
	for _, r := range s.Redirs {
		switch r.Op {
		case syntax.RdrIn, syntax.RdrInOut:
			w := a.word(r.Word, depth)
			in = in.merge(a.readFile(w.val, "reads"))
		case syntax.Hdoc, syntax.DashHdoc:
			if r.Hdoc != nil {
				hw := a.word(r.Hdoc, depth)
				// A here-document is text the command reads; if the
				// command is a shell, that text is a script.
				in = in.merge(hw.flow)
				in = in.merge(origin{})
				a.hdoc = &hw
			}
		case syntax.WordHdoc:
			w := a.word(r.Word, depth)
			in = in.merge(w.flow)
			a.hdoc = &w
		default:
			outs = append(outs, r)
		}
	}
	a.reads = nil
	out := a.command(s.Cmd, in, depth, outs)
	a.hdoc = nil
	reads := a.reads
	a.reads = nil
	for _, r := range outs {
		if r.N != nil && r.N.Value == "2" {
			continue
		}
		w := a.word(r.Word, depth)
		switch r.Op {
		case syntax.RdrOut, syntax.RdrClob, syntax.RdrAll:
			a.truncation(s.Cmd, w.val, reads)
			a.writeFile(w.val, out, false)
		case syntax.AppOut, syntax.AppAll:
			a.writeFile(w.val, out, true)
		}
	}
	if len(outs) > 0 {
		for _, r := range outs {
			if r.Op != syntax.DplOut && (r.N == nil || r.N.Value != "2") {
				return origin{}
			}
		}
	}
	return out
}

func (a *analyser) command(c syntax.Command, in origin, depth int, outs []*syntax.Redirect) origin {
	switch c := c.(type) {
	case nil:
		return origin{}
	case *syntax.CallExpr:
		for _, as := range c.Assigns {
			a.assign(as, depth)
		}
		if len(c.Args) == 0 {
			return origin{}
		}
		args := make([]word, 0, len(c.Args))
		for _, w := range c.Args {
			args = append(args, a.word(w, depth))
		}
		return a.call(args, in, depth)
	case *syntax.BinaryCmd:
		switch c.Op {
		case syntax.Pipe, syntax.PipeAll:
			mid := a.stmt(c.X, in, depth)
			return a.stmt(c.Y, mid, depth)
		default:
			return a.stmt(c.X, in, depth).merge(a.stmt(c.Y, in, depth))
		}
	case *syntax.Subshell:
		cwd := a.cwd
		defer func() { a.cwd = cwd }()
		return a.stmts(c.Stmts, in, depth+1)
	case *syntax.Block:
		return a.stmts(c.Stmts, in, depth)
	case *syntax.IfClause:
		out := a.stmts(c.Cond, in, depth)
		out = out.merge(a.stmts(c.Then, in, depth))
		if c.Else != nil {
			out = out.merge(a.command(c.Else, in, depth, nil))
		}
		return out
	case *syntax.WhileClause:
		return a.stmts(c.Cond, in, depth).merge(a.stmts(c.Do, in, depth))
	case *syntax.ForClause:
		if wi, ok := c.Loop.(*syntax.WordIter); ok {
			var vals []string
			var fl origin
			for _, w := range wi.Items {
				x := a.word(w, depth)
				vals = append(vals, x.val)
				fl = fl.merge(x.flow)
			}
			if wi.Name != nil {
				v := word{val: strings.Join(vals, " "), flow: fl}
				if len(vals) == 1 {
					v.plain = true
				}
				a.vars[wi.Name.Value] = v
			}
		}
		return a.stmts(c.Do, in, depth)
	case *syntax.CaseClause:
		var out origin
		for _, it := range c.Items {
			out = out.merge(a.stmts(it.Stmts, in, depth))
		}
		return out
	case *syntax.FuncDecl:
		if c.Name != nil {
			a.funcs[c.Name.Value] = c.Body
		}
		return origin{}
	case *syntax.DeclClause:
		for _, as := range c.Args {
			a.assign(as, depth)
		}
		return origin{}
	case *syntax.TimeClause:
		return a.stmt(c.Stmt, in, depth)
	case *syntax.CoprocClause:
		return a.stmt(c.Stmt, in, depth)
	case *syntax.TestClause, *syntax.ArithmCmd, *syntax.LetClause:
		// Substitutions inside tests still run.
		var out origin
		syntax.Walk(c, func(n syntax.Node) bool {
			if cs, ok := n.(*syntax.CmdSubst); ok {
				out = out.merge(a.stmts(cs.Stmts, origin{}, depth+1))
				return false
			}
			return true
		})
		return out
	}
	return origin{}
}

func (a *analyser) assign(as *syntax.Assign, depth int) {
	if as == nil || as.Name == nil {
		return
	}
	if as.Value == nil {
		if as.Array != nil {
			var fl origin
			for _, e := range as.Array.Elems {
				if e.Value != nil {
					fl = fl.merge(a.word(e.Value, depth).flow)
				}
			}
			a.vars[as.Name.Value] = word{val: "$" + as.Name.Value, flow: fl}
		}
		return
	}
	w := a.word(as.Value, depth)
	if as.Append {
		old := a.vars[as.Name.Value]
		w = word{val: old.val + w.val, plain: old.plain && w.plain, flow: old.flow.merge(w.flow)}
	}
	a.vars[as.Name.Value] = w
}

// word resolves a shell word without running anything: literals and
// quotes as the shell would, variables assigned earlier in the same
// command line, command substitutions analysed (their flow kept, their
// value unknown).
func (a *analyser) word(w *syntax.Word, depth int) word {
	if w == nil {
		return word{plain: true}
	}
	out := word{plain: true}
	if len(w.Parts) > 1 {
		out.split = true
	}
	a.parts(w.Parts, &out, depth, false)
	return out
}

func (a *analyser) parts(parts []syntax.WordPart, out *word, depth int, quoted bool) {
	var b strings.Builder
	b.WriteString(out.val)
	for _, p := range parts {
		switch p := p.(type) {
		case *syntax.Lit:
			v := p.Value
			if !quoted {
				if strings.Contains(v, "\\") {
					out.split = true
				}
				v = unescape(v)
			}
			b.WriteString(v)
		case *syntax.SglQuoted:
			v := p.Value
			if p.Dollar {
				v = ansiC(v)
				out.split = true
			}
			b.WriteString(v)
		case *syntax.DblQuoted:
			out.val = b.String()
			a.parts(p.Parts, out, depth, true)
			b.Reset()
			b.WriteString(out.val)
		case *syntax.ParamExp:
			name := ""
			if p.Param != nil {
				name = p.Param.Value
			}
			v, ok := a.vars[name]
			simple := p.Exp == nil && p.Repl == nil && p.Slice == nil && p.Index == nil && !p.Length && !p.Excl
			switch {
			case ok && simple:
				b.WriteString(v.val)
				out.plain = out.plain && v.plain
				out.flow = out.flow.merge(v.flow)
			case name == "HOME" && simple:
				b.WriteString("~")
			default:
				if ok {
					out.flow = out.flow.merge(v.flow)
				}
				if p.Exp != nil && p.Exp.Word != nil {
					x := a.word(p.Exp.Word, depth)
					out.flow = out.flow.merge(x.flow)
				}
				b.WriteString("$" + name)
				out.plain = false
			}
		case *syntax.CmdSubst:
			if depth+1 > MaxDepth {
				a.tooDeep()
			} else {
				out.flow = out.flow.merge(a.stmts(p.Stmts, origin{}, depth+1))
			}
			b.WriteString("$(...)")
			out.plain = false
		case *syntax.ProcSubst:
			fl := a.stmts(p.Stmts, origin{}, depth+1)
			out.flow = out.flow.merge(fl)
			b.WriteString("<(...)")
			out.plain = false
		case *syntax.ArithmExp:
			b.WriteString("$((...))")
			out.plain = false
		default:
			out.plain = false
			b.WriteString("?")
		}
	}
	out.val = b.String()
}

// unescape removes the backslashes of an unquoted literal (c\url is curl).
func unescape(s string) string {
	if !strings.Contains(s, "\\") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+1 < len(s) {
			i++
			if s[i] == '\n' {
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// ansiC decodes the escapes of a $'...' string ($'\x63url' is curl).
func ansiC(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '\\' || i+1 >= len(s) {
			b.WriteByte(c)
			continue
		}
		i++
		switch s[i] {
		case 'n':
			b.WriteByte('\n')
		case 't':
			b.WriteByte('\t')
		case 'x':
			j := i + 1
			for j < len(s) && j < i+3 && isHex(s[j]) {
				j++
			}
			if v, err := strconv.ParseUint(s[i+1:j], 16, 8); err == nil {
				b.WriteByte(byte(v))
				i = j - 1
			} else {
				b.WriteString("\\x")
			}
		case '0', '1', '2', '3':
			j := i
			for j < len(s) && j < i+3 && s[j] >= '0' && s[j] <= '7' {
				j++
			}
			if v, err := strconv.ParseUint(s[i:j], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i = j - 1
			}
		default:
			b.WriteByte(s[i])
		}
	}
	return b.String()
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

// key is the session's name for a file path: cleaned, relative to the
// directory cd moved to within this command line.
func (a *analyser) key(p string) string {
	if p == "" {
		return ""
	}
	p = strings.Replace(p, "$HOME", "~", 1)
	if !strings.HasPrefix(p, "/") && !strings.HasPrefix(p, "~") && a.cwd != "" {
		p = a.cwd + "/" + p
	}
	return path.Clean(p)
}

// fileOrigin is what the session knows of a file's content: its own, or
// that of a directory above it (git clone d; d/install.sh).
func (a *analyser) fileOrigin(p string) (origin, bool) {
	k := a.key(p)
	if k == "" {
		return origin{}, false
	}
	for q := k; ; q = path.Dir(q) {
		if o, ok := a.s.files[q]; ok {
			return o, true
		}
		if q == "." || q == "/" || path.Dir(q) == q {
			return origin{}, false
		}
	}
}

func (a *analyser) writeFile(p string, o origin, appendTo bool) {
	k := a.key(p)
	if k == "" || k == "/dev/null" || strings.HasPrefix(k, "/dev/std") || strings.HasPrefix(k, "/dev/fd") {
		return
	}
	a.persistWrite(p)
	o.written = unionInt(o.written, []int{a.idx})
	if appendTo {
		if old, ok := a.s.files[k]; ok {
			o = old.merge(o)
		}
	}
	a.s.files[k] = o
}

// readFile is the flow of reading file p: its session origin, and a
// secret-read effect if p looks like a secret.
func (a *analyser) readFile(p, verb string) origin {
	o, _ := a.fileOrigin(p)
	a.reads = append(a.reads, a.key(p))
	if isSecretPath(p) {
		a.add(SecretRead, fmt.Sprintf("command %d %s %s, a likely secret", a.idx, verb, p), nil, []string{p})
		o.secrets = union(o.secrets, []string{p})
		o.secCmd = unionInt(o.secCmd, []int{a.idx})
	}
	return o
}

// truncation flags > f that empties a file: with no command (> f, : > f)
// or when the same command reads f (sort f > f empties f first).
func (a *analyser) truncation(c syntax.Command, target string, reads []string) {
	k := a.key(target)
	if k == "" || k == "/dev/null" || strings.HasPrefix(k, "/dev/") {
		return
	}
	bare := false
	switch c := c.(type) {
	case nil:
		bare = true
	case *syntax.CallExpr:
		if len(c.Args) == 0 {
			bare = true
		} else if len(c.Args) == 1 {
			if l := c.Args[0].Lit(); l == ":" || l == "true" {
				bare = true
			}
		}
	}
	if bare {
		if _, known := a.s.files[k]; !known {
			a.add(Destroy, fmt.Sprintf("command %d empties %s (a redirection with no output truncates it)", a.idx, target), nil, []string{target})
		}
		return
	}
	for _, r := range reads {
		if r == k {
			a.add(Destroy, fmt.Sprintf("command %d reads %s and redirects its output onto it: the shell empties %s before it is read", a.idx, target, target), nil, []string{target})
			return
		}
	}
}
