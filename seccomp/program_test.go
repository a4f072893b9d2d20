package seccomp

import (
	"encoding/base64"
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

func TestProgramJSON(t *testing.T) {
	compiled, err := Default().Compile()
	if err != nil {
		t.Fatal(err)
	}
	for _, prog := range []Program{compiled, {{Code: opRetK, K: 0x7fff0000}}, {{Code: 0xffff, Jt: 0xfe, Jf: 0xfd, K: 0xfffffffc}}} {
		b, err := json.Marshal(prog)
		if err != nil {
			t.Fatal(err)
		}
		if b[0] != '"' {
			t.Fatalf("marshalled as %.20s..., want one base64 string", b)
		}
		var back Program
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(back, prog) {
			t.Fatalf("round trip changed the program (%d instructions -> %d)", len(prog), len(back))
		}
	}
	// The wire form is struct sock_filter's: code, jt, jf, k, little-endian.
	b, _ := json.Marshal(Program{{Code: 0x0015, Jt: 1, Jf: 2, K: 0x01020304}})
	if got, want := string(b), `"FQABAgQDAgE="`; got != want {
		t.Errorf("wire form %s, want %s", got, want)
	}
}

func TestProgramJSONRejects(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`[{"Code":6}]`, "base64 string"},
		{`"not base64!"`, "illegal base64"},
		{`"AAAA"`, "whole number of 8-byte instructions"},
		{`"` + base64.StdEncoding.EncodeToString(make([]byte, (maxInsns+1)*insnBytes)) + `"`, "at most 4096"},
		{`42`, "base64 string"},
	} {
		var p Program
		err := json.Unmarshal([]byte(tc.in), &p)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%.30s: error %v, want one containing %q", tc.in, err, tc.want)
		}
	}
	var p Program = Program{{}}
	if err := json.Unmarshal([]byte(`null`), &p); err != nil || p != nil {
		t.Errorf("null: %v, %v; want an empty program", p, err)
	}
}

// FuzzProgramJSON: whatever arrives decodes to a program that encodes back
// to the same bytes, or is refused; never a panic.
func FuzzProgramJSON(f *testing.F) {
	f.Add([]byte(`"FQABAgQDAgE="`))
	f.Add([]byte(`null`))
	f.Add([]byte(`"AAAA"`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var p Program
		if json.Unmarshal(b, &p) != nil || p == nil {
			return
		}
		if len(p) > maxInsns {
			t.Fatalf("%d instructions accepted", len(p))
		}
		again, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		var q Program
		if err := json.Unmarshal(again, &q); err != nil || !slices.Equal(p, q) {
			t.Fatalf("re-decoding differs: %v", err)
		}
	})
}

// BenchmarkCompileDefault: every cold moat process that starts a native
// sandbox compiles the default policy once (75 µs and 83 KB here, from
// 145 µs and 195 KB before its allocations were sized up front).
func BenchmarkCompileDefault(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Default().Compile(); err != nil {
			b.Fatal(err)
		}
	}
}
