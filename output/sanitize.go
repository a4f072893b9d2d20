package output

import (
	"bytes"
	"encoding/json"
	"io"
	"strconv"
	"unicode"
	"unicode/utf8"
)

// This file is the one owner of the rule "what may reach a person's
// terminal from a sandbox". Everything Moat prints that a sandbox could
// have chosen (the program's output streamed live, file names in
// messages, host names from the egress log, JSON documents) goes through
// one of the three forms below, all built on unsafeRune:
//
//   - Sanitize / SanitizingWriter: a stream of program output on a
//     terminal. Newlines, tabs and CRLF are kept (it is text to read);
//     everything else unsafe is escaped.
//   - Display: one value inside a line Moat writes (a path, a host, a
//     key name): kept as is when every character is printable, otherwise
//     Go-quoted, so it can neither act on the terminal nor break the line.
//   - EscapeJSON / EncodeJSON: a JSON document: unsafe characters become
//     \uXXXX escapes, which decode to the same string, so the data stays
//     lossless while the bytes stay inert.
//
// A pipe (moat run's streamed stdout and stderr when they are not a
// terminal) gets the program's bytes unchanged: Sanitize is applied only
// where the caller knows a terminal is on the other end.

// unsafeRune reports whether r is a character a terminal acts on, or one
// that changes how the text around it is displayed:
//   - C0 controls (U+0000-U+001F): ESC starts CSI/OSC sequences (OSC 52
//     clipboard writes, OSC 0 titles, CSI 2J screen clears, cursor moves),
//     BEL, BS and CR move or rewrite what is shown;
//   - DEL (U+007F);
//   - C1 controls U+0080-U+009F: U+009B is an 8-bit CSI and U+009D an
//     8-bit OSC on terminals that accept them encoded in UTF-8;
//   - bidirectional formatting characters (U+061C ALM, U+200E LRM,
//     U+200F RLM, U+202A-U+202E embeddings and overrides, U+2066-U+2069
//     isolates): they reorder the characters around them, so "evil.sh"
//     can be shown as "hs.live" ("Trojan Source", CVE-2021-42574).
//
// Newline, tab and the CR of a CRLF are unsafe here too: each form above
// decides which of them it keeps.
func unsafeRune(r rune) bool {
	switch {
	case r < 0x20, r == 0x7f:
		return true
	case r >= 0x80 && r <= 0x9f:
		return true
	case r == 0x061c, r == 0x200e, r == 0x200f:
		return true
	case r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069:
		return true
	}
	return false
}

// Sanitize returns b with everything a terminal could act on escaped, for
// printing untrusted output to a TTY: C0 controls except \n and \t (so ESC,
// and with it CSI, OSC 52 clipboard writes and title setting, are shown as
// \x1b), a CR that does not start a CRLF (a bare CR would let a line
// overwrite what it appears to say) as \r, DEL, C1 controls U+0080-U+009F
// as \u009b, the bidirectional formatting characters of unsafeRune as
// \u202e, and bytes that are not UTF-8 (a raw 8-bit CSI 0x9b among them)
// as \xNN. Everything else is copied as is. It may return b itself when
// nothing needs escaping.
//
// The escapes are for a reader, not a decoder: a program that prints the
// text `\x1b` looks the same as one that prints ESC. The result's JSON
// keeps the exact bytes.
func Sanitize(b []byte) []byte {
	i := 0
	for i < len(b) {
		if c := b[i]; c < utf8.RuneSelf {
			if streamSafe(b, i) {
				i++
				continue
			}
			break
		}
		r, size := utf8.DecodeRune(b[i:])
		if (r == utf8.RuneError && size == 1) || unsafeRune(r) {
			break
		}
		i += size
	}
	if i == len(b) {
		return b
	}
	out := make([]byte, i, len(b)+32)
	copy(out, b[:i])
	for i < len(b) {
		c := b[i]
		if c < utf8.RuneSelf {
			switch {
			case streamSafe(b, i):
				out = append(out, c)
			case c == '\r':
				out = append(out, `\r`...)
			default:
				out = appendHex(out, `\x`, uint32(c), 2)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRune(b[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			out = appendHex(out, `\x`, uint32(c), 2)
		case unsafeRune(r):
			out = appendHex(out, `\u`, uint32(r), 4)
		default:
			out = append(out, b[i:i+size]...)
		}
		i += size
	}
	return out
}

// streamSafe reports whether the ASCII byte b[i] may reach a terminal in a
// stream: printable, \n, \t, or the CR of a CRLF.
func streamSafe(b []byte, i int) bool {
	switch c := b[i]; c {
	case '\n', '\t':
		return true
	case '\r':
		return i+1 < len(b) && b[i+1] == '\n'
	default:
		return !unsafeRune(rune(c))
	}
}

func appendHex(out []byte, prefix string, v uint32, digits int) []byte {
	const hex = "0123456789abcdef"
	out = append(out, prefix...)
	for d := digits - 1; d >= 0; d-- {
		out = append(out, hex[(v>>(4*uint(d)))&0xf])
	}
	return out
}

// Display returns s for use as one value inside a line Moat prints (a
// file name the sandbox chose, a host name from the egress log, a key
// name): s itself when it is valid UTF-8 made only of printable
// characters (unicode.IsPrint: letters, marks, numbers, punctuation,
// symbols and the ASCII space), otherwise s Go-quoted, with every
// unprintable character, newline and tab included, escaped. Everything
// unsafeRune names is unprintable, so the quoted form never carries one;
// the quotes show where the value starts and ends.
func Display(s string) string {
	if printable(s) {
		return s
	}
	return strconv.Quote(s)
}

func printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if unsafeRune(r) || !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}

// EscapeJSON returns the JSON text b (as encoding/json writes it: valid
// UTF-8, control characters inside strings already escaped) with every
// remaining character unsafeRune names written as a \uXXXX escape, except
// the newlines of indentation. encoding/json leaves DEL, the C1 controls
// and the bidirectional formatting characters raw; escaped, they decode to
// the same strings, so the document is the same value and nothing in it
// can act on a terminal it is printed to. A byte that is not UTF-8 (never
// in encoding/json's output) becomes \ufffd, as a decoder would read it.
// It may return b itself when nothing needs escaping.
func EscapeJSON(b []byte) []byte {
	var out []byte
	last := 0
	for i := 0; i < len(b); {
		c := b[i]
		if c < utf8.RuneSelf && (c == '\n' || !unsafeRune(rune(c))) {
			i++
			continue
		}
		r, size := utf8.DecodeRune(b[i:])
		if c >= utf8.RuneSelf && !unsafeRune(r) && !(r == utf8.RuneError && size == 1) {
			i += size
			continue
		}
		if out == nil {
			out = make([]byte, 0, len(b)+32)
		}
		out = append(out, b[last:i]...)
		out = appendHex(out, `\u`, uint32(r), 4)
		i += size
		last = i
	}
	if out == nil {
		return b
	}
	return append(out, b[last:]...)
}

// EncodeJSON writes v to w as json.Encoder does (HTML characters escaped,
// a newline after the document, indented by indent when it is not
// empty), passed through EscapeJSON: the one way Moat's commands print
// JSON that may hold what a sandbox wrote.
func EncodeJSON(w io.Writer, v any, indent string) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	if indent != "" {
		enc.SetIndent("", indent)
	}
	if err := enc.Encode(v); err != nil {
		return err
	}
	_, err := w.Write(EscapeJSON(buf.Bytes()))
	return err
}

// SanitizingWriter applies Sanitize to a stream written in chunks, holding
// back what the next chunk decides: a multi-byte rune split between two
// writes (so it is not escaped as bytes), and a trailing CR (kept if a \n
// follows, escaped otherwise). Call Flush at the end of the stream.
type SanitizingWriter struct {
	w       io.Writer
	pending []byte // an incomplete rune or a CR from the previous Write, < utf8.UTFMax bytes
}

// NewSanitizingWriter returns a SanitizingWriter writing to w (a terminal).
func NewSanitizingWriter(w io.Writer) *SanitizingWriter {
	return &SanitizingWriter{w: w, pending: make([]byte, 0, utf8.UTFMax)}
}

// Write sanitizes p and writes it, except a trailing incomplete rune or CR.
func (s *SanitizingWriter) Write(p []byte) (int, error) {
	data := p
	if len(s.pending) > 0 {
		data = append(append(make([]byte, 0, len(s.pending)+len(p)), s.pending...), p...)
		s.pending = s.pending[:0]
	}
	n := completeLen(data)
	if n == len(data) && n > 0 && data[n-1] == '\r' {
		n-- // CRLF or a bare CR: the next write says
	}
	s.pending = append(s.pending, data[n:]...)
	if n == 0 {
		return len(p), nil
	}
	if _, err := s.w.Write(Sanitize(data[:n])); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Flush writes a held-back incomplete rune or CR, escaped.
func (s *SanitizingWriter) Flush() error {
	if len(s.pending) == 0 {
		return nil
	}
	b := Sanitize(s.pending)
	s.pending = s.pending[:0]
	_, err := s.w.Write(b)
	return err
}

// UnsafeName reports whether a name (a file name in a diff) holds a
// character a terminal acts on or that reorders text (unsafeRune), or a
// byte that is not UTF-8 (a raw 8-bit CSI, 0x9b, among them): such a name
// is shown escaped (Display) and flagged.
func UnsafeName(s string) bool {
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if (r == utf8.RuneError && size == 1) || unsafeRune(r) {
			return true
		}
		i += size
	}
	return false
}
