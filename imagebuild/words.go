package imagebuild

import (
	"fmt"
	"strings"
)

// lookupFunc returns a variable's value and whether it is set.
type lookupFunc func(name string) (string, bool)

// wordMode says how expandWords treats its input.
type wordMode struct {
	// split: cut the result into words at unquoted blanks (COPY's
	// sources, ENV's K=V pairs); else the input is one word.
	split bool
	// keepUnknown: a reference to a variable lookup does not know stays
	// in the output verbatim and unresolved is reported, for the builder
	// to expand against the base image's environment (Step.Expand).
	keepUnknown bool
	// varsOnly: only $ references are special (quotes and escapes were
	// removed by an earlier pass): the builder's second expansion.
	varsOnly bool
}

// expandWords does the part of a shell's word processing that Docker
// applies to the instructions it substitutes in (ADD, COPY, ENV, FROM,
// USER, WORKDIR, ...): single quotes are literal, double quotes and the
// escape character protect blanks, and $NAME, ${NAME}, ${NAME:-word},
// ${NAME-word}, ${NAME:+word} and ${NAME+word} are replaced. Nothing is
// executed: no command substitution, no globbing, no arithmetic.
func expandWords(s string, escape byte, lookup lookupFunc, m wordMode) (words []string, unresolved bool, err error) {
	var cur strings.Builder
	inWord := false
	flush := func() {
		if inWord {
			words = append(words, cur.String())
		}
		cur.Reset()
		inWord = false
	}
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == '$':
			text, n, unres, err := expandRef(s[i:], escape, lookup, m)
			if err != nil {
				return nil, false, err
			}
			unresolved = unresolved || unres
			cur.WriteString(text)
			inWord = true
			i += n
		case m.varsOnly:
			cur.WriteByte(c)
			inWord = true
			i++
		case c == escape:
			inWord = true
			if i+1 < len(s) {
				cur.WriteByte(s[i+1])
				i += 2
			} else {
				cur.WriteByte(c)
				i++
			}
		case c == '\'':
			end := strings.IndexByte(s[i+1:], '\'')
			if end < 0 {
				return nil, false, fmt.Errorf("unterminated single quote in %q", s)
			}
			cur.WriteString(s[i+1 : i+1+end])
			inWord = true
			i += end + 2
		case c == '"':
			inWord = true
			i++
			closed := false
			for i < len(s) {
				d := s[i]
				if d == '"' {
					closed = true
					i++
					break
				}
				if d == escape && i+1 < len(s) && (s[i+1] == '"' || s[i+1] == escape || s[i+1] == '$') {
					cur.WriteByte(s[i+1])
					i += 2
					continue
				}
				if d == '$' {
					text, n, unres, err := expandRef(s[i:], escape, lookup, m)
					if err != nil {
						return nil, false, err
					}
					unresolved = unresolved || unres
					cur.WriteString(text)
					i += n
					continue
				}
				cur.WriteByte(d)
				i++
			}
			if !closed {
				return nil, false, fmt.Errorf("unterminated double quote in %q", s)
			}
		case m.split && (c == ' ' || c == '\t'):
			flush()
			i++
		default:
			cur.WriteByte(c)
			inWord = true
			i++
		}
	}
	flush()
	if !m.split && len(words) == 0 {
		words = []string{""}
	}
	return words, unresolved, nil
}

// expandRef expands the reference that starts s (s[0] is '$') and
// returns its text and the bytes it used.
func expandRef(s string, escape byte, lookup lookupFunc, m wordMode) (text string, n int, unresolved bool, err error) {
	if len(s) < 2 {
		return "$", 1, false, nil
	}
	if s[1] != '{' {
		j := 1
		for j < len(s) && isNameByte(s[j], j == 1) {
			j++
		}
		if j == 1 {
			return "$", 1, false, nil // a lone $ is literal, as in sh
		}
		name := s[1:j]
		if v, ok := lookup(name); ok {
			return v, j, false, nil
		}
		if m.keepUnknown {
			return s[:j], j, true, nil
		}
		return "", j, false, nil
	}
	// ${...}: find the matching brace (a default may hold ${...} too).
	depth, end := 0, -1
	for j := 1; j < len(s) && end < 0; j++ {
		switch s[j] {
		case '{':
			depth++
		case '}':
			depth--
			if depth == 0 {
				end = j
			}
		}
	}
	if end < 0 {
		return "", 0, false, fmt.Errorf("unterminated ${ in %q", s)
	}
	body := s[2:end]
	n = end + 1
	j := 0
	for j < len(body) && isNameByte(body[j], j == 0) {
		j++
	}
	if j == 0 {
		return "", 0, false, fmt.Errorf("bad substitution %q: want ${NAME}, ${NAME:-default} or ${NAME:+alternative}", s[:n])
	}
	name, op := body[:j], body[j:]
	colon := strings.HasPrefix(op, ":")
	rest := strings.TrimPrefix(op, ":")
	if op != "" && (rest == "" || (rest[0] != '-' && rest[0] != '+')) {
		return "", 0, false, fmt.Errorf("bad substitution %q: only ${NAME:-default}, ${NAME-default}, ${NAME:+alternative} and ${NAME+alternative} are supported", s[:n])
	}
	v, set := lookup(name)
	if !set && m.keepUnknown {
		return s[:n], n, true, nil
	}
	if op == "" {
		return v, n, false, nil
	}
	word := rest[1:]
	w, unres, err := expandWords(word, escape, lookup, wordMode{keepUnknown: m.keepUnknown, varsOnly: m.varsOnly})
	if err != nil {
		return "", 0, false, err
	}
	use := set && (!colon || v != "") // the variable counts as present
	switch rest[0] {
	case '-':
		if use {
			return v, n, false, nil
		}
		return w[0], n, unres, nil
	default: // '+'
		if use {
			return w[0], n, unres, nil
		}
		return "", n, false, nil
	}
}

func isNameByte(c byte, first bool) bool {
	return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (!first && c >= '0' && c <= '9')
}

// Expand replaces $NAME and ${NAME...} references in s with values from
// env ("K=V" entries, the last one of a name wins): what the builder does
// with a Step marked Expand. Unset names expand to "".
func Expand(s string, env []string) (string, error) {
	vars := envMap(env)
	w, _, err := expandWords(s, '\\', func(n string) (string, bool) { v, ok := vars[n]; return v, ok }, wordMode{varsOnly: true})
	if err != nil {
		return "", err
	}
	return w[0], nil
}

func envMap(env []string) map[string]string {
	m := make(map[string]string, len(env))
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			m[k] = v
		}
	}
	return m
}
