package runid

import (
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	tests := []struct {
		name string
		id   string
		ok   bool
		want string // part of the error
	}{
		{name: "engine id (16 hex)", id: "3f2a9c0011aabbcc", ok: true},
		{name: "dashed", id: "run-123", ok: true},
		{name: "exec id", id: "3f2a9c0011aabbcc-e-1", ok: true},
		{name: "test id", id: "cgjoin-17f0c0ffee", ok: true},
		{name: "one character", id: "a", ok: true},
		{name: "digit first", id: "0", ok: true},
		{name: "64 characters", id: strings.Repeat("a", 64), ok: true},
		{name: "empty", id: "", want: "1 to 64"},
		{name: "65 characters", id: strings.Repeat("a", 65), want: "1 to 64"},
		{name: "65 NULs", id: string(make([]byte, 65)), want: "1 to 64"},
		{name: "upper case", id: "ABCxyz09", want: `character 'A'`},
		{name: "leading dash (a flag to runsc)", id: "-rf", want: "must not begin with '-'"},
		{name: "dot", id: ".", want: `character '.'`},
		{name: "dot dot", id: "..", want: `character '.'`},
		{name: "slash", id: "a/b", want: `character '/'`},
		{name: "escape", id: "../escape", want: `character '.'`},
		{name: "inner dot", id: "a.b", want: `character '.'`},
		{name: "space", id: "a b", want: `character ' '`},
		{name: "NUL", id: "a\x00b", want: `character '\x00'`},
		{name: "underscore", id: "a_b", want: `character '_'`},
		{name: "non-ASCII", id: "é", want: "character"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := Check(tc.id)
			if tc.ok {
				if err != nil {
					t.Fatalf("Check(%q) = %v, want nil", tc.id, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Check(%q) = %v, want an error containing %q", tc.id, err, tc.want)
			}
			if !strings.HasPrefix(err.Error(), "run id ") {
				t.Errorf("error %q does not name the field", err)
			}
		})
	}
}

func TestCheckClipsLongIDs(t *testing.T) {
	err := Check(strings.Repeat("x", 10000))
	if err == nil || len(err.Error()) > 200 {
		t.Fatalf("Check of a 10000-byte id: %v (%d bytes), want a short error", err, len(err.Error()))
	}
}
