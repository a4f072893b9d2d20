package manifest

import (
	"errors"
	"fmt"
	"strconv"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
)

// FieldError is one problem with one manifest field. Error renders it as
//
//	resources.memory: "2TiB" is out of range; accepted 4MiB..64GiB
//
// Field is the dotted path of the key ("inputs[2].dst"), empty when the
// value came from a helper such as ParseSize and the caller knows the name.
// Value is what was given (truncated when long), empty when there is no
// scalar to show. Problem says what is wrong and what is accepted.
type FieldError struct {
	Field, Value, Problem string
}

func (e *FieldError) Error() string {
	s := ""
	if e.Field != "" {
		s = e.Field + ": "
	}
	if e.Value != "" {
		s += strconv.Quote(e.Value) + " "
	}
	return s + e.Problem
}

// maxValueLen bounds the value quoted in an error, so a megabyte string in
// a manifest does not become a megabyte error message.
const maxValueLen = 80

func newFieldError(field, value, problem string) *FieldError {
	return &FieldError{Field: field, Value: truncate(value, maxValueLen), Problem: problem}
}

// truncate shortens s to at most n bytes on a rune boundary, marking the cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "..."
}

// maxErrors bounds how many problems one Parse or Validate reports; the
// first few are what a person fixes first, and an adversarial manifest
// should not produce an unbounded error.
const maxErrors = 20

// errorList collects field errors up to maxErrors and counts the rest.
type errorList struct {
	errs    []error
	dropped int
}

func (l *errorList) add(field, value, problem string) {
	l.addErr(newFieldError(field, value, problem))
}

func (l *errorList) addErr(e *FieldError) {
	if len(l.errs) >= maxErrors {
		l.dropped++
		return
	}
	l.errs = append(l.errs, e)
}

func (l *errorList) len() int { return len(l.errs) + l.dropped }

// err returns nil or the errors joined with errors.Join, so each
// *FieldError stays reachable with errors.As.
func (l *errorList) err() error {
	if l.len() == 0 {
		return nil
	}
	errs := l.errs
	if l.dropped > 0 {
		errs = append(errs[:len(errs):len(errs)], fmt.Errorf("and %d more problems", l.dropped))
	}
	return errors.Join(errs...)
}

// describeNode names what a YAML node is, for "is a list; expected a
// string" messages.
func describeNode(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	case yaml.DocumentNode:
		return "a document"
	}
	switch n.ShortTag() {
	case "!!str":
		return "a string"
	case "!!int":
		return "an integer"
	case "!!float":
		return "a number"
	case "!!bool":
		return "a boolean"
	case "!!null":
		return "null"
	case "!!timestamp":
		return "a timestamp"
	case "!!binary":
		return "binary data"
	}
	return "a value tagged " + n.Tag
}
