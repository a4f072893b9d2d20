package ociruntime

import (
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/result"
)

// TestMapEgress: the egress annotations (or the policy's default) give the
// container its own network namespace, never the pod's, and Moat's proxy
// to what they allow, inside the operator's ceiling; anything malformed
// or outside the policy is refused naming the annotation, the value and
// the fix.
func TestMapEgress(t *testing.T) {
	proxyURL := "HTTP_PROXY=http://127.0.0.1:3128"
	tests := []struct {
		name    string
		ann     map[string]string
		env     []string // the spec's, replacing baseSpec's
		policy  *Policy
		want    *Egress // nil: the engine's network
		field   string  // a refusal's field
		value   string  // part of its value
		envHas  []string
		envLack []string
	}{
		{name: "no annotation: the engine's network", want: nil},
		{name: "none", ann: map[string]string{AnnotationEgress: "none"}, want: &Egress{}, envLack: []string{proxyURL}},
		{name: "allowlist, normalised and deduplicated", ann: map[string]string{AnnotationEgress: " PyPI.org, *.pythonhosted.org:443,pypi.org"},
			want: &Egress{Allow: []string{"pypi.org", "*.pythonhosted.org:443"}}, envHas: []string{proxyURL, "https_proxy=http://127.0.0.1:3128", "NO_PROXY="}},
		{name: "the spec's own proxy variables are replaced", ann: map[string]string{AnnotationEgress: "pypi.org"},
			env: []string{"PATH=/bin", "HTTPS_PROXY=http://evil.example:8080", "NO_PROXY=*"}, want: &Egress{Allow: []string{"pypi.org"}},
			envHas: []string{"PATH=/bin", "HTTPS_PROXY=http://127.0.0.1:3128", "NO_PROXY="}, envLack: []string{"HTTPS_PROXY=http://evil.example:8080", "NO_PROXY=*"}},
		{name: "a bad rule", ann: map[string]string{AnnotationEgress: "pypi.org,http://x.example/path"}, field: `annotations["moat.sandbox/egress"]`, value: "http://x.example/path"},
		{name: "an IP literal", ann: map[string]string{AnnotationEgress: "10.0.0.1"}, field: `annotations["moat.sandbox/egress"]`, value: "10.0.0.1"},
		{name: "empty", ann: map[string]string{AnnotationEgress: " "}, field: `annotations["moat.sandbox/egress"]`},
		{name: "inside the ceiling", ann: map[string]string{AnnotationEgress: "files.pythonhosted.org:443"},
			policy: &Policy{Egress: EgressPolicy{Ceiling: []string{"*.pythonhosted.org", "pypi.org"}}}, want: &Egress{Allow: []string{"files.pythonhosted.org:443"}}},
		{name: "outside the ceiling", ann: map[string]string{AnnotationEgress: "pypi.org,evil.example"},
			policy: &Policy{Egress: EgressPolicy{Ceiling: []string{"pypi.org"}}}, field: `annotations["moat.sandbox/egress"]`, value: "evil.example"},
		{name: "addresses inside the policy's", ann: map[string]string{AnnotationEgress: "api.internal:8080", AnnotationEgressAddresses: "10.96.0.10, 10.96.1.0/24"},
			policy: &Policy{Egress: EgressPolicy{Addresses: []string{"10.96.0.0/12"}}}, want: &Egress{Allow: []string{"api.internal:8080"}, Addresses: []string{"10.96.0.10/32", "10.96.1.0/24"}}},
		{name: "addresses outside the policy's", ann: map[string]string{AnnotationEgress: "api.internal:8080", AnnotationEgressAddresses: "10.0.0.0/8"},
			policy: &Policy{Egress: EgressPolicy{Addresses: []string{"10.96.0.0/12"}}}, field: `annotations["moat.sandbox/egress-addresses"]`, value: "10.0.0.0/8"},
		{name: "addresses and no policy", ann: map[string]string{AnnotationEgress: "api.internal", AnnotationEgressAddresses: "127.0.0.1"},
			field: `annotations["moat.sandbox/egress-addresses"]`, value: "127.0.0.1"},
		{name: "a bad address", ann: map[string]string{AnnotationEgress: "api.internal", AnnotationEgressAddresses: "localhost"},
			policy: &Policy{Egress: EgressPolicy{Addresses: []string{"127.0.0.0/8"}}}, field: `annotations["moat.sandbox/egress-addresses"]`, value: "localhost"},
		{name: "addresses without an allowlist", ann: map[string]string{AnnotationEgressAddresses: "10.96.0.10"},
			field: `annotations["moat.sandbox/egress-addresses"]`, value: "10.96.0.10"},
		{name: "addresses with none", ann: map[string]string{AnnotationEgress: "none", AnnotationEgressAddresses: "10.96.0.10"},
			policy: &Policy{Egress: EgressPolicy{Addresses: []string{"10.0.0.0/8"}}}, field: `annotations["moat.sandbox/egress-addresses"]`},
		{name: "the policy's default", policy: &Policy{Egress: EgressPolicy{Default: "none"}}, want: &Egress{}},
		{name: "an annotation overrides the default", ann: map[string]string{AnnotationEgress: "pypi.org"},
			policy: &Policy{Egress: EgressPolicy{Default: "none"}}, want: &Egress{Allow: []string{"pypi.org"}}},
		{name: "the pause container keeps the pod's network", ann: map[string]string{AnnotationEgress: "pypi.org", annotationContainerType: "sandbox"}, want: nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := specWith(t, func(m map[string]any) {
				ann := map[string]any{"io.kubernetes.cri.container-type": "container"}
				for k, v := range tc.ann {
					ann[k] = v
				}
				m["annotations"] = ann
				if tc.env != nil {
					obj(m, "process")["env"] = tc.env
				}
			})
			s, err := ParseSpec(b)
			if err != nil {
				t.Fatal(err)
			}
			c, err := Map(s, "/bundles/x", tc.policy)
			if tc.field != "" {
				var re *RefusalError
				if !errors.As(err, &re) || re.Field != tc.field || !strings.Contains(re.Value, tc.value) || re.Fix == "" {
					t.Fatalf("Map = %v, want a refusal of %s naming %q with a fix", err, tc.field, tc.value)
				}
				return
			}
			if err != nil {
				t.Fatalf("Map = %v", err)
			}
			if !reflect.DeepEqual(c.Egress, tc.want) {
				t.Errorf("Egress = %+v, want %+v", c.Egress, tc.want)
			}
			_, joined := c.Join["network"]
			if joined != (tc.want == nil) {
				t.Errorf("pod network joined = %v with Egress %+v: want the pod's only without Moat's network", joined, c.Egress)
			}
			for _, e := range tc.envHas {
				if !slices.Contains(c.Env, e) {
					t.Errorf("env %q lacks %q", c.Env, e)
				}
			}
			for _, e := range tc.envLack {
				if slices.Contains(c.Env, e) {
					t.Errorf("env %q has %q", c.Env, e)
				}
			}
		})
	}
}

func TestParsePolicyEgress(t *testing.T) {
	tests := []struct {
		name, yaml, err string
	}{
		{"all", "egress:\n  default: none\n  ceiling: ['*.pythonhosted.org', pypi.org]\n  addresses: [10.96.0.0/12]\n", ""},
		{"default inside the ceiling", "egress:\n  default: pypi.org\n  ceiling: [pypi.org]\n", ""},
		{"default outside the ceiling", "egress:\n  default: evil.example\n  ceiling: [pypi.org]\n", "egress.default"},
		{"bad ceiling", "egress:\n  ceiling: ['*']\n", "egress.ceiling"},
		{"bad address", "egress:\n  addresses: [internal]\n", "egress.addresses"},
		{"typo", "egress:\n  allow: [x]\n", "allow"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParsePolicy([]byte(tc.yaml))
			if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Errorf("ParsePolicy = %v, want %q", err, tc.err)
			}
		})
	}
}

// TestRootChanges: the diff of the overlay's upper directory read as
// changes of the container's root.
func TestRootChanges(t *testing.T) {
	lower := map[string]pathInfo{
		"etc":                {Type: "dir", Mode: 0o755},
		"etc/issue":          {Type: "file", Mode: 0o644, Size: 27},
		"etc/debian_version": {Type: "file", Mode: 0o644, Size: 5},
		"usr":                {Type: "dir", Mode: 0o755},
		"usr/lib":            {Type: "dir", Mode: 0o755},
		"usr/lib/a":          {Type: "file", Mode: 0o644},
		"usr/lib/b":          {Type: "symlink", Mode: 0o777},
		"var":                {Type: "dir", Mode: 0o755},
	}
	upper := map[string]pathInfo{
		"etc/issue": {Type: "other", Whiteout: true},
		"usr/lib":   {Type: "dir", Mode: 0o755, Opaque: true},
		"gone":      {Type: "other", Whiteout: true},
		"dev/null":  {Type: "other"},
	}
	tree := lowerTree{
		info: func(p string) (pathInfo, bool) { pi, ok := lower[p]; return pi, ok },
		names: func(dir string) []string {
			var out []string
			for p := range lower {
				if strings.HasPrefix(p, dir+"/") && !strings.Contains(p[len(dir)+1:], "/") {
					out = append(out, p[len(dir)+1:])
				}
			}
			slices.Sort(out)
			return out
		},
	}
	in := []result.FileChange{
		{Path: "etc", Change: result.Added, Type: "dir", Mode: "0755"},                          // a copied-up parent
		{Path: "etc/debian_version", Change: result.Added, Type: "file", Mode: "0644", Size: 9}, // copied up and written
		{Path: "etc/issue", Change: result.Added, Type: "other", Mode: "0000"},                  // a whiteout
		{Path: "etc/new", Change: result.Added, Type: "file", Mode: "0600", Size: 3},            // new
		{Path: "gone", Change: result.Added, Type: "other", Mode: "0000"},                       // a whiteout of nothing below
		{Path: "usr", Change: result.Added, Type: "dir", Mode: "0755"},                          // parent
		{Path: "usr/lib", Change: result.Added, Type: "dir", Mode: "0755"},                      // removed and made again
		{Path: "usr/lib/a", Change: result.Added, Type: "file", Mode: "0644", Size: 1},          // written again
		{Path: "var", Change: result.Added, Type: "dir", Mode: "0700"},                          // chmod
		{Path: "opt/x", Change: result.Deleted, Type: "file", Mode: "0644"},                     // was in the baseline
		{Path: "dev/null", Change: result.Added, Type: "other", Mode: "0666"},                   // not a whiteout
	}
	got := rootChanges(in, func(p string) (pathInfo, bool) { pi, ok := upper[p]; return pi, ok }, tree)
	want := []string{
		"dev/null added other",
		"etc/debian_version modified file",
		"etc/issue deleted file",
		"etc/new added file",
		"opt/x deleted file",
		"usr/lib modified dir",
		"usr/lib/a modified file",
		"usr/lib/b deleted symlink",
		"var modified dir",
	}
	var have []string
	for _, c := range got {
		have = append(have, c.Path+" "+string(c.Change)+" "+c.Type)
	}
	if !slices.Equal(have, want) {
		t.Errorf("rootChanges =\n%s\nwant\n%s", strings.Join(have, "\n"), strings.Join(want, "\n"))
	}
}
