// Package strictjson checks JSON documents against the shape of a Go type
// before they are decoded: an unknown key, a repeated key, a value of the
// wrong type or a document nested too deep is refused with the path of the
// field ("files[2].mode"). encoding/json alone matches keys
// case-insensitively, lets a repeated key win silently and names neither
// the index nor an unknown nested key.
//
// It also owns the one rule for writing a field path (JoinField), which
// the manifest's YAML/JSON decoder uses too, so that every error Moat
// reports names a field the same way. It reads untrusted bytes: it must
// never panic, and a hostile key must never be able to forge an error
// message.
package strictjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// MaxDepth bounds nesting; the deepest legitimate value (a manifest's
// network.allow list) is four levels down.
const MaxDepth = 32

// Kind says what is wrong with a document.
type Kind int

const (
	// Malformed is JSON that does not parse, nests too deep, repeats a
	// key or has a key the type does not know: the request is not
	// understood.
	Malformed Kind = iota
	// WrongType is a value of the wrong JSON type for its field: the
	// field's value is invalid. Its Message starts with the field.
	WrongType
	// Unsupported is a type Check has no rule for: a bug in the caller's
	// type, never the document's fault.
	Unsupported
)

// Error is why a document was refused.
type Error struct {
	Kind Kind
	// Field is the path of the offending field ("" for the document).
	Field   string
	Message string
}

func (e *Error) Error() string { return e.Message }

func malformed(field, format string, args ...any) *Error {
	return &Error{Kind: Malformed, Field: field, Message: fmt.Sprintf(format, args...)}
}

// Check walks data against the shape of the Go type t. Values of types
// that decode themselves (json.Unmarshaler, e.g. json.RawMessage) are only
// checked to be well-formed. Struct fields are matched by their json tag
// names, exactly.
func Check(data []byte, t reflect.Type) *Error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	w := walker{dec: dec}
	tok, err := dec.Token()
	if err != nil {
		return syntaxError(err)
	}
	if e := w.value(tok, t, "", 0); e != nil {
		return e
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return malformed("", "malformed JSON: unexpected data after the top-level object")
	}
	return nil
}

// Decode checks data against v's type with Check, then decodes it into v
// (a pointer).
func Decode(data []byte, v any) *Error {
	if e := Check(data, reflect.TypeOf(v).Elem()); e != nil {
		return e
	}
	if err := json.Unmarshal(data, v); err != nil {
		// Check accepted the shape; what is left is e.g. a number out
		// of range.
		return malformed("", "malformed JSON: %s", strings.TrimPrefix(err.Error(), "json: "))
	}
	return nil
}

func syntaxError(err error) *Error {
	if errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	return malformed("", "malformed JSON: %s", strings.TrimPrefix(err.Error(), "json: "))
}

type walker struct {
	dec *json.Decoder
}

var unmarshalerType = reflect.TypeFor[json.Unmarshaler]()

func (w *walker) next() (json.Token, *Error) {
	tok, err := w.dec.Token()
	if err != nil {
		return nil, syntaxError(err)
	}
	return tok, nil
}

func (w *walker) value(tok json.Token, t reflect.Type, path string, depth int) *Error {
	if depth > MaxDepth {
		return malformed(path, "malformed JSON: nested more than %d levels deep", MaxDepth)
	}
	if tok == nil {
		return nil // null leaves the zero value: "not given"
	}
	if reflect.PointerTo(t).Implements(unmarshalerType) {
		return w.skip(tok, path, depth)
	}
	switch t.Kind() {
	case reflect.Pointer:
		return w.value(tok, t.Elem(), path, depth)
	case reflect.Struct:
		if d, ok := tok.(json.Delim); !ok || d != '{' {
			return typeError(tok, path, "an object")
		}
		fields, names := Fields(t)
		seen := map[string]bool{}
		for w.dec.More() {
			k, e := w.next()
			if e != nil {
				return e
			}
			key := k.(string) // object keys are strings, or Token failed
			field := JoinField(path, key)
			if seen[key] {
				return malformed(field, "%s is given twice; give each key once", field)
			}
			seen[key] = true
			ft, ok := fields[key]
			if !ok {
				where := "at the top level"
				if path != "" {
					where = "in " + path
				}
				return malformed(field, "unknown field %s; accepted %s: %s", field, where, strings.Join(names, ", "))
			}
			v, e := w.next()
			if e != nil {
				return e
			}
			if e := w.value(v, ft, field, depth+1); e != nil {
				return e
			}
		}
		_, e := w.next()
		return e
	case reflect.Map:
		if d, ok := tok.(json.Delim); !ok || d != '{' {
			return typeError(tok, path, "an object of names to strings")
		}
		seen := map[string]bool{}
		for w.dec.More() {
			k, e := w.next()
			if e != nil {
				return e
			}
			key := k.(string)
			field := JoinField(path, key)
			if seen[key] {
				return malformed(field, "%s is given twice; give each key once", field)
			}
			seen[key] = true
			v, e := w.next()
			if e != nil {
				return e
			}
			if e := w.value(v, t.Elem(), field, depth+1); e != nil {
				return e
			}
		}
		_, e := w.next()
		return e
	case reflect.Slice:
		if d, ok := tok.(json.Delim); !ok || d != '[' {
			return typeError(tok, path, "a list")
		}
		for i := 0; w.dec.More(); i++ {
			v, e := w.next()
			if e != nil {
				return e
			}
			if e := w.value(v, t.Elem(), fmt.Sprintf("%s[%d]", path, i), depth+1); e != nil {
				return e
			}
		}
		_, e := w.next()
		return e
	case reflect.String:
		if _, ok := tok.(string); !ok {
			return typeError(tok, path, "a string")
		}
	case reflect.Bool:
		if _, ok := tok.(bool); !ok {
			return typeError(tok, path, "true or false")
		}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		n, ok := tok.(json.Number)
		if !ok {
			return typeError(tok, path, "a whole number")
		}
		if _, err := strconv.ParseInt(n.String(), 10, t.Bits()); err != nil {
			return &Error{Kind: WrongType, Field: path, Message: fmt.Sprintf("%s is %s: give a whole number from %d to %d", path, n, int64(-1)<<(t.Bits()-1), int64(1)<<(t.Bits()-1)-1)}
		}
	default:
		// Only reachable when a wire type gains a field of a kind this
		// walker does not know; the callers' wire-type tests catch that.
		return &Error{Kind: Unsupported, Field: path, Message: fmt.Sprintf("strictjson: no rule for %s at %s", t, path)}
	}
	return nil
}

// skip consumes the rest of a value that decodes itself.
func (w *walker) skip(tok json.Token, path string, depth int) *Error {
	d, ok := tok.(json.Delim)
	if !ok {
		return nil
	}
	if d != '{' && d != '[' {
		return malformed(path, "malformed JSON: unexpected %q", rune(d))
	}
	for level := 1; level > 0; {
		if depth+level > MaxDepth {
			return malformed(path, "malformed JSON: nested more than %d levels deep", MaxDepth)
		}
		t, e := w.next()
		if e != nil {
			return e
		}
		if d, ok := t.(json.Delim); ok {
			if d == '{' || d == '[' {
				level++
			} else {
				level--
			}
		}
	}
	return nil
}

func typeError(tok json.Token, path, want string) *Error {
	var got string
	switch t := tok.(type) {
	case json.Delim:
		got = map[json.Delim]string{'{': "an object", '[': "a list"}[t]
	case string:
		got = "a string"
	case json.Number:
		got = "a number"
	case bool:
		got = "a boolean"
	}
	msg := fmt.Sprintf("is %s; expected %s", got, want)
	if path != "" {
		msg = path + ": " + msg
	}
	return &Error{Kind: WrongType, Field: path, Message: msg}
}

// Fields maps the JSON names of struct type t's exported fields to their
// types, and lists the names sorted.
func Fields(t reflect.Type) (map[string]reflect.Type, []string) {
	fields := map[string]reflect.Type{}
	var names []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if !f.IsExported() || name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		fields[name] = f.Type
		names = append(names, name)
	}
	slices.Sort(names)
	return fields, names
}

// JoinField appends key to a dotted field path ("files[2]" + "mode"). A
// key that is not a plain name (PlainKey) is quoted and shortened to 40
// bytes, so that a hostile key cannot forge an error message or make a
// path ambiguous.
func JoinField(path, key string) string {
	if !PlainKey(key) {
		key = strconv.Quote(shorten(key, 40))
	}
	if path == "" {
		return key
	}
	return path + "." + key
}

// PlainKey reports whether s can stand in a field path as it is: 1 to 64
// ASCII letters, digits, '_' and '-'. A '.' is not plain: it would read as
// a level of the path.
func PlainKey(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for _, c := range []byte(s) {
		if !(c == '_' || c == '-' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// shorten cuts s to at most n bytes at a rune boundary and marks the cut
// with "...".
func shorten(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "..."
}
