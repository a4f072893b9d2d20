package output

import (
	"bytes"
	"testing"
)

func TestSanitize(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want string
	}{
		{name: "plain text unchanged", in: "hello, world\n", want: "hello, world\n"},
		{name: "tab newline cr kept", in: "a\tb\r\nc", want: "a\tb\r\nc"},
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
		if (c < 0x20 && c != '\n' && c != '\t' && c != '\r') || c == 0x7f || c >= 0x80 {
			t.Fatalf("Sanitize left byte %#x in %q", c, out)
		}
	}
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

func FuzzSanitize(f *testing.F) {
	for _, s := range []string{"plain", "\x1b]52;c;AAAA\x07", "\xc3", "\u202e", "\x9b"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		out := Sanitize(b)
		for _, c := range out {
			if (c < 0x20 && c != '\n' && c != '\t' && c != '\r') || c == 0x7f {
				t.Fatalf("control byte %#x left in %q", c, out)
			}
		}
		if !bytes.Equal(Sanitize(out), out) {
			t.Fatalf("Sanitize is not idempotent on %q", out)
		}
	})
}
