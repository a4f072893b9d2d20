package manifest

import (
	"slices"
	"strings"
	"testing"
)

func TestWidenings(t *testing.T) {
	tests := []struct {
		name string
		doc  string
		want []string
	}{
		{"default", "", nil},
		{"lower limits are not widenings", "resources: {memory: 64MiB, timeout: 5s}\ntier: gvisor", nil},
		{"memory", "resources: {memory: 1GiB}", []string{"resources.memory"}},
		{"memory at default", "resources: {memory: 512MiB}", nil},
		{"cpu_time follows timeout", "resources: {timeout: 1m}", []string{"resources.timeout", "resources.cpu_time"}},
		{"network", "network: {mode: allowlist, allow: [pypi.org], max_bytes_out: 65MiB}", []string{"network.max_bytes_out", "network.allow"}},
		{"addresses", "network: {mode: allowlist, allow: [pypi.org], allow_addresses: [127.0.0.1]}", []string{"network.allow", "network.allow_addresses"}},
		{"packages", "network: {mode: allowlist}\npackages: {pypi: {allow: [idna]}}", []string{"packages"}},
		{"allow_missing", "security: {allow_missing: [landlock]}", []string{"security.allow_missing"}},
		{"workspace", "workspace: {size: 1GiB, files: 20000}", []string{"workspace.size", "workspace.files"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, err := Parse([]byte(tc.doc), "m.yaml")
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, w := range m.Widenings() {
				got = append(got, w.Field)
				if w.Value == "" || w.Default == "" {
					t.Errorf("widening %+v does not describe itself", w)
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("Widenings = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestJustificationsValidate(t *testing.T) {
	tests := []struct {
		name    string
		doc     string
		wantErr string // "" accepts
	}{
		{"justified memory", "resources: {memory: 1GiB}\njustifications: {resources.memory: pandas needs it}", ""},
		{"justified network", "network: {mode: allowlist, allow: [pypi.org]}\njustifications: {network.allow: \"fetches wheels\"}", ""},
		{"multi-line text", "resources: {memory: 1GiB}\njustifications:\n  resources.memory: |\n    line one\n    line two\n", ""},
		{"unknown key", "justifications: {resources.memroy: x}", "justifications.resources.memroy: is not a field that can be widened"},
		{"not widened", "justifications: {resources.memory: x}", "justifications.resources.memory: justifies resources.memory, which this manifest does not widen"},
		{"lowered is not widened", "resources: {memory: 64MiB}\njustifications: {resources.memory: x}", "does not widen"},
		{"empty", "resources: {memory: 1GiB}\njustifications: {resources.memory: \"  \"}", "justifications.resources.memory: is empty"},
		{"null", "resources: {memory: 1GiB}\njustifications: {resources.memory: }", "has no value"},
		{"not a string", "resources: {memory: 1GiB}\njustifications: {resources.memory: 3}", "expected a string"},
		{"control character", "resources: {memory: 1GiB}\njustifications: {resources.memory: \"a\\x1b[2Jb\"}", "control or bidi"},
		{"bidi override", "resources: {memory: 1GiB}\njustifications: {resources.memory: \"a\u202eb\"}", "control or bidi"},
		{"too long", "resources: {memory: 1GiB}\njustifications: {resources.memory: " + strings.Repeat("a", MaxJustificationBytes+1) + "}", "bytes long"},
		{"not a mapping", "justifications: [a]", "justifications"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, err := Parse([]byte(tc.doc), "m.yaml")
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("Parse: %v", err)
				}
				if len(m.Justifications) == 0 {
					t.Error("justifications were dropped")
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Parse error = %v; want one containing %q", err, tc.wantErr)
			}
		})
	}
}

func TestJustifiableFieldsCoverWidenings(t *testing.T) {
	known := JustifiableFields()
	for _, r := range Ranges() {
		if !slices.Contains(known, r.Field) {
			t.Errorf("numeric field %s has no justification key; add it to limits", r.Field)
		}
	}
}

func TestJustificationsKeepDigestOfOtherManifests(t *testing.T) {
	a, _ := Parse([]byte("resources: {memory: 1GiB}"), "a.yaml")
	b, _ := Parse([]byte("{\"resources\": {\"memory\": \"1GiB\"}}"), "b.json")
	if a.Digest() != b.Digest() {
		t.Error("equal manifests without justifications have different digests")
	}
	c, err := Parse([]byte("resources: {memory: 1GiB}\njustifications: {resources.memory: x}"), "c.yaml")
	if err != nil {
		t.Fatal(err)
	}
	out, err := c.Canonical()
	if err != nil {
		t.Fatal(err)
	}
	d, err := Parse(out, "d.yaml")
	if err != nil {
		t.Fatalf("canonical form does not parse: %v\n%s", err, out)
	}
	if d.Justifications["resources.memory"] != "x" || d.Digest() != c.Digest() {
		t.Errorf("justifications do not round-trip through Canonical: %v", d.Justifications)
	}
}
