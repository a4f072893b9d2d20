package output

import (
	"io"
	"unicode/utf8"
)

// Sanitize returns b with everything a terminal could act on escaped, for
// printing untrusted output to a TTY: C0 controls except \n, \t and \r
// (so ESC, and with it CSI, OSC 52 clipboard writes and title setting, are
// shown as \x1b), DEL, C1 controls U+0080-U+009F (8-bit CSI/OSC) as \u009b,
// Unicode bidirectional overrides and isolates (U+202A-U+202E,
// U+2066-U+2069: "Trojan Source" reordering) as \u202e, and bytes that are
// not UTF-8 as \xNN. Everything else is copied as is. It may return b itself
// when nothing needs escaping.
func Sanitize(b []byte) []byte {
	i := 0
	for i < len(b) {
		if b[i] < utf8.RuneSelf {
			if safeASCII(b[i]) {
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
			if safeASCII(c) {
				out = append(out, c)
			} else {
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

func safeASCII(c byte) bool {
	return c == '\n' || c == '\t' || c == '\r' || (c >= 0x20 && c != 0x7f)
}

func unsafeRune(r rune) bool {
	return (r >= 0x80 && r <= 0x9f) || (r >= 0x202a && r <= 0x202e) || (r >= 0x2066 && r <= 0x2069)
}

func appendHex(out []byte, prefix string, v uint32, digits int) []byte {
	const hex = "0123456789abcdef"
	out = append(out, prefix...)
	for d := digits - 1; d >= 0; d-- {
		out = append(out, hex[(v>>(4*uint(d)))&0xf])
	}
	return out
}

// SanitizingWriter applies Sanitize to a stream written in chunks, holding
// back a multi-byte rune split between two writes so it is not escaped as
// bytes. Call Flush at the end of the stream.
type SanitizingWriter struct {
	w       io.Writer
	pending []byte // an incomplete rune from the previous Write, < utf8.UTFMax bytes
}

// NewSanitizingWriter returns a SanitizingWriter writing to w (a terminal).
func NewSanitizingWriter(w io.Writer) *SanitizingWriter {
	return &SanitizingWriter{w: w, pending: make([]byte, 0, utf8.UTFMax)}
}

// Write sanitizes p and writes it, except a trailing incomplete rune.
func (s *SanitizingWriter) Write(p []byte) (int, error) {
	data := p
	if len(s.pending) > 0 {
		data = append(append(make([]byte, 0, len(s.pending)+len(p)), s.pending...), p...)
		s.pending = s.pending[:0]
	}
	n := completeLen(data)
	s.pending = append(s.pending, data[n:]...)
	if n == 0 {
		return len(p), nil
	}
	if _, err := s.w.Write(Sanitize(data[:n])); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Flush writes a held-back incomplete rune, escaped.
func (s *SanitizingWriter) Flush() error {
	if len(s.pending) == 0 {
		return nil
	}
	b := Sanitize(s.pending)
	s.pending = s.pending[:0]
	_, err := s.w.Write(b)
	return err
}
