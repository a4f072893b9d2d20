package service

import (
	"slices"
	"testing"
)

func TestCommand(t *testing.T) {
	tests := []struct {
		name           string
		argv           []string
		code, language string
		want           []string
		wantField      string
	}{
		{name: "argv", argv: []string{"ls", "-l"}, want: []string{"ls", "-l"}},
		{name: "python", code: "print(1)", language: "python", want: []string{"python3", "-c", "print(1)"}},
		{name: "bash", code: "echo", language: "bash", want: []string{"bash", "-c", "echo"}},
		{name: "sh", code: "echo", language: "sh", want: []string{"sh", "-c", "echo"}},
		{name: "both", argv: []string{"ls"}, code: "x", language: "sh", wantField: "code"},
		{name: "nothing", wantField: "argv"},
		{name: "empty argv[0]", argv: []string{"", "x"}, wantField: "argv[0]"},
		{name: "NUL in argv", argv: []string{"ls", "a\x00b"}, wantField: "argv[1]"},
		{name: "language without code", language: "python", wantField: "code"},
		{name: "code without language", code: "x", wantField: "language"},
		{name: "NUL in code", code: "a\x00", language: "sh", wantField: "code"},
		{name: "unknown language", code: "x", language: "cobol", wantField: "language"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, e := Command(tc.argv, tc.code, tc.language)
			switch {
			case tc.wantField != "" && (e == nil || e.Field != tc.wantField || e.Kind != Invalid):
				t.Errorf("Command = %q, %v; want an invalid_field error on %s", got, e, tc.wantField)
			case tc.wantField == "" && (e != nil || !slices.Equal(got, tc.want)):
				t.Errorf("Command = %q, %v; want %q", got, e, tc.want)
			}
		})
	}
}
