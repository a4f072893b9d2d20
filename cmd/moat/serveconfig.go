package main

// Where moat serve's settings come from besides its flags: MOAT_* environment
// variables and a YAML config file (--config), for a systemd unit or a
// container that would otherwise need a command line of twenty flags.
// Precedence: flag > environment > file > default (docs/OPERATIONS.md).

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/moat-sandbox/moat/internal/suggest"
)

// configFlag is the flag (and MOAT_CONFIG the variable) naming the file;
// it is the one flag the file cannot set.
const configFlag = "config"

// maxConfigBytes bounds the config file: a few dozen flags fit in 4 KiB.
const maxConfigBytes = 1 << 20

// envName is the environment variable of a flag: MOAT_ and its name
// upper-cased with - as _ (--session-pool: MOAT_SESSION_POOL).
func envName(flagName string) string {
	return "MOAT_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// settingSources says where each flag's value came from, for errors that
// must name it: a flag the command line set (or left at its default) is
// "--name"; one from the environment "MOAT_NAME (--name)"; one from the
// file "FILE:LINE: name".
type settingSources map[string]string

// of names where flag name's value came from.
func (s settingSources) of(name string) string {
	if w, ok := s[name]; ok {
		return w
	}
	return "--" + name
}

// applySettings sets every flag of fs the command line left unset from the
// environment (getenv), else from the config file: --config if given, else
// $MOAT_CONFIG, else none. A variable set to "" counts as unset, as a
// systemd EnvironmentFile's "MOAT_DB=" would mean. Values are parsed by
// the flags themselves, so a file's "pool: 4" and MOAT_POOL=4 mean what
// --pool 4 means; a bad one is refused naming where it came from.
func applySettings(fs *flag.FlagSet, getenv func(string) string) (settingSources, error) {
	onCommandLine := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { onCommandLine[f.Name] = true })
	src := settingSources{}

	path := ""
	if f := fs.Lookup(configFlag); f != nil {
		path = f.Value.String()
		if !onCommandLine[configFlag] {
			if v := getenv(envName(configFlag)); v != "" {
				path = v
			}
		}
	}
	var file map[string]configValue
	if path != "" {
		var err error
		if file, err = readConfigFile(path, fs); err != nil {
			return nil, err
		}
	}

	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		if onCommandLine[f.Name] || f.Name == configFlag {
			return
		}
		if v := getenv(envName(f.Name)); v != "" {
			where := envName(f.Name) + " (--" + f.Name + ")"
			if err := fs.Set(f.Name, v); err != nil {
				errs = append(errs, fmt.Errorf("%s=%q: %s", envName(f.Name), v, badValue(f)))
				return
			}
			src[f.Name] = where
			return
		}
		if cv, ok := file[f.Name]; ok {
			where := fmt.Sprintf("%s:%d: %s", path, cv.line, f.Name)
			if err := fs.Set(f.Name, cv.value); err != nil {
				errs = append(errs, fmt.Errorf("%s: %q: %s", where, cv.value, badValue(f)))
				return
			}
			src[f.Name] = where
		}
	})
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return src, nil
}

// badValue says what a flag takes, for a value it refused.
func badValue(f *flag.Flag) string {
	if bf, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && bf.IsBoolFlag() {
		return "want true or false (--" + f.Name + ")"
	}
	typ, _ := flag.UnquoteUsage(f)
	switch typ {
	case "int":
		return "want a whole number (--" + f.Name + ")"
	case "duration":
		return "want a duration such as 30s or 5m (--" + f.Name + ")"
	case "":
		typ = "value"
	}
	return "not a valid " + typ + " for --" + f.Name
}

// configValue is one key of the file: its value as the flag would get it
// on the command line, and its line for errors.
type configValue struct {
	value string
	line  int
}

// readConfigFile reads a YAML mapping of flag names to scalar values.
// Strict: an unknown key (with the closest flag name suggested), a key
// given twice, --config itself, and a value that is a list or a mapping
// are refused, each naming the file and line.
func readConfigFile(path string, fs *flag.FlagSet) (map[string]configValue, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("--config: %w", err)
	}
	defer f.Close()
	data, err := readAtMost(f, maxConfigBytes)
	if err != nil {
		return nil, fmt.Errorf("--config %s: %w", path, err)
	}
	return parseConfig(path, data, fs)
}

func readAtMost(r io.Reader, n int64) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, n+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > n {
		return nil, fmt.Errorf("is over %d bytes; a config file holds flag settings only", n)
	}
	return b, nil
}

// parseConfig is readConfigFile's parser, for the tests and the fuzzer.
func parseConfig(path string, data []byte, fs *flag.FlagSet) (map[string]configValue, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("%s: not YAML: %v", path, err)
	}
	out := map[string]configValue{}
	if doc.Kind == 0 || len(doc.Content) == 0 {
		return out, nil // an empty file sets nothing
	}
	top := doc.Content[0]
	if top.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("%s:%d: want a mapping of flag names to values (listen: 127.0.0.1:7070), not a %s", path, top.Line, nodeKind(top))
	}
	var names []string
	fs.VisitAll(func(f *flag.Flag) {
		if f.Name != configFlag {
			names = append(names, f.Name)
		}
	})
	var errs []error
	for i := 0; i+1 < len(top.Content); i += 2 {
		k, v := top.Content[i], top.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			errs = append(errs, fmt.Errorf("%s:%d: a key must be a flag name, not a %s", path, k.Line, nodeKind(k)))
			continue
		}
		name := strings.TrimPrefix(k.Value, "--")
		switch {
		case name == configFlag:
			errs = append(errs, fmt.Errorf("%s:%d: config: a config file cannot name another; give --config or MOAT_CONFIG", path, k.Line))
			continue
		case !slices.Contains(names, name):
			msg := fmt.Sprintf("%s:%d: unknown key %q: keys are moat serve's flag names", path, k.Line, k.Value)
			if s, ok := suggest.Closest(name, names); ok {
				msg += fmt.Sprintf(" (did you mean %q?)", s)
			}
			errs = append(errs, errors.New(msg+"; see moat serve --help"))
			continue
		}
		if prev, ok := out[name]; ok {
			errs = append(errs, fmt.Errorf("%s:%d: %s is given twice (first at line %d)", path, k.Line, name, prev.line))
			continue
		}
		switch {
		case v.Kind == yaml.AliasNode && v.Alias != nil && v.Alias.Kind == yaml.ScalarNode:
			v = v.Alias
		case v.Kind != yaml.ScalarNode:
			errs = append(errs, fmt.Errorf("%s:%d: %s: want a single value, not a %s (lists are comma-separated strings, as on the command line)", path, v.Line, name, nodeKind(v)))
			continue
		}
		if v.ShortTag() == "!!null" {
			continue // "pool:" with nothing: the default
		}
		out[name] = configValue{value: v.Value, line: v.Line}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return out, nil
}

func nodeKind(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "mapping"
	case yaml.SequenceNode:
		return "list"
	case yaml.AliasNode:
		return "alias"
	}
	return "value"
}
