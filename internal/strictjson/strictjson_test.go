package strictjson

import (
	"reflect"
	"strings"
	"testing"
)

type inner struct {
	Mode string `json:"mode"`
}

type doc struct {
	Name  string            `json:"name"`
	Files []inner           `json:"files"`
	Env   map[string]string `json:"env"`
	Wait  *bool             `json:"wait"`
	Rows  int16             `json:"rows"`
}

func TestCheck(t *testing.T) {
	tests := []struct {
		name  string
		in    string
		kind  Kind
		field string
		msg   string // a part of the message
	}{
		{"unknown top-level key", `{"nmae":"x"}`, Malformed, "nmae", "unknown field nmae; accepted at the top level: env, files, name, rows, wait"},
		{"unknown nested key", `{"files":[{"mode":"1"},{"mdoe":"1"}]}`, Malformed, "files[1].mdoe", "accepted in files[1]: mode"},
		{"repeated key", `{"name":"a","name":"b"}`, Malformed, "name", "name is given twice"},
		{"wrong type", `{"files":{}}`, WrongType, "files", "files: is an object; expected a list"},
		{"wrong map value", `{"env":{"A":1}}`, WrongType, "env.A", "env.A: is a number; expected a string"},
		{"hostile key is quoted", `{"env":{"a\nb":1}}`, WrongType, `env."a\nb"`, `env."a\nb": is a number`},
		{"dotted key is quoted", `{"env":{"a.b":1}}`, WrongType, `env."a.b"`, ""},
		{"trailing data", `{} {}`, Malformed, "", "unexpected data after the top-level object"},
		{"syntax", `{"name":`, Malformed, "", "malformed JSON"},
		{"a list for a string", `{"name":[[]]}`, WrongType, "name", "name: is a list; expected a string"},
		{"a string for a number", `{"rows":"24"}`, WrongType, "rows", "rows: is a string; expected a whole number"},
		{"a fraction", `{"rows":2.5}`, WrongType, "rows", "rows is 2.5: give a whole number from -32768 to 32767"},
		{"an exponent", `{"rows":1e3}`, WrongType, "rows", "give a whole number"},
		{"out of range", `{"rows":40000}`, WrongType, "rows", "rows is 40000"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := Check([]byte(tc.in), reflect.TypeFor[doc]())
			if e == nil {
				t.Fatalf("accepted %s", tc.in)
			}
			if e.Kind != tc.kind || e.Field != tc.field || !strings.Contains(e.Message, tc.msg) {
				t.Errorf("Check(%s) = %+v, want kind %d field %q message with %q", tc.in, e, tc.kind, tc.field, tc.msg)
			}
		})
	}
	var d doc
	if e := Decode([]byte(`{"name":"x","files":[{"mode":"0644"}],"env":{"A":"b"},"wait":null,"rows":-24}`), &d); e != nil || d.Name != "x" || d.Files[0].Mode != "0644" || d.Rows != -24 {
		t.Errorf("Decode: %+v, %v", d, e)
	}
}

func TestJoinField(t *testing.T) {
	tests := []struct{ path, key, want string }{
		{"", "name", "name"},
		{"env", "PATH", "env.PATH"},
		{"metadata", "a.b", `metadata."a.b"`},
		{"env", "", `env.""`},
		{"env", strings.Repeat("é", 30), `env."` + strings.Repeat("é", 20) + `..."`},
		{"x", "line\nbreak", `x."line\nbreak"`},
	}
	for _, tc := range tests {
		t.Run(tc.want, func(t *testing.T) {
			if got := JoinField(tc.path, tc.key); got != tc.want {
				t.Errorf("JoinField(%q, %q) = %q, want %q", tc.path, tc.key, got, tc.want)
			}
		})
	}
}
