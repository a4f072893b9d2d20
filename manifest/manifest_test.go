package manifest

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// fieldErrors flattens err (joined and wrapped) into its *FieldError leaves.
func fieldErrors(t *testing.T, err error) []*FieldError {
	t.Helper()
	var out []*FieldError
	var walk func(error)
	walk = func(e error) {
		if fe, ok := e.(*FieldError); ok {
			out = append(out, fe)
			return
		}
		switch u := e.(type) {
		case interface{ Unwrap() []error }:
			for _, c := range u.Unwrap() {
				walk(c)
			}
		case interface{ Unwrap() error }:
			walk(u.Unwrap())
		}
	}
	walk(err)
	return out
}

// wantFieldError fails unless err holds a *FieldError for field whose
// value is value and whose problem contains problem, and unless the error
// text names both the field and the value.
func wantFieldError(t *testing.T, err error, field, value, problem string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want %s: %q %s", field, value, problem)
	}
	for _, fe := range fieldErrors(t, err) {
		if fe.Field == field && fe.Value == value && strings.Contains(fe.Problem, problem) {
			msg := err.Error()
			if !strings.Contains(msg, field) {
				t.Errorf("error text %q does not name field %q", msg, field)
			}
			if value != "" && !strings.Contains(msg, fmt.Sprintf("%q", value)) {
				t.Errorf("error text %q does not quote value %q", msg, value)
			}
			return
		}
	}
	t.Fatalf("error %q\nhas no field error %s: %q ...%s...", err, field, value, problem)
}

func withInputs(m *Manifest, in ...Input) *Manifest {
	m.Inputs = in
	return m
}

func TestParseValid(t *testing.T) {
	canonical := Default()
	canonical.Inputs = []Input{{Src: "./task", Dst: "task"}}
	canonical.Env = map[string]string{"LANG": "C.UTF-8"}

	tests := []struct {
		name     string
		filename string
		data     string
		want     func() *Manifest
	}{
		{"canonical yaml", "m.yaml", readTestdata(t, "canonical.yaml"), func() *Manifest { return canonical }},
		{"canonical json", "m.json", readTestdata(t, "canonical.json"), func() *Manifest { return canonical }},
		{"json sniffed without extension", "", readTestdata(t, "canonical.json"), func() *Manifest { return canonical }},
		{"yaml sniffed without extension", "", readTestdata(t, "canonical.yaml"), func() *Manifest { return canonical }},
		{"yaml flow mapping in a .yaml file", "m.yaml", "{image: python}", Default},
		{"empty document is the defaults", "m.yaml", "", Default},
		{"comment only is the defaults", "m.yaml", "# nothing granted\n", Default},
		{"empty mapping is the defaults", "m.yaml", "{}", Default},
		{"empty json object is the defaults", "m.json", "{}", Default},
		{"null document is the defaults", "m.yaml", "~", Default},
		{"byte order mark", "m.json", "\xef\xbb\xbf{}", Default},
		{"null values keep defaults", "m.yaml", "image:\nresources:\n  memory: ~\nenv: null\ninputs:\n", Default},
		{"single document marker", "m.yaml", "---\nimage: python\n", Default},
		{"minimal", "m.yaml", readTestdata(t, "minimal.yaml"), func() *Manifest {
			m := withInputs(Default(), Input{Src: "task", Dst: "task"})
			m.Resources.Memory = GiB
			m.Resources.Timeout = Duration(2 * time.Minute)
			m.Resources.CPUTime = Duration(2 * time.Minute)
			m.Env = map[string]string{"LANG": "C.UTF-8"}
			return m
		}},
		{"cpu_time follows timeout when unset", "m.yaml", "resources: {timeout: 5m}", func() *Manifest {
			m := Default()
			m.Resources.Timeout, m.Resources.CPUTime = Duration(5*time.Minute), Duration(5*time.Minute)
			return m
		}},
		{"cpu_time set explicitly is kept", "m.yaml", "resources: {timeout: 5m, cpu_time: 10s}", func() *Manifest {
			m := Default()
			m.Resources.Timeout, m.Resources.CPUTime = Duration(5*time.Minute), Duration(10*time.Second)
			return m
		}},
		{"dst defaults to base name of src", "m.yaml", "inputs: [{src: ../data/set1/}, {src: /abs/x.csv}, {src: y, dst: ''}]", func() *Manifest {
			return withInputs(Default(), Input{"../data/set1/", "set1"}, Input{"/abs/x.csv", "x.csv"}, Input{"y", "y"})
		}},
		{"nested dst and siblings", "m.yaml", "inputs: [{src: a, dst: in/a}, {src: b, dst: in/b}, {src: c, dst: inb}]", func() *Manifest {
			return withInputs(Default(), Input{"a", "in/a"}, Input{"b", "in/b"}, Input{"c", "inb"})
		}},
		{"sizes in every unit", "m.yaml", `
workspace: {size: 1GB}
resources: {memory: 0.5GiB, file_size: 1048576, stdout_bytes: 0, stderr_bytes: "10 kib"}`, func() *Manifest {
			m := Default()
			m.Workspace.Size = 1e9
			m.Resources.Memory = 512 * MiB
			m.Resources.FileSize = MiB
			m.Resources.StdoutBytes = 0
			m.Resources.StderrBytes = 10 * KiB
			return m
		}},
		{"sizes in Kubernetes' and Docker's spellings", "m.yaml", `
workspace: {size: 2g}
resources: {memory: 512Mi, file_size: 64m, stderr_bytes: 4Ki}`, func() *Manifest {
			m := Default()
			m.Workspace.Size = 2 * GiB
			m.Resources.Memory = 512 * MiB
			m.Resources.FileSize = 64 * MiB
			m.Resources.StderrBytes = 4 * KiB
			return m
		}},
		{"fractional cpus", "m.yaml", "resources: {cpus: 0.5}", func() *Manifest {
			m := Default()
			m.Resources.CPUs = 0.5
			return m
		}},
		{"every tier name", "m.yaml", "tier: wasm", func() *Manifest {
			m := Default()
			m.Tier = "wasm"
			return m
		}},
		{"allow missing landlock", "m.yaml", "security: {allow_missing: [landlock]}", func() *Manifest {
			m := Default()
			m.Security.AllowMissing = []string{"landlock"}
			return m
		}},
		{"env values that look like other types when quoted", "m.yaml", `env: {DEBUG: "1", ON: "true", EMPTY: "", _x9: "a=b"}`, func() *Manifest {
			m := Default()
			m.Env = map[string]string{"DEBUG": "1", "ON": "true", "EMPTY": "", "_x9": "a=b"}
			return m
		}},
		{"image with tag and digest", "m.yaml", "image: library/python:3.12@sha256:abc", func() *Manifest {
			m := Default()
			m.Image = "library/python:3.12@sha256:abc"
			return m
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse([]byte(tc.data), tc.filename)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			want := tc.want()
			if !reflect.DeepEqual(got, want) {
				t.Errorf("got\n%s\nwant\n%s", got, want)
			}
			if err := got.Validate(); err != nil {
				t.Errorf("parsed manifest does not re-validate: %v", err)
			}
		})
	}
}

func readTestdata(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name     string
		filename string
		data     string
		field    string
		value    string
		problem  string
	}{
		// Unknown keys.
		{"unknown top-level key", "m.yaml", "imagee: python", "imagee", "", `did you mean "image"?`},
		{"unknown nested key", "m.yaml", "resources: {memroy: 1GiB}", "resources.memroy", "", `did you mean "memory"?`},
		{"unknown key lists accepted", "m.yaml", "network: {proxy: x}", "network.proxy", "", "accepted under network: allow, allow_addresses, connections_per_second, inbound, max_bytes_in, max_bytes_out, max_connections, mode, names_per_second"},
		{"unknown key in an input", "m.yaml", "inputs: [{src: a}, {sorc: b}]", "inputs[1].sorc", "", `did you mean "src"?`},
		{"unknown key in workspace", "m.yaml", "workspace: {inodes: 5}", "workspace.inodes", "", "accepted under workspace: files, size"},
		{"unknown key in security", "m.yaml", "security: {allow: [landlock]}", "security.allow", "", "allow_missing"},
		{"json keys are case-sensitive", "m.json", `{"Image": "python"}`, "Image", "", `did you mean "image"?`},
		{"hostile key is quoted", "m.yaml", "\"a\\nb: c\": 1", `"a\nb: c"`, "", "is not a known key"},
		{"merge key is not supported", "m.yaml", "resources: {<<: {memory: 1GiB}}", `resources."<<"`, "", "is not a known key"},

		// Duplicates, anchors, documents, syntax.
		{"duplicate top-level key", "m.yaml", "image: a\nimage: b\n", "image", "", "given twice (lines 1 and 2)"},
		{"duplicate nested key", "m.yaml", "resources:\n  pids: 1\n  pids: 2\n", "resources.pids", "", "given twice"},
		{"duplicate json key", "m.json", `{"image": "a", "image": "b"}`, "image", "", "given twice"},
		{"duplicate env key", "m.yaml", "env: {A: x, A: y}", "env.A", "", "given twice"},
		{"anchor", "m.yaml", "resources: &r {pids: 5}\n", "resources", "", "anchor or alias"},
		{"alias", "m.yaml", "env: {A: &a x, B: *a}", "env.A", "", "anchor or alias"},
		{"top level is a list", "m.yaml", "- image: python", "", "", "the document is a list"},
		{"top level is a string", "m.json", `"python"`, "", "", "the document is a string"},

		// Wrong types.
		{"image is a number", "m.yaml", "image: 5", "image", "5", "is an integer; expected a string (put it in quotes)"},
		{"resources is a number", "m.yaml", "resources: 5", "resources", "5", "expected a mapping"},
		{"inputs is a mapping", "m.yaml", "inputs: {src: a}", "inputs", "", "is a mapping; expected a list"},
		{"env is a list", "m.yaml", "env: [A=b]", "env", "", "expected a mapping of names to strings"},
		{"cpus is a string", "m.yaml", `resources: {cpus: "1"}`, "resources.cpus", "1", "remove the quotes"},
		{"pids is a string", "m.json", `{"resources": {"pids": "128"}}`, "resources.pids", "128", "expected an integer (remove the quotes)"},
		{"pids is fractional", "m.yaml", "resources: {pids: 128.5}", "resources.pids", "128.5", "is a number; expected an integer"},
		{"pids json float", "m.json", `{"resources": {"pids": 1e2}}`, "resources.pids", "1e2", "expected an integer"},
		{"pids octal-looking", "m.yaml", "resources: {pids: 010}", "resources.pids", "010", "plain decimal integer"},
		{"pids hex", "m.yaml", "resources: {pids: 0x10}", "resources.pids", "0x10", "plain decimal integer"},
		{"pids overflow", "m.yaml", "resources: {pids: 99999999999999999999}", "resources.pids", "99999999999999999999", ""},
		{"cpus nan", "m.yaml", "resources: {cpus: .nan}", "resources.cpus", ".nan", "plain decimal number"},
		{"cpus inf", "m.yaml", "resources: {cpus: .inf}", "resources.cpus", ".inf", "plain decimal number"},
		{"memory is a boolean", "m.yaml", "resources: {memory: true}", "resources.memory", "true", "is a boolean"},
		{"memory is a float", "m.yaml", "resources: {memory: 1.5}", "resources.memory", "1.5", "is a number"},
		{"memory is a list", "m.yaml", "resources: {memory: [1]}", "resources.memory", "", "is a list; expected a size"},
		{"network mode is a list", "m.yaml", "network: {mode: [none]}", "network.mode", "", "expected a string"},
		{"allow_missing is a string", "m.yaml", "security: {allow_missing: landlock}", "security.allow_missing", "landlock", "expected a list"},
		{"env value is a number", "m.yaml", "env: {DEBUG: 1}", "env.DEBUG", "1", "put it in quotes"},
		{"env value is null", "m.yaml", "env: {DEBUG: }", "env.DEBUG", "", `write "" for an empty value`},
		{"env value is a mapping", "m.yaml", "env: {A: {b: c}}", "env.A", "", "expected a string"},
		{"date-looking env value", "m.yaml", "env: {D: 2024-01-01}", "env.D", "2024-01-01", "is a timestamp"},
		{"custom tag", "m.yaml", "image: !py python", "image", "python", "tagged !py"},

		// Sizes and durations.
		{"size negative integer", "m.yaml", "resources: {memory: -1}", "resources.memory", "-1", "is negative"},
		{"size negative string", "m.yaml", `resources: {memory: "-1MiB"}`, "resources.memory", "-1MiB", "is negative"},
		{"size two dots", "m.yaml", "resources: {memory: 1.5.3MiB}", "resources.memory", "1.5.3MiB", "unknown unit"},
		{"size empty", "m.yaml", `resources: {memory: ""}`, "resources.memory", "", "is empty"},
		{"size overflow", "m.yaml", "resources: {memory: 99999999999TiB}", "resources.memory", "99999999999TiB", "too large"},
		{"size ambiguous unit", "m.yaml", "resources: {memory: 512M}", "resources.memory", "512M", `ambiguous unit "M"`},
		{"size not whole bytes", "m.yaml", "resources: {memory: 0.3KiB}", "resources.memory", "0.3KiB", "whole number of bytes"},
		{"size unit only", "m.yaml", "resources: {memory: MiB}", "resources.memory", "MiB", "is not a size"},
		{"size trailing dot", "m.yaml", "resources: {memory: 1.MiB}", "resources.memory", "1.MiB", "is not a size"},
		{"duration bare integer", "m.yaml", "resources: {timeout: 30}", "resources.timeout", "30", "write 30s"},
		{"duration bare integer string", "m.json", `{"resources": {"timeout": "30"}}`, "resources.timeout", "30", "write 30s"},
		{"duration json number", "m.json", `{"resources": {"timeout": 30}}`, "resources.timeout", "30", "write 30s"},
		{"duration days", "m.yaml", "resources: {timeout: 1d}", "resources.timeout", "1d", "Go duration"},
		{"duration negative", "m.yaml", "resources: {cpu_time: -5s}", "resources.cpu_time", "-5s", "is negative"},
		{"duration overflow", "m.yaml", "resources: {timeout: 9999999999h}", "resources.timeout", "9999999999h", "is not a duration"},

		// Names and modes.
		{"network mode host", "m.yaml", "network: {mode: host}", "network.mode", "host", "accepted: none"},
		{"network allowlist needs a destination", "m.yaml", "network: {mode: allowlist}", "network.allow", "", "needs at least one destination"},
		{"network allow without allowlist mode", "m.yaml", "network: {allow: [pypi.org]}", "network.allow", "pypi.org", "needs network.mode: allowlist"},
		{"network allow entry is an IP literal", "m.yaml", "network: {mode: allowlist, allow: [10.0.0.1]}", "network.allow[0]", "10.0.0.1", "allow_addresses"},
		{"network allow bare star", "m.yaml", `network: {mode: allowlist, allow: ["*"]}`, "network.allow[0]", "*", ""},
		{"network allow with a scheme", "m.yaml", "network: {mode: allowlist, allow: [\"https://pypi.org\"]}", "network.allow[0]", "https://pypi.org", ""},
		{"network allow_addresses not an address", "m.yaml", "network: {mode: allowlist, allow: [a.test], allow_addresses: [localhost]}", "network.allow_addresses[0]", "localhost", "not an IP address"},
		{"network mode empty", "m.yaml", `network: {mode: ""}`, "network.mode", "", "accepted: none"},
		{"unknown tier", "m.yaml", "tier: docker", "tier", "docker", "accepted: native, gvisor, microvm, wasm"},
		{"tier case matters", "m.yaml", "tier: Native", "tier", "Native", "not a known tier"},
		{"allow_missing unknown", "m.yaml", "security: {allow_missing: [seccomp]}", "security.allow_missing[0]", "seccomp", "accepted: landlock"},
		{"allow_missing twice", "m.yaml", "security: {allow_missing: [landlock, landlock]}", "security.allow_missing[1]", "landlock", "listed twice"},
		{"image empty", "m.yaml", `image: ""`, "image", "", "is empty"},
		{"image escapes", "m.yaml", "image: ../../etc", "image", "../../etc", "dot path component"},
		{"image bad character", "m.yaml", `image: "py thon"`, "image", "py thon", `contains ' '`},

		// Inputs.
		{"src required", "m.yaml", "inputs: [{dst: x}]", "inputs[0].src", "", "is required"},
		{"src NUL", "m.yaml", `inputs: [{src: "a\0b", dst: x}]`, "inputs[0].src", "a\x00b", "NUL"},
		{"dst parent", "m.yaml", "inputs: [{src: a, dst: ../x}]", "inputs[0].dst", "../x", "could escape /workspace"},
		{"dst absolute", "m.yaml", "inputs: [{src: a, dst: /abs}]", "inputs[0].dst", "/abs", "is absolute"},
		{"dst climbs out after descending", "m.yaml", "inputs: [{src: a, dst: a/../../b}]", "inputs[0].dst", "a/../../b", "could escape"},
		{"dst dot-dot inside", "m.yaml", "inputs: [{src: a, dst: a/../b}]", "inputs[0].dst", "a/../b", `".." component`},
		{"dst dot", "m.yaml", "inputs: [{src: a, dst: .}]", "inputs[0].dst", ".", "names /workspace itself"},
		{"dst dot slash", "m.yaml", "inputs: [{src: a, dst: ./}]", "inputs[0].dst", "./", "names /workspace itself"},
		{"dst unclean", "m.yaml", "inputs: [{src: a, dst: task/}]", "inputs[0].dst", "task/", `write "task"`},
		{"dst double slash", "m.yaml", "inputs: [{src: a, dst: a//b}]", "inputs[0].dst", "a//b", `write "a/b"`},
		{"dst newline", "m.yaml", `inputs: [{src: a, dst: "a\nb"}]`, "inputs[0].dst", "a\nb", "control character"},
		{"dst DEL", "m.yaml", `inputs: [{src: a, dst: "a\x7f"}]`, "inputs[0].dst", "a\x7f", "control character"},
		{"dst NUL", "m.json", `{"inputs": [{"src": "a", "dst": "x\u0000y"}]}`, "inputs[0].dst", "x\x00y", "NUL"},
		{"dst long component", "m.yaml", "inputs: [{src: a, dst: " + strings.Repeat("n", 256) + "}]", "inputs[0].dst", truncate(strings.Repeat("n", 256), maxValueLen), "longer than 255"},
		{"dst default unusable", "m.yaml", "inputs: [{src: /}]", "inputs[0].dst", "", "base name of src"},
		{"dst default dot-dot", "m.yaml", "inputs: [{src: ..}]", "inputs[0].dst", "", "is empty"},
		{"duplicate dst", "m.yaml", "inputs: [{src: a, dst: x}, {src: b, dst: x}]", "inputs[1].dst", "x", "also the dst of inputs[0]"},
		{"duplicate default dst", "m.yaml", "inputs: [{src: a/task}, {src: b/task}]", "inputs[1].dst", "task", "also the dst of inputs[0]"},
		{"dst nested in earlier", "m.yaml", "inputs: [{src: a, dst: x}, {src: b, dst: x/y}]", "inputs[1].dst", "x/y", `inside inputs[0].dst "x"`},
		{"dst contains earlier", "m.yaml", "inputs: [{src: a, dst: x/y/z}, {src: b, dst: x}]", "inputs[1].dst", "x", `contains inputs[0].dst "x/y/z"`},
		{"too many inputs", "m.yaml", "inputs: [" + strings.Repeat("{src: a},", MaxInputs+1) + "]", "inputs", "257 inputs", "at most 256"},

		// Env.
		{"env key starts with digit", "m.yaml", "env: {1FOO: x}", "env", "1FOO", "[A-Za-z_][A-Za-z0-9_]*"},
		{"env key with dash", "m.yaml", "env: {FOO-BAR: x}", "env", "FOO-BAR", "not a valid variable name"},
		{"env key with equals", "m.json", `{"env": {"A=B": "x"}}`, "env", "A=B", "not a valid variable name"},
		{"env key empty", "m.json", `{"env": {"": "x"}}`, "env", "", "not a valid variable name"},
		{"env value NUL", "m.yaml", `env: {A: "x\0y"}`, "env.A", "x\x00y", "NUL"},
		{"too many env vars", "m.json", `{"env": {` + manyEnv(MaxEnvVars+1) + `}}`, "env", "257 variables", "at most 256"},
		{"env too large", "m.json", `{"env": {"A": "` + strings.Repeat("x", MaxEnvBytes) + `"}}`, "env", "131075 bytes", "at most 131072 bytes"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, err := Parse([]byte(tc.data), tc.filename)
			if m != nil {
				t.Errorf("Parse returned a manifest with the error")
			}
			wantFieldError(t, err, tc.field, tc.value, tc.problem)
			if tc.filename != "" && !strings.HasPrefix(err.Error(), tc.filename+": ") {
				t.Errorf("error %q does not start with the file name", err)
			}
		})
	}
}

func manyEnv(n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `"V%d": "x"`, i)
	}
	return b.String()
}

func TestParseSyntaxErrors(t *testing.T) {
	tests := []struct {
		name, filename, data, want string
	}{
		{"two yaml documents", "m.yaml", "image: a\n---\nimage: b\n", "more than one YAML document"},
		{"trailing empty yaml document", "m.yaml", "image: a\n---\n", "more than one YAML document"},
		{"broken yaml", "m.yaml", "image: [a\n", "yaml:"},
		{"tab indentation", "m.yaml", "resources:\n\tpids: 1\n", "yaml:"},
		{"json trailing data", "m.json", `{"image": "a"} {}`, "unexpected data after the top-level value"},
		{"json truncated", "m.json", `{"image": "a"`, "invalid JSON"},
		{"json empty", "m.json", "  ", "is empty"},
		{"json too deep", "m.json", strings.Repeat("[", 100) + strings.Repeat("]", 100), "nested more than"},
		{"json comment", "m.json", "{/* no */}", "invalid JSON"},
		{"invalid utf-8", "m.yaml", "image: \xff", "not valid UTF-8"},
		{"too large", "m.yaml", "#" + strings.Repeat("x", MaxBytes), "larger than"},
		{"no name", "", "image: [", "manifest: "},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, err := Parse([]byte(tc.data), tc.filename)
			if err == nil || m != nil {
				t.Fatalf("Parse = %v, %v; want error containing %q", m, err, tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not contain %q", err, tc.want)
			}
		})
	}
}

// TestRangeBoundaries parses each numeric field just inside and just
// outside both ends of its range.
func TestRangeBoundaries(t *testing.T) {
	tests := []struct {
		field string // section.key
		value string // as written in YAML
		ok    bool
	}{
		{"workspace.size", "1MiB", true},
		{"workspace.size", "1048575", false},
		{"workspace.size", "64GiB", true},
		{"workspace.size", "68719476737", false},
		{"workspace.files", "16", true},
		{"workspace.files", "15", false},
		{"workspace.files", "10000000", true},
		{"workspace.files", "10000001", false},
		{"resources.cpus", "0.01", true},
		{"resources.cpus", "0.0099", false},
		{"resources.cpus", "0", false},
		{"resources.cpus", "-1", false},
		{"resources.cpus", "256", true},
		{"resources.cpus", "256.01", false},
		{"resources.cpus", "1e999", false},
		{"resources.memory", "4MiB", true},
		{"resources.memory", "4194303", false},
		{"resources.memory", "64GiB", true},
		{"resources.memory", "68719476737", false},
		{"resources.memory", "2TiB", false},
		{"resources.pids", "1", true},
		{"resources.pids", "0", false},
		{"resources.pids", "32768", true},
		{"resources.pids", "32769", false},
		{"resources.timeout", "10ms", true},
		{"resources.timeout", "9.999999ms", false},
		{"resources.timeout", "24h", true},
		{"resources.timeout", "24h0m0.000000001s", false},
		{"resources.cpu_time", "10ms", true},
		{"resources.cpu_time", "9ms", false},
		{"resources.cpu_time", "0s", false},
		{"resources.cpu_time", "24h", true},
		{"resources.cpu_time", "25h", false},
		{"resources.open_files", "16", true},
		{"resources.open_files", "15", false},
		{"resources.open_files", "65536", true},
		{"resources.open_files", "65537", false},
		{"resources.file_size", "1KiB", true},
		{"resources.file_size", "1023", false},
		{"resources.file_size", "16GiB", true},
		{"resources.file_size", "17179869185", false},
		{"resources.stdout_bytes", "0", true},
		{"resources.stdout_bytes", "-1", false},
		{"resources.stdout_bytes", "1GiB", true},
		{"resources.stdout_bytes", "1073741825", false},
		{"resources.stderr_bytes", "0B", true},
		{"resources.stderr_bytes", "1GiB", true},
		{"resources.stderr_bytes", "1.1GB", false},
	}
	for _, tc := range tests {
		t.Run(tc.field+"="+tc.value, func(t *testing.T) {
			section, key, _ := strings.Cut(tc.field, ".")
			doc := fmt.Sprintf("%s:\n  %s: %s\n", section, key, tc.value)
			_, err := Parse([]byte(doc), "m.yaml")
			if tc.ok {
				if err != nil {
					t.Fatalf("Parse(%q): %v", doc, err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Parse(%q) accepted an out-of-range value", doc)
			}
			fes := fieldErrors(t, err)
			if len(fes) == 0 || fes[0].Field != tc.field {
				t.Fatalf("error %q does not name %s first", err, tc.field)
			}
			if !strings.Contains(err.Error(), tc.field+": ") {
				t.Errorf("error %q does not name %s", err, tc.field)
			}
		})
	}
}

func TestFieldErrorText(t *testing.T) {
	tests := []struct {
		name string
		doc  string
		want string
	}{
		{"memory out of range", "resources: {memory: 2TiB}", `m.yaml: resources.memory: "2TiB" is out of range; accepted 4MiB..64GiB`},
		{"timeout out of range", "resources: {timeout: 48h, cpu_time: 1s}", `m.yaml: resources.timeout: "48h" is out of range; accepted 10ms..24h`},
		{"cpus out of range", "resources: {cpus: 300}", `m.yaml: resources.cpus: "300" is out of range; accepted 0.01..256`},
		{"stdout out of range", "resources: {stdout_bytes: 2GiB}", `m.yaml: resources.stdout_bytes: "2GiB" is out of range; accepted 0..1GiB`},
		{"names_per_second out of range", "network: {names_per_second: 0}", `m.yaml: network.names_per_second: "0" is out of range; accepted 1..1000`},
		{"unknown key", "resources: {memroy: 1GiB}", `m.yaml: resources.memroy: is not a known key (did you mean "memory"?); accepted under resources: cpu_time, cpus, file_size, memory, open_files, pids, stderr_bytes, stdout_bytes, timeout`},
		{"bare duration", "resources: {timeout: 30}", `m.yaml: resources.timeout: "30" is a bare number; durations need a unit: write 30s for seconds`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.doc), "m.yaml")
			if err == nil || err.Error() != tc.want {
				t.Errorf("error\n got %v\nwant %s", err, tc.want)
			}
		})
	}
}

func TestManyErrors(t *testing.T) {
	doc := "resources: {memory: 1B, pids: 0, cpus: 0, open_files: 0}\nnetwork: {mode: host}\ntier: x\n"
	_, err := Parse([]byte(doc), "m.yaml")
	fes := fieldErrors(t, err)
	var fields []string
	for _, fe := range fes {
		fields = append(fields, fe.Field)
	}
	want := []string{"tier", "resources.cpus", "resources.memory", "resources.pids", "resources.open_files", "network.mode"}
	if !reflect.DeepEqual(fields, want) {
		t.Errorf("fields = %v, want %v (in manifest order)", fields, want)
	}

	// Decoding problems and range problems are reported together.
	_, err = Parse([]byte("imagee: x\nresources: {pids: 0, memory: 1x}\n"), "m.yaml")
	fields = nil
	for _, fe := range fieldErrors(t, err) {
		fields = append(fields, fe.Field)
	}
	if want := []string{"imagee", "resources.memory", "resources.pids"}; !reflect.DeepEqual(fields, want) {
		t.Errorf("fields = %v, want %v", fields, want)
	}

	// An adversarial document gets a bounded report.
	var b strings.Builder
	for i := range 1000 {
		fmt.Fprintf(&b, "k%d: 1\n", i)
	}
	_, err = Parse([]byte(b.String()), "m.yaml")
	if got := len(fieldErrors(t, err)); got != maxErrors {
		t.Errorf("got %d field errors, want %d", got, maxErrors)
	}
	if !strings.Contains(err.Error(), "and 980 more problems") {
		t.Errorf("error does not count the dropped problems: ...%s", err.Error()[len(err.Error())-60:])
	}
}

func TestValidateDefault(t *testing.T) {
	if err := Default().Validate(); err != nil {
		t.Fatalf("Default().Validate() = %v", err)
	}
	// The zero Manifest grants nothing and is refused, not defaulted.
	err := new(Manifest).Validate()
	for _, field := range []string{"image", "tier", "resources.memory", "network.mode"} {
		found := false
		for _, fe := range fieldErrors(t, err) {
			found = found || fe.Field == field
		}
		if !found {
			t.Errorf("zero Manifest: no error for %s in %v", field, err)
		}
	}
}

// TestRangesDocumented checks that the table in the doc comment on Ranges
// matches what Ranges returns, so the documentation cannot drift from the code.
func TestRangesDocumented(t *testing.T) {
	src, err := os.ReadFile("validate.go")
	if err != nil {
		t.Fatal(err)
	}
	doc := map[string][]string{}
	for _, line := range strings.Split(string(src), "\n") {
		f := strings.Fields(strings.TrimPrefix(line, "//"))
		if strings.HasPrefix(line, "//\t") && len(f) == 4 && f[0] != "field" {
			doc[f[0]] = f[1:]
		}
	}
	ranges := Ranges()
	if len(doc) != len(ranges) {
		t.Errorf("doc table has %d rows, Ranges has %d", len(doc), len(ranges))
	}
	for _, r := range ranges {
		want := []string{r.Min, r.Max, r.Default}
		if got := doc[r.Field]; !reflect.DeepEqual(got, want) {
			t.Errorf("doc table row %s = %v, Ranges says %v", r.Field, got, want)
		}
	}
}

func TestDigest(t *testing.T) {
	base := Default()
	base.Inputs = []Input{{Src: "./task", Dst: "task"}}
	base.Env = map[string]string{"LANG": "C.UTF-8"}
	want := base.Digest()
	if !strings.HasPrefix(want, "sha256:") || len(want) != len("sha256:")+64 {
		t.Fatalf("Digest() = %q, want sha256:<64 hex>", want)
	}

	same := []struct {
		name, filename, data string
	}{
		{"canonical yaml", "m.yaml", readTestdata(t, "canonical.yaml")},
		{"canonical json", "m.json", readTestdata(t, "canonical.json")},
		{"defaults left out", "m.yaml", "inputs: [{src: ./task}]\nenv: {LANG: C.UTF-8}"},
		{"reordered keys and other spellings", "m.yaml", `
env:
  LANG: "C.UTF-8"
resources:
  stderr_bytes: 1048576
  memory: 0.5GiB
  timeout: 30000ms
  cpus: 1.0
network:
  mode: none
inputs:
- dst: task
  src: ./task
image: python
tier: native
`},
		{"json reordered", "", `{"env":{"LANG":"C.UTF-8"},"inputs":[{"dst":"task","src":"./task"}],"resources":{"memory":536870912}}`},
	}
	for _, tc := range same {
		t.Run("same/"+tc.name, func(t *testing.T) {
			m, err := Parse([]byte(tc.data), tc.filename)
			if err != nil {
				t.Fatal(err)
			}
			if got := m.Digest(); got != want {
				t.Errorf("Digest() = %s, want %s", got, want)
			}
		})
	}

	different := []struct {
		name   string
		change func(m *Manifest)
	}{
		{"memory", func(m *Manifest) { m.Resources.Memory++ }},
		{"cpu_time", func(m *Manifest) { m.Resources.CPUTime = Duration(time.Second) }},
		{"cpus", func(m *Manifest) { m.Resources.CPUs = 2 }},
		{"stdout", func(m *Manifest) { m.Resources.StdoutBytes = 0 }},
		{"env value", func(m *Manifest) { m.Env["LANG"] = "C" }},
		{"env added", func(m *Manifest) { m.Env["X"] = "" }},
		{"dst", func(m *Manifest) { m.Inputs[0].Dst = "task2" }},
		{"src", func(m *Manifest) { m.Inputs[0].Src = "/abs/task" }},
		{"tier", func(m *Manifest) { m.Tier = "gvisor" }},
		{"allow missing", func(m *Manifest) { m.Security.AllowMissing = []string{"landlock"} }},
		{"image", func(m *Manifest) { m.Image = "node" }},
		{"workspace files", func(m *Manifest) { m.Workspace.Files = 16 }},
	}
	for _, tc := range different {
		t.Run("different/"+tc.name, func(t *testing.T) {
			m := base.normalized()
			tc.change(m)
			if m.Digest() == want {
				t.Errorf("changing %s did not change the digest", tc.name)
			}
		})
	}

	t.Run("nil and empty are the same", func(t *testing.T) {
		a, b := Default(), Default()
		b.Inputs, b.Env, b.Security.AllowMissing = nil, nil, []string{}
		if a.Digest() != b.Digest() {
			t.Error("nil and empty lists and maps give different digests")
		}
	})
}

func TestCanonicalRoundTrip(t *testing.T) {
	for _, name := range []string{"canonical.yaml", "canonical.json", "minimal.yaml"} {
		t.Run(name, func(t *testing.T) {
			m, err := Parse([]byte(readTestdata(t, name)), name)
			if err != nil {
				t.Fatal(err)
			}
			assertRoundTrip(t, m)
		})
	}
}

// assertRoundTrip checks that m's canonical YAML and JSON both parse back
// to a manifest with m's digest.
func assertRoundTrip(t *testing.T, m *Manifest) {
	t.Helper()
	y, err := m.Canonical()
	if err != nil {
		t.Fatalf("Canonical: %v", err)
	}
	j, err := m.canonicalJSON()
	if err != nil {
		t.Fatalf("canonicalJSON: %v", err)
	}
	for _, doc := range []struct{ name, data string }{{"canonical.yaml", string(y)}, {"canonical.json", string(j)}} {
		back, err := Parse([]byte(doc.data), doc.name)
		if err != nil {
			t.Fatalf("%s does not parse back: %v\n%s", doc.name, err, doc.data)
		}
		if back.Digest() != m.Digest() {
			t.Fatalf("%s round trip changed the digest\n%s\nparsed back as\n%s", doc.name, doc.data, back)
		}
	}
}

func TestCanonicalText(t *testing.T) {
	m, err := Parse([]byte("inputs: [{src: ./task}]\nenv: {LANG: C.UTF-8, A: \"1\"}\nresources: {stdout_bytes: 1000}"), "m.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := `image: python
tier: native
inputs:
    - src: ./task
      dst: task
workspace:
    size: 256MiB
    files: 10000
resources:
    cpus: 1
    memory: 512MiB
    pids: 128
    timeout: 30s
    cpu_time: 30s
    open_files: 256
    file_size: 64MiB
    stdout_bytes: 1000
    stderr_bytes: 1MiB
network:
    mode: none
    max_connections: 16
    connections_per_second: 20
    max_bytes_out: 64MiB
    max_bytes_in: 512MiB
    names_per_second: 5
env:
    A: "1"
    LANG: C.UTF-8
security: {}
`
	if got := m.String(); got != want {
		t.Errorf("Canonical() =\n%s\nwant\n%s", got, want)
	}
}

func TestLoad(t *testing.T) {
	m, err := Load(filepath.Join("testdata", "canonical.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	abs, err := filepath.Abs(filepath.Join("testdata", "task"))
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Inputs[0].Src; got != abs {
		t.Errorf("Inputs[0].Src = %q, want %q", got, abs)
	}

	dir := t.TempDir()
	write := func(name, data string) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if err := os.Mkdir(filepath.Join(dir, "a"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("nowhere", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, file, data  string
		field, value, msg string
	}{
		{"missing input", "m.yaml", "inputs: [{src: a}, {src: link}, {src: missing}]", "inputs[2].src", "missing", "does not exist (looked for " + filepath.Join(dir, "missing") + ")"},
		{"missing absolute input", "m.json", `{"inputs": [{"src": "/nonexistent/moat/x"}]}`, "inputs[0].src", "/nonexistent/moat/x", "does not exist"},
		{"too large", "big.yaml", "#" + strings.Repeat("x", MaxBytes), "", "", "larger than"},
		{"invalid", "bad.yaml", "resources: {pids: 0}", "resources.pids", "0", "out of range"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := write(tc.file, tc.data)
			m, err := Load(p)
			if m != nil || err == nil {
				t.Fatalf("Load = %v, %v; want an error", m, err)
			}
			if !strings.HasPrefix(err.Error(), p+": ") {
				t.Errorf("error %q does not start with the path", err)
			}
			if tc.field != "" {
				wantFieldError(t, err, tc.field, tc.value, tc.msg)
			} else if !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("error %q does not contain %q", err, tc.msg)
			}
		})
	}

	t.Run("dangling symlink is the workspace's business", func(t *testing.T) {
		m, err := Load(write("ok.yaml", "inputs: [{src: a}, {src: link, dst: l}]"))
		if err != nil {
			t.Fatal(err)
		}
		if want := filepath.Join(dir, "link"); m.Inputs[1].Src != want {
			t.Errorf("Src = %q, want %q", m.Inputs[1].Src, want)
		}
	})
	t.Run("no such file", func(t *testing.T) {
		if _, err := Load(filepath.Join(dir, "none.yaml")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("Load = %v, want ErrNotExist", err)
		}
	})
}

func TestParseSize(t *testing.T) {
	tests := []struct {
		in      string
		want    Size
		problem string
	}{
		{"0", 0, ""},
		{"1024", 1024, ""},
		{"1B", 1, ""},
		{"512MiB", 512 * MiB, ""},
		{"512mib", 512 * MiB, ""},
		{"512 MiB", 512 * MiB, ""},
		{" 1GiB ", GiB, ""},
		{"1.5GiB", 3 * 512 * MiB, ""},
		{"2TiB", 2 * TiB, ""},
		{"10KB", 10_000, ""},
		{"10kB", 10_000, ""},
		{"1MB", 1_000_000, ""},
		{"1GB", 1_000_000_000, ""},
		{"1TB", 1_000_000_000_000, ""},
		{"0.5KiB", 512, ""},
		{"9223372036854775807", 1<<63 - 1, ""},
		{"9223372036854775808", 0, "too large"},
		{"8388608TiB", 0, "too large"},
		{"", 0, "is empty"},
		{"   ", 0, "is empty"},
		{"-1", 0, "negative"},
		{"+1", 0, "not a size"},
		{"1.5.3MiB", 0, "unknown unit"},
		{".5MiB", 0, "not a size"},
		{"1.MiB", 0, "not a size"},
		{"1e3", 0, "unknown unit"},
		{"0x10", 0, "unknown unit"},
		{"1_000", 0, "unknown unit"},
		// Kubernetes' binary units, any case.
		{"512Mi", 512 * MiB, ""},
		{"512mi", 512 * MiB, ""},
		{"4Ki", 4 * KiB, ""},
		{"2Gi", 2 * GiB, ""},
		{"1.5Gi", 3 * 512 * MiB, ""},
		{"1Ti", TiB, ""},
		// Docker's one letter, lowercase: binary.
		{"512m", 512 * MiB, ""},
		{"512 m", 512 * MiB, ""},
		{"2g", 2 * GiB, ""},
		{"1t", TiB, ""},
		{"100b", 100, ""},
		{"0.5g", 512 * MiB, ""},
		// What Kubernetes and Docker read differently is refused,
		// naming both spellings that say it without doubt.
		{"512M", 0, `ambiguous unit "M": it is 1000^2 bytes to Kubernetes or SI, 1024^2 to Docker; write 512Mi for binary or 512MB for decimal`},
		{"1G", 0, `ambiguous unit "G"`},
		{"1T", 0, `ambiguous unit "T"`},
		{"512k", 0, `ambiguous unit "k": it is 1000^1 bytes to Kubernetes or SI, 1024^1 to Docker; write 512Ki for binary or 512KB for decimal`},
		{"512K", 0, `ambiguous unit "K"`},
		{"512mb", 0, `ambiguous unit "mb"`},
		{"1gb", 0, `1024^3 to Docker; write 1Gi for binary or 1GB for decimal`},
		{"1Gb", 0, `ambiguous unit "Gb"`},
		{"1.5 M", 0, "write 1.5Mi for binary or 1.5MB for decimal"},
		// Kubernetes' milli on its own and its larger units are not
		// byte counts Moat takes.
		{"512Mm", 0, "unknown unit"},
		{"1Pi", 0, "unknown unit"},
		{"1E", 0, "unknown unit"},
		{"1.1B", 0, "whole number of bytes"},
		{"1KiBB", 0, "unknown unit"},
		{strings.Repeat("9", 65), 0, "too long"},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseSize(tc.in)
			if tc.problem == "" {
				if err != nil || got != tc.want {
					t.Fatalf("ParseSize(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
				}
				back, err := ParseSize(got.String())
				if err != nil || back != got {
					t.Errorf("ParseSize(%q.String() = %q) = %d, %v", tc.in, got.String(), back, err)
				}
				return
			}
			var fe *FieldError
			if !errors.As(err, &fe) || !strings.Contains(fe.Problem, tc.problem) || (tc.in != "" && !strings.Contains(err.Error(), fmt.Sprintf("%q", truncate(tc.in, maxValueLen)))) {
				t.Fatalf("ParseSize(%q) = %d, %v; want a *FieldError quoting the value, with %q", tc.in, got, err, tc.problem)
			}
		})
	}
}

func TestSizeEncoding(t *testing.T) {
	tests := []struct {
		size     Size
		str, enc string
	}{
		{0, "0", "0"},
		{1, "1B", "1"},
		{1000, "1000B", "1000"},
		{KiB, "1KiB", `"1KiB"`},
		{1536, "1536B", "1536"}, // 1.5KiB: no binary unit divides it
		{512 * MiB, "512MiB", `"512MiB"`},
		{1536 * MiB, "1536MiB", `"1536MiB"`},
		{GiB, "1GiB", `"1GiB"`},
		{3 * TiB, "3TiB", `"3TiB"`},
		{1e9, "1000000000B", "1000000000"},
		{-1, "-1B", "-1"},
	}
	for _, tc := range tests {
		t.Run(tc.str, func(t *testing.T) {
			if got := tc.size.String(); got != tc.str {
				t.Errorf("String() = %q, want %q", got, tc.str)
			}
			b, err := json.Marshal(tc.size)
			if err != nil || string(b) != tc.enc {
				t.Errorf("MarshalJSON = %s, %v; want %s", b, err, tc.enc)
			}
			if tc.size < 0 {
				return
			}
			var back Size
			if err := json.Unmarshal(b, &back); err != nil || back != tc.size {
				t.Errorf("UnmarshalJSON(%s) = %d, %v", b, back, err)
			}
		})
	}
	t.Run("unmarshal json null is a no-op", func(t *testing.T) {
		s, d := Size(5), Duration(5)
		if err := json.Unmarshal([]byte("null"), &s); err != nil || s != 5 {
			t.Errorf("Size: %v, %v", s, err)
		}
		if err := json.Unmarshal([]byte("null"), &d); err != nil || d != 5 {
			t.Errorf("Duration: %v, %v", d, err)
		}
	})
	t.Run("unmarshal json errors", func(t *testing.T) {
		var s Size
		for _, in := range []string{`true`, `"x"`, `1.5`, `[1]`, `-5`} {
			if err := json.Unmarshal([]byte(in), &s); err == nil {
				t.Errorf("UnmarshalJSON(%s) = nil error", in)
			}
		}
	})
}

func TestParseDuration(t *testing.T) {
	tests := []struct {
		in      string
		want    time.Duration
		str     string
		problem string
	}{
		{"30s", 30 * time.Second, "30s", ""},
		{"1m", time.Minute, "1m", ""},
		{"1m30s", 90 * time.Second, "1m30s", ""},
		{"1h", time.Hour, "1h", ""},
		{"1h0m30s", time.Hour + 30*time.Second, "1h0m30s", ""},
		{"90m", 90 * time.Minute, "1h30m", ""},
		{"500ms", 500 * time.Millisecond, "500ms", ""},
		{"1.5s", 1500 * time.Millisecond, "1.5s", ""},
		{"24h0m0.000000001s", 24*time.Hour + 1, "24h0m0.000000001s", ""},
		{"0s", 0, "0s", ""},
		{"30", 0, "", "write 30s"},
		{"0", 0, "", "write 0s"},
		{"1.5", 0, "", "write 1.5s"},
		{"", 0, "", "is empty"},
		{"-1s", 0, "", "negative"},
		{"1d", 0, "", "Go duration"},
		{"30 s", 0, "", "Go duration"},
		{"s", 0, "", "Go duration"},
		{strings.Repeat("1", 70) + "s", 0, "", "too long"},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseDuration(tc.in)
			if tc.problem == "" {
				if err != nil || got.D() != tc.want {
					t.Fatalf("ParseDuration(%q) = %v, %v; want %v", tc.in, got.D(), err, tc.want)
				}
				if got.String() != tc.str {
					t.Errorf("String() = %q, want %q", got.String(), tc.str)
				}
				b, _ := json.Marshal(got)
				var back Duration
				if err := json.Unmarshal(b, &back); err != nil || back != got {
					t.Errorf("JSON round trip %s = %v, %v", b, back, err)
				}
				return
			}
			var fe *FieldError
			if !errors.As(err, &fe) || !strings.Contains(fe.Problem, tc.problem) {
				t.Fatalf("ParseDuration(%q) = %v, %v; want a *FieldError with %q", tc.in, got, err, tc.problem)
			}
		})
	}
}

func TestParseInputFlag(t *testing.T) {
	tests := []struct {
		in      string
		want    Input
		problem string
	}{
		{"./task", Input{"./task", "task"}, ""},
		{"./task/", Input{"./task/", "task"}, ""},
		{"./task:code", Input{"./task", "code"}, ""},
		{"/data/x.csv:in/x.csv", Input{"/data/x.csv", "in/x.csv"}, ""},
		{"dir:12:30:d", Input{"dir:12:30", "d"}, ""},
		{"", Input{}, "empty SRC"},
		{":x", Input{}, "empty SRC"},
		{"a:", Input{}, "empty DST"},
		{"a:../b", Input{}, "could escape"},
		{"a:/b", Input{}, "is absolute"},
		{"a:b/", Input{}, `write "b"`},
		{"/", Input{}, "is empty"},
		{"..", Input{}, "is empty"},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseInputFlag(tc.in)
			if tc.problem == "" {
				if err != nil || got != tc.want {
					t.Fatalf("ParseInputFlag(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
				}
				return
			}
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Field != "--input" || fe.Value != tc.in || !strings.Contains(fe.Problem, tc.problem) {
				t.Fatalf("ParseInputFlag(%q) = %v, %v; want --input error with %q", tc.in, got, err, tc.problem)
			}
		})
	}
}

func TestParseEnvFlag(t *testing.T) {
	tests := []struct {
		in, k, v, problem string
	}{
		{"A=b", "A", "b", ""},
		{"A=", "A", "", ""},
		{"A=b=c", "A", "b=c", ""},
		{"_1=x", "_1", "x", ""},
		{"HOME", "", "", "has no '='"},
		{"=x", "", "", "invalid name"},
		{"1A=x", "", "", "invalid name"},
		{"A-B=x", "", "", "invalid name"},
		{"A=\x00", "", "", "NUL"},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			k, v, err := ParseEnvFlag(tc.in)
			if tc.problem == "" {
				if err != nil || k != tc.k || v != tc.v {
					t.Fatalf("ParseEnvFlag(%q) = %q, %q, %v", tc.in, k, v, err)
				}
				return
			}
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Field != "--env" || !strings.Contains(fe.Problem, tc.problem) {
				t.Fatalf("ParseEnvFlag(%q) = %v; want --env error with %q", tc.in, err, tc.problem)
			}
		})
	}
}

func TestSetTimeout(t *testing.T) {
	tests := []struct {
		name                 string
		timeout, cpu, set    time.Duration
		wantTimeout, wantCPU time.Duration
	}{
		{"cpu_time follows the default", 30 * time.Second, 30 * time.Second, time.Minute, time.Minute, time.Minute},
		{"a chosen cpu_time is kept", 30 * time.Second, 10 * time.Second, time.Minute, time.Minute, 10 * time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := Resources{Timeout: Duration(tc.timeout), CPUTime: Duration(tc.cpu)}
			r.SetTimeout(Duration(tc.set))
			if r.Timeout.D() != tc.wantTimeout || r.CPUTime.D() != tc.wantCPU {
				t.Errorf("after SetTimeout: timeout %v cpu_time %v, want %v %v", r.Timeout, r.CPUTime, tc.wantTimeout, tc.wantCPU)
			}
		})
	}
}

// TestCanonicalRoundTripStrings round-trips strings that YAML emitters are
// known to get wrong: indicators, look-alikes of other types, line breaks,
// BOMs and Unicode line separators, long lines that might be folded.
func TestCanonicalRoundTripStrings(t *testing.T) {
	values := []string{
		"", " ", " lead", "trail ", "a\nb", "a\n", "\n", "a\r\nb", "\r", "\t", "tab\there",
		"#", "a #b", "a: b", "- a", "? a", "*x", "&y", "!z", "%p", "@a", "`b", "'", `"`, "\\", "|", ">", "{", "[", ",",
		"null", "~", "true", "False", "yes", "0x10", "010", "1e3", ".inf", ".nan", "-", "---", "...", "2024-01-01", "1_000",
		"\u0085", "\u2028", "\u2029", "\ufeff", "\x7f", "\x01", "é😀", strings.Repeat("word ", 40), strings.Repeat("x", 300),
	}
	for i, v := range values {
		t.Run(fmt.Sprintf("%d", i), func(t *testing.T) {
			m := Default()
			m.Env = map[string]string{"V": v}
			m.Inputs = []Input{{Src: "s" + v, Dst: "d"}}
			if dstProblem("e"+v) == "" {
				m.Inputs = append(m.Inputs, Input{Src: "x", Dst: "e" + v})
			}
			if err := m.Validate(); err != nil {
				t.Fatal(err)
			}
			assertRoundTrip(t, m)
			back, err := Parse([]byte(m.String()), "m.yaml")
			if err != nil {
				t.Fatal(err)
			}
			if back.Env["V"] != v {
				t.Errorf("env value %q came back as %q", v, back.Env["V"])
			}
		})
	}
}
