package output

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestSanitize(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want string
	}{
		{name: "plain text unchanged", in: "hello, world\n", want: "hello, world\n"},
		{name: "tab newline crlf kept", in: "a\tb\r\nc", want: "a\tb\r\nc"},
		{name: "bare CR overwriting a line", in: "rm -rf ~\rls -l   \n", want: `rm -rf ~\rls -l   ` + "\n"},
		{name: "CR CR LF: the first CR is bare", in: "a\r\r\n", want: `a\r` + "\r\n"},
		{name: "CR at the end", in: "50%\r", want: `50%\r`},
		{name: "unicode kept", in: "héllo 世界 😀", want: "héllo 世界 😀"},
		{name: "empty", in: "", want: ""},
		{name: "ESC CSI color", in: "\x1b[31mred\x1b[0m", want: `\x1b[31mred\x1b[0m`},
		{name: "OSC 52 clipboard write", in: "\x1b]52;c;ZWNobyBwd25lZA==\x07", want: `\x1b]52;c;ZWNobyBwd25lZA==\x07`},
		{name: "title set with ST", in: "\x1b]0;evil\x1b\\", want: `\x1b]0;evil\x1b\`},
		{name: "NUL and BEL and backspace", in: "a\x00b\x07c\x08", want: `a\x00b\x07c\x08`},
		{name: "DEL", in: "x\x7f", want: `x\x7f`},
		{name: "C1 CSI as UTF-8", in: "\u009b31m", want: `\u009b31m`},
		{name: "8-bit CSI raw byte", in: "\x9b31m", want: `\x9b31m`},
		{name: "invalid utf-8", in: "\xff\xfeok", want: `\xff\xfeok`},
		{name: "bidi override", in: "access\u202e denied", want: `access\u202e denied`},
		{name: "bidi isolate", in: "\u2066x\u2069", want: `\u2066x\u2069`},
		{name: "bidi marks", in: "a\u200eb\u200fc\u061cd", want: `a\u200eb\u200fc\u061cd`},
		{name: "all embeddings and overrides", in: "\u202a\u202b\u202c\u202d\u202e", want: `\u202a\u202b\u202c\u202d\u202e`},
		{name: "8-bit OSC as UTF-8", in: "\u009d0;title\u009c", want: `\u009d0;title\u009c`},
		{name: "last C1", in: "\u0080\u009f\u00a0", want: `\u0080\u009f` + "\u00a0"},
		{name: "truncated rune", in: "ab\xe2\x82", want: `ab\xe2\x82`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := string(Sanitize([]byte(tc.in))); got != tc.want {
				t.Errorf("Sanitize(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

func TestSanitizeNoControlBytesOut(t *testing.T) {
	var in []byte
	for i := range 256 {
		in = append(in, byte(i))
	}
	out := Sanitize(in)
	for _, c := range out {
		if (c < 0x20 && c != '\n' && c != '\t') || c == 0x7f || c >= 0x80 {
			t.Fatalf("Sanitize left byte %#x in %q", c, out)
		}
	}
}

// unsafeOut returns the first character in b that must not reach a
// terminal in a stream: a C0 control other than \n, \t and the CR of a
// CRLF, DEL, a C1 control (raw byte or UTF-8), a bidi formatting
// character, or a byte that is not UTF-8; "" when there is none.
func unsafeOut(b []byte) string {
	for i := 0; i < len(b); {
		r, size := utf8.DecodeRune(b[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			return string(b[i : i+1])
		case r == '\r' && (i+1 == len(b) || b[i+1] != '\n'):
			return "\r"
		case r == '\n', r == '\t', r == '\r':
		case r < 0x20, r == 0x7f, r >= 0x80 && r <= 0x9f,
			r == 0x61c, r == 0x200e, r == 0x200f, r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069:
			return string(r)
		}
		i += size
	}
	return ""
}

func TestSanitizingWriter(t *testing.T) {
	tests := []struct {
		name   string
		chunks []string
		want   string
	}{
		{name: "rune split across writes", chunks: []string{"a\xe2", "\x82", "\xacb"}, want: "a€b"},
		{name: "escape split across writes", chunks: []string{"x\x1b", "[2J"}, want: `x\x1b[2J`},
		{name: "dangling lead byte flushed escaped", chunks: []string{"ok\xf0\x9f"}, want: `ok\xf0\x9f`},
		{name: "lead byte followed by ascii", chunks: []string{"\xe2", "abc"}, want: `\xe2abc`},
		{name: "CRLF split across writes", chunks: []string{"line\r", "\nnext"}, want: "line\r\nnext"},
		{name: "bare CR split across writes", chunks: []string{"rm -rf ~\r", "ls"}, want: `rm -rf ~\rls`},
		{name: "CR at the end flushed escaped", chunks: []string{"50%\r"}, want: `50%\r`},
		{name: "CR then a split rune", chunks: []string{"a\r\xe2", "\x80\xae"}, want: `a\r\u202e`},
		{name: "CR alone in each write", chunks: []string{"\r", "\r", "\n"}, want: `\r` + "\r\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			w := NewSanitizingWriter(&buf)
			for _, c := range tc.chunks {
				if n, err := w.Write([]byte(c)); n != len(c) || err != nil {
					t.Fatalf("Write(%q) = %d, %v", c, n, err)
				}
			}
			if err := w.Flush(); err != nil {
				t.Fatal(err)
			}
			if got := buf.String(); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestDisplay(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want string
	}{
		{name: "plain name as is", in: "results/out.txt", want: "results/out.txt"},
		{name: "spaces and unicode as is", in: "my résumé 世界.txt", want: "my résumé 世界.txt"},
		{name: "OSC 52, title and clear quoted", in: "a\x1b]52;c;cm0=\x07\x1b]0;t\x07\x1b[2J", want: `"a\x1b]52;c;cm0=\a\x1b]0;t\a\x1b[2J"`},
		{name: "newline quoted: no forged line", in: "x\nmoat: copied 0 file(s)", want: `"x\nmoat: copied 0 file(s)"`},
		{name: "bare CR quoted", in: "evil\rgood", want: `"evil\rgood"`},
		{name: "tab quoted", in: "a\tb", want: `"a\tb"`},
		{name: "C1 quoted", in: "\u009b2J", want: `"\u009b2J"`},
		{name: "bidi override quoted", in: "gpj.\u202eexe", want: `"gpj.\u202eexe"`},
		{name: "bidi mark quoted", in: "a\u200fb", want: `"a\u200fb"`},
		{name: "invalid UTF-8 quoted", in: "a\xffb", want: `"a\xffb"`},
		{name: "raw 8-bit CSI quoted", in: "\x9b2J", want: `"\x9b2J"`},
		{name: "empty", in: "", want: ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := Display(tc.in)
			if got != tc.want {
				t.Errorf("Display(%q) = %q, want %q", tc.in, got, tc.want)
			}
			if bad := unsafeOut([]byte(got)); bad != "" || strings.ContainsAny(got, "\n\t\r") {
				t.Errorf("Display(%q) = %q carries %q", tc.in, got, bad)
			}
		})
	}
}

func TestEscapeJSON(t *testing.T) {
	hostile := map[string]string{
		"data": "x\x1b]52;c;AAAA\x07\u009b2J\u009d0;t\u009c\u202eevil\u202c\u2066\u200e\u061c\x7f\r\n\tend",
		"path": "gpj.\u202eexe",
		"ok":   "héllo <b> & 世界",
	}
	var buf bytes.Buffer
	if err := EncodeJSON(&buf, hostile, "  "); err != nil {
		t.Fatal(err)
	}
	out := buf.Bytes()
	for _, c := range out {
		if (c < 0x20 && c != '\n') || c == 0x7f {
			t.Errorf("control byte %#x left in %q", c, out)
		}
	}
	if bad := unsafeOut(out); bad != "" {
		t.Errorf("EncodeJSON left %q in %s", bad, out)
	}
	for _, want := range []string{`\u001b]52`, `\u009b2J`, `\u202eevil`, `\u007f`, `\u200e`, `\u061c`, "héllo", "世界", "\n  \""} {
		if !bytes.Contains(out, []byte(want)) {
			t.Errorf("EncodeJSON output lacks %q: %s", want, out)
		}
	}
	var back map[string]string
	if err := json.Unmarshal(out, &back); err != nil {
		t.Fatalf("the escaped document does not parse: %v\n%s", err, out)
	}
	for k, v := range hostile {
		if back[k] != v {
			t.Errorf("%s decodes to %q, want %q: the escapes must be lossless", k, back[k], v)
		}
	}
	var plain bytes.Buffer
	json.NewEncoder(&plain).Encode(map[string]string{"ok": "plain"})
	if got := EscapeJSON(plain.Bytes()); !bytes.Equal(got, plain.Bytes()) {
		t.Errorf("EscapeJSON changed a safe document: %q", got)
	}
	if got := string(EscapeJSON([]byte("\"a\xffb\""))); got != `"a\ufffdb"` {
		t.Errorf("EscapeJSON of invalid UTF-8 = %q, want the replacement character escaped", got)
	}
}

func FuzzSanitize(f *testing.F) {
	for _, s := range []string{"plain", "\x1b]52;c;AAAA\x07", "\xc3", "\u202e", "\x9b", "a\rb", "a\r\n", "\u200f\u061c"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		out := Sanitize(b)
		if bad := unsafeOut(out); bad != "" {
			t.Fatalf("Sanitize left %q in %q", bad, out)
		}
		if !bytes.Equal(Sanitize(out), out) {
			t.Fatalf("Sanitize is not idempotent on %q", out)
		}
		if d := Display(string(b)); unsafeOut([]byte(d)) != "" || strings.ContainsAny(d, "\n\t\r") {
			t.Fatalf("Display(%q) = %q carries a control", b, d)
		}
		// Any bytes through a writer, cut anywhere, end up as safe as
		// Sanitize of the whole.
		var buf bytes.Buffer
		w := NewSanitizingWriter(&buf)
		for i := 0; i < len(b); i += 3 {
			w.Write(b[i:min(i+3, len(b))])
		}
		w.Flush()
		if bad := unsafeOut(buf.Bytes()); bad != "" {
			t.Fatalf("SanitizingWriter left %q in %q", bad, buf.Bytes())
		}
		if s := string(b); utf8.ValidString(s) {
			var j bytes.Buffer
			if err := EncodeJSON(&j, s, ""); err != nil {
				t.Fatal(err)
			}
			var back string
			if err := json.Unmarshal(j.Bytes(), &back); err != nil || back != s {
				t.Fatalf("EncodeJSON(%q) = %s decodes to %q, %v", s, j.Bytes(), back, err)
			}
			if bad := unsafeOut(bytes.TrimSuffix(j.Bytes(), []byte("\n"))); bad != "" {
				t.Fatalf("EncodeJSON left %q in %s", bad, j.Bytes())
			}
		}
	})
}
