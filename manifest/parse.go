package manifest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"

	"github.com/moat-sandbox/moat/internal/strictjson"
	"github.com/moat-sandbox/moat/internal/suggest"
)

// MaxBytes bounds a manifest document. A real manifest is a few hundred
// bytes; the cap keeps a hostile API body or a mistaken path (a log file,
// /dev/zero) from costing more than a megabyte.
const MaxBytes = 1 << 20

// Default returns the manifest that grants only the defaults: image python,
// tier native, no inputs, no network, no environment, and the default limits
// listed in the package's range table. It passes Validate.
func Default() *Manifest {
	return &Manifest{
		Image:     "python",
		Tier:      "native",
		Inputs:    []Input{},
		Workspace: Workspace{Size: 256 * MiB, Files: 10000},
		Resources: Resources{
			CPUs:        1,
			Memory:      512 * MiB,
			Pids:        128,
			Timeout:     Duration(30e9),
			CPUTime:     Duration(30e9),
			OpenFiles:   256,
			FileSize:    64 * MiB,
			StdoutBytes: 1 * MiB,
			StderrBytes: 1 * MiB,
		},
		Network: Network{Mode: "none", MaxConnections: 16, ConnectionsPerSecond: 20, MaxBytesOut: 64 * MiB, MaxBytesIn: 512 * MiB, NamesPerSecond: 5},
		Env:     map[string]string{},
	}
}

// Load reads the manifest file at path (at most MaxBytes), parses it with
// Parse and resolves relative input paths against the file's directory with
// ResolveInputs. Errors name the file.
func Load(path string) (*Manifest, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read manifest: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read manifest %s: %w", path, err)
	}
	m, err := Parse(data, path)
	if err != nil {
		return nil, err
	}
	if err := m.ResolveInputs(filepath.Dir(path)); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return m, nil
}

// Parse decodes a manifest document, applies defaults to everything it
// leaves out and validates the result. filename is used in errors and to
// pick the syntax: ".json" is JSON, ".yaml" and ".yml" are YAML, anything
// else (including "") is JSON when the first non-blank byte is '{' and YAML
// otherwise.
//
// The document must be one YAML document (or one JSON value) holding a
// mapping. Unknown keys at any level, duplicate keys, wrong types, YAML
// anchors and aliases, and invalid UTF-8 are rejected; a null value (or an
// empty document) means "use the default". Relative input paths are left as
// written: call ResolveInputs, or use Load.
//
// Errors are *FieldError values joined with errors.Join, prefixed with
// filename; syntax errors are plain errors.
func Parse(data []byte, filename string) (m *Manifest, err error) {
	name := filename
	if name == "" {
		name = "manifest"
	}
	defer func() {
		// Parsing untrusted bytes must not take a server down. A panic here
		// is a bug: the fuzz test looks for this message.
		if r := recover(); r != nil {
			m, err = nil, fmt.Errorf("%s: internal error while parsing (a bug in moat, please report): %v", name, r)
		}
	}()
	if len(data) > MaxBytes {
		return nil, fmt.Errorf("%s: is larger than %d bytes; a manifest is a short document", name, MaxBytes)
	}
	if !utf8.Valid(data) {
		return nil, fmt.Errorf("%s: is not valid UTF-8", name)
	}
	var root *yaml.Node
	if isJSON(data, filename) {
		root, err = parseJSON(data)
	} else {
		root, err = parseYAML(data)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}

	m = Default()
	var errs errorList
	d := decoder{errs: &errs, seen: map[string]bool{}}
	switch {
	case root == nil || isNull(root):
		// An empty document grants the defaults.
	case root.Kind != yaml.MappingNode:
		errs.add("", "", "the document is "+describeNode(root)+"; a manifest is a mapping of keys such as image, inputs, resources")
	default:
		d.decode(root, reflect.ValueOf(m).Elem(), "")
	}

	// Defaults that depend on other fields.
	if !d.seen["resources.cpu_time"] {
		m.Resources.CPUTime = m.Resources.Timeout
	}
	for i := range m.Secrets {
		if m.Secrets[i].Env == "" {
			m.Secrets[i].Env = DefaultSecretEnv(m.Secrets[i].Name)
		}
	}
	for i := range m.Inputs {
		if m.Inputs[i].Dst == "" {
			m.Inputs[i].Dst = defaultDst(m.Inputs[i].Src)
		}
	}
	// Validate even after decoding problems, so one run reports all of
	// them; a field that failed to decode kept its (valid) default and
	// adds no second error.
	m.validate(&errs)
	if err := errs.err(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return m, nil
}

// ResolveInputs makes every relative inputs[i].src absolute against baseDir
// and checks that it exists (without following a final symlink: what a
// symlink in an input may do is the workspace package's policy). Errors are
// *FieldError values naming inputs[i].src.
func (m *Manifest) ResolveInputs(baseDir string) error {
	base, err := filepath.Abs(baseDir)
	if err != nil {
		return fmt.Errorf("resolve inputs against %s: %w", baseDir, err)
	}
	var errs errorList
	for i := range m.Inputs {
		in := &m.Inputs[i]
		field := fmt.Sprintf("inputs[%d].src", i)
		if in.Src == "" || strings.IndexByte(in.Src, 0) >= 0 {
			errs.add(field, in.Src, "is not a usable host path")
			continue
		}
		p := in.Src
		if !filepath.IsAbs(p) {
			p = filepath.Join(base, p)
		}
		p = filepath.Clean(p)
		if _, err := os.Lstat(p); err != nil {
			switch {
			case errors.Is(err, fs.ErrNotExist):
				errs.add(field, in.Src, "does not exist (looked for "+p+")")
			case errors.Is(err, fs.ErrPermission):
				errs.add(field, in.Src, "cannot be read: permission denied on "+p)
			default:
				errs.add(field, in.Src, "cannot be read: "+err.Error())
			}
			continue
		}
		in.Src = p
	}
	return errs.err()
}

// defaultDst is the base name of src, or "" when src has no usable one
// ("/", ".", ".."), which Validate then reports as a missing dst.
func defaultDst(src string) string {
	if src == "" {
		return ""
	}
	b := filepath.Base(src)
	if b == "." || b == ".." || b == "/" {
		return ""
	}
	return b
}

var utf8BOM = []byte("\xef\xbb\xbf")

func isJSON(data []byte, filename string) bool {
	switch strings.ToLower(filepath.Ext(filename)) {
	case ".json":
		return true
	case ".yaml", ".yml":
		return false
	}
	t := bytes.TrimLeft(bytes.TrimPrefix(data, utf8BOM), " \t\r\n")
	return len(t) > 0 && t[0] == '{'
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

// parseYAML returns the root node of the only document in data, or nil
// for an empty document.
func parseYAML(data []byte) (*yaml.Node, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, nil
		}
		return nil, err
	}
	var next yaml.Node
	if err := dec.Decode(&next); !errors.Is(err, io.EOF) {
		// A second document is refused even if empty: a manifest that
		// says different things to different readers is a hazard.
		return nil, errors.New("holds more than one YAML document (a line with ---); a manifest is one document")
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 {
		return nil, nil
	}
	return doc.Content[0], nil
}

// maxJSONDepth bounds nesting in a JSON manifest; the schema is four levels
// deep, so anything deeper is an error anyway.
const maxJSONDepth = 32

// parseJSON converts one JSON value into a yaml.Node tree so that JSON and
// YAML share one decoder, one set of type rules and one set of messages.
// encoding/json alone would match keys case-insensitively and let a
// duplicate key silently win.
func parseJSON(data []byte) (*yaml.Node, error) {
	data = bytes.TrimPrefix(data, utf8BOM)
	if len(bytes.TrimLeft(data, " \t\r\n")) == 0 {
		return nil, errors.New("is empty; a JSON manifest is an object such as {\"image\": \"python\"}")
	}
	p := jsonParser{dec: json.NewDecoder(bytes.NewReader(data)), data: data}
	p.dec.UseNumber()
	n, err := p.value(0)
	if errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	if err != nil {
		return nil, fmt.Errorf("invalid JSON: %w", err)
	}
	if _, err := p.dec.Token(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("invalid JSON: unexpected data after the top-level value (line %d)", p.line())
	}
	return n, nil
}

type jsonParser struct {
	dec  *json.Decoder
	data []byte
	// off and lines cache the last position line counted up to, so that
	// numbering every node costs O(len(data)) in all, not O(len(data)²).
	off, lines int
}

// line is the 1-based line of the decoder's position, for errors.
func (p *jsonParser) line() int {
	off := min(int(p.dec.InputOffset()), len(p.data))
	if off > p.off {
		p.lines += bytes.Count(p.data[p.off:off], []byte{'\n'})
		p.off = off
	}
	return 1 + p.lines
}

func (p *jsonParser) value(depth int) (*yaml.Node, error) {
	if depth > maxJSONDepth {
		return nil, fmt.Errorf("nested more than %d levels deep", maxJSONDepth)
	}
	line := p.line()
	tok, err := p.dec.Token()
	if err != nil {
		return nil, err
	}
	scalar := func(tag, value string) *yaml.Node {
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: tag, Value: value, Line: line}
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			n := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", Line: line}
			for p.dec.More() {
				kline := p.line()
				ktok, err := p.dec.Token()
				if err != nil {
					return nil, err
				}
				k, ok := ktok.(string)
				if !ok {
					return nil, fmt.Errorf("object key is not a string (line %d)", kline)
				}
				v, err := p.value(depth + 1)
				if err != nil {
					return nil, err
				}
				key := &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: k, Line: kline}
				n.Content = append(n.Content, key, v)
			}
			if _, err := p.dec.Token(); err != nil { // the closing '}'
				return nil, err
			}
			return n, nil
		case '[':
			n := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq", Line: line}
			for p.dec.More() {
				v, err := p.value(depth + 1)
				if err != nil {
					return nil, err
				}
				n.Content = append(n.Content, v)
			}
			if _, err := p.dec.Token(); err != nil { // the closing ']'
				return nil, err
			}
			return n, nil
		}
		return nil, fmt.Errorf("unexpected %q (line %d)", t, line)
	case string:
		return scalar("!!str", t), nil
	case json.Number:
		if strings.ContainsAny(string(t), ".eE") {
			return scalar("!!float", string(t)), nil
		}
		return scalar("!!int", string(t)), nil
	case bool:
		return scalar("!!bool", strconv.FormatBool(t)), nil
	case nil:
		return scalar("!!null", "null"), nil
	}
	return nil, fmt.Errorf("unexpected token %v (line %d)", tok, line)
}

// decoder fills a Manifest from a yaml.Node tree, following the yaml struct
// tags, and records every problem with the dotted path of its field. It is
// strict where yaml.v3's own decoder is lenient: 128.5 is not an integer,
// "512" in quotes is not a number, 010 is not octal, duplicates are errors.
type decoder struct {
	errs *errorList
	// seen holds the path of every field the document set to a non-null
	// value, for defaults that depend on presence (cpu_time).
	seen map[string]bool
}

var unmarshalerType = reflect.TypeFor[yaml.Unmarshaler]()

func (d *decoder) decode(n *yaml.Node, v reflect.Value, path string) {
	if n.Kind == yaml.AliasNode || n.Anchor != "" {
		d.errs.add(path, "", "uses a YAML anchor or alias; write the value out in full")
		return
	}
	if isNull(n) {
		return // null keeps the default
	}
	d.seen[path] = true
	if v.CanAddr() && v.Addr().Type().Implements(unmarshalerType) {
		err := v.Addr().Interface().(yaml.Unmarshaler).UnmarshalYAML(n)
		if err != nil {
			var fe *FieldError
			if errors.As(err, &fe) {
				d.errs.add(path, fe.Value, fe.Problem)
			} else {
				d.errs.add(path, "", err.Error())
			}
		}
		return
	}
	switch v.Kind() {
	case reflect.Struct:
		d.structFields(n, v, path)
	case reflect.Slice:
		d.list(n, v, path)
	case reflect.Map:
		d.stringMap(n, v, path)
	case reflect.String:
		if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!str" {
			d.typeError(n, path, "a string")
			return
		}
		v.SetString(n.Value)
	case reflect.Int, reflect.Int64:
		if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" {
			d.typeError(n, path, "an integer")
			return
		}
		i, err := parseDecimalInt(n.Value)
		if err != nil || v.OverflowInt(i) {
			d.errs.add(path, n.Value, "is not a plain decimal integer")
			return
		}
		v.SetInt(i)
	case reflect.Bool:
		if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!bool" {
			d.typeError(n, path, "true or false")
			return
		}
		v.SetBool(strings.EqualFold(n.Value, "true"))
	case reflect.Float64:
		tag := n.ShortTag()
		if n.Kind != yaml.ScalarNode || (tag != "!!int" && tag != "!!float") {
			d.typeError(n, path, "a number")
			return
		}
		f, err := parseDecimalFloat(n.Value)
		if err != nil {
			d.errs.add(path, n.Value, "is not a plain decimal number such as 0.5 or 2")
			return
		}
		v.SetFloat(f)
	default:
		// Only reachable if a field of a new type is added to Manifest
		// without teaching the decoder about it.
		d.errs.add(path, "", "has a type the manifest decoder does not support ("+v.Type().String()+")")
	}
}

func (d *decoder) typeError(n *yaml.Node, path, want string) {
	value := ""
	if n.Kind == yaml.ScalarNode {
		value = n.Value
	}
	problem := "is " + describeNode(n) + "; expected " + want
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!str" && want != "a string" {
		problem += " (remove the quotes)"
	} else if n.Kind == yaml.ScalarNode && want == "a string" {
		problem += " (put it in quotes)"
	}
	d.errs.add(path, value, problem)
}

// structFields decodes a mapping into the struct v by yaml tag names.
func (d *decoder) structFields(n *yaml.Node, v reflect.Value, path string) {
	if n.Kind != yaml.MappingNode {
		d.typeError(n, path, "a mapping")
		return
	}
	t := v.Type()
	var names []string
	index := map[string]int{}
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if !f.IsExported() || name == "" || name == "-" {
			continue
		}
		names = append(names, name)
		index[name] = i
	}
	first := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		key, ok := d.key(k, path)
		if !ok {
			continue
		}
		field := strictjson.JoinField(path, key)
		if line, dup := first[key]; dup {
			d.errs.add(field, "", fmt.Sprintf("is given twice (lines %d and %d); give each key once", line, k.Line))
			continue
		}
		first[key] = k.Line
		fi, known := index[key]
		if !known {
			d.errs.add(field, "", unknownKeyProblem(key, path, names))
			continue
		}
		d.decode(val, v.Field(fi), field)
	}
}

// key returns the text of a mapping key, which must be a plain scalar.
func (d *decoder) key(k *yaml.Node, path string) (string, bool) {
	if k.Kind == yaml.AliasNode || k.Anchor != "" {
		d.errs.add(path, "", "uses a YAML anchor or alias as a key; write the key out in full")
		return "", false
	}
	if k.Kind != yaml.ScalarNode {
		d.errs.add(path, "", "has a key that is "+describeNode(k)+"; keys are plain names")
		return "", false
	}
	return k.Value, true
}

func (d *decoder) list(n *yaml.Node, v reflect.Value, path string) {
	if n.Kind != yaml.SequenceNode {
		d.typeError(n, path, "a list")
		return
	}
	s := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
	for i, item := range n.Content {
		d.decode(item, s.Index(i), fmt.Sprintf("%s[%d]", path, i))
	}
	v.Set(s)
}

// stringMap decodes a mapping of names to strings (env). Names are checked
// by Validate; here a value must be a string, and null is refused because
// "FOO:" is more likely a mistake than a request for an empty value.
func (d *decoder) stringMap(n *yaml.Node, v reflect.Value, path string) {
	if n.Kind != yaml.MappingNode {
		d.typeError(n, path, "a mapping of names to strings")
		return
	}
	m := reflect.MakeMapWithSize(v.Type(), len(n.Content)/2)
	first := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		key, ok := d.key(k, path)
		if !ok {
			continue
		}
		field := strictjson.JoinField(path, key)
		if line, dup := first[key]; dup {
			d.errs.add(field, "", fmt.Sprintf("is given twice (lines %d and %d); give each key once", line, k.Line))
			continue
		}
		first[key] = k.Line
		if isNull(val) {
			d.errs.add(field, "", "has no value; write \"\" for an empty value")
			continue
		}
		elem := reflect.New(v.Type().Elem()).Elem()
		d.decode(val, elem, field)
		m.SetMapIndex(reflect.ValueOf(key), elem)
	}
	v.Set(m)
}

func unknownKeyProblem(key, path string, names []string) string {
	where := "at the top level"
	if path != "" {
		where = "under " + path
	}
	problem := "is not a known key"
	if best, ok := closest(key, names); ok {
		problem += fmt.Sprintf(" (did you mean %q?)", best)
	}
	sorted := append([]string(nil), names...)
	sort.Strings(sorted)
	return problem + "; accepted " + where + ": " + strings.Join(sorted, ", ")
}

// closest returns the name within edit distance 2 of key (case-folded), for
// "did you mean" hints.
func closest(key string, names []string) (string, bool) {
	if len(key) > 64 {
		return "", false
	}
	return suggest.Closest(strings.ToLower(key), names)
}

// parseDecimalFloat accepts plain decimal notation only (no .inf, .nan,
// hex or underscores).
func parseDecimalFloat(s string) (float64, error) {
	if s == "" || len(s) > maxNumberLen || strings.Trim(s, "0123456789.eE+-") != "" {
		return 0, strconv.ErrSyntax
	}
	return strconv.ParseFloat(s, 64)
}

// DecodeStrict decodes a YAML or JSON document (as Parse tells them apart
// by filename) into v, a pointer to a struct with yaml tags whose fields
// already hold their defaults, with the manifest's strict rules: unknown
// and duplicate keys, anchors, quoted numbers and non-decimal integers are
// errors, null keeps the default. Manifest types (Size, Duration, Resources)
// decode as in a manifest. It is for other documents of the same family,
// such as the operator policy, so they need no second YAML dialect.
// Errors are *FieldError values joined with errors.Join, prefixed with
// filename; it never panics on any input.
func DecodeStrict(data []byte, filename string, v any) (err error) {
	name := filename
	if name == "" {
		name = "document"
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%s: internal error while parsing (a bug in moat, please report): %v", name, r)
		}
	}()
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.IsNil() || rv.Elem().Kind() != reflect.Struct {
		return fmt.Errorf("%s: DecodeStrict needs a pointer to a struct, not %T", name, v)
	}
	if len(data) > MaxBytes {
		return fmt.Errorf("%s: is larger than %d bytes", name, MaxBytes)
	}
	if !utf8.Valid(data) {
		return fmt.Errorf("%s: is not valid UTF-8", name)
	}
	var root *yaml.Node
	if isJSON(data, filename) {
		root, err = parseJSON(data)
	} else {
		root, err = parseYAML(data)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	var errs errorList
	d := decoder{errs: &errs, seen: map[string]bool{}}
	switch {
	case root == nil || isNull(root):
	case root.Kind != yaml.MappingNode:
		errs.add("", "", "the document is "+describeNode(root)+"; expected a mapping of keys")
	default:
		d.decode(root, rv.Elem(), "")
	}
	if err := errs.err(); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}
