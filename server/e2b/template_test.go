package e2b

import (
	"net/http"
	"slices"
	"strings"
	"testing"
)

// TestTemplateImage: "base" is the image "base" only on a host whose store
// holds it; every other template is the image of its name.
func TestTemplateImage(t *testing.T) {
	tests := []struct {
		name     string
		template string
		hasBase  bool
		want     string
	}{
		{"base without a base image is the default image", "base", false, "python"},
		{"base with a base image is base", "base", true, "base"},
		{"empty template is base", "", true, "base"},
		{"empty template without base is the default", "", false, "python"},
		{"node is node", "node", false, "node"},
		{"node is node whatever base is", "node", true, "node"},
		{"python is python", "python", true, "python"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, template, _, e := sandboxManifestWith(&newSandbox{TemplateID: tc.template}, tc.hasBase)
			if e != nil {
				t.Fatalf("sandboxManifestWith: %v", e.Message)
			}
			if m["image"] != tc.want {
				t.Errorf("image = %v, want %q", m["image"], tc.want)
			}
			if want := tc.template; want != "" && template != want {
				t.Errorf("template = %q, want %q", template, want)
			}
		})
	}
}

// TestCreateBaseTemplate drives create on hosts with and without the base
// image: the fake backend refuses any image it lacks, so a 201 proves
// which image the sandbox got.
func TestCreateBaseTemplate(t *testing.T) {
	has := func(images ...string) func(string) bool {
		return func(name string) bool { return slices.Contains(images, name) }
	}
	tests := []struct {
		name     string
		images   []string // what the backend can run
		hasImage func(string) bool
		want     int
		wantMsg  string
	}{
		{"base built: base runs on base", []string{"base"}, has("base"), http.StatusCreated, ""},
		{"base not built: base runs on python", []string{"python"}, has("python"), http.StatusCreated, ""},
		{"no HasImage: base runs on python", []string{"python"}, nil, http.StatusCreated, ""},
		{"base not built, no python: refused naming base", []string{"base"}, has(), http.StatusBadRequest, "base"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnvWith(t, tc.images, tc.hasImage)
			status, data := e.control("POST", "/v2/sandboxes", keyA, `{"templateID":"base"}`)
			if status != tc.want {
				t.Fatalf("create: %d %s, want %d", status, data, tc.want)
			}
			if tc.wantMsg != "" && !strings.Contains(string(data), tc.wantMsg) {
				t.Errorf("body %s does not name %q", data, tc.wantMsg)
			}
		})
	}
}
