package layering

import (
	"bufio"
	"bytes"
	"os/exec"
	"path"
	"regexp"
	"strings"
	"testing"
)

// pkg is one package of the module as go list reports it.
type pkg struct {
	path        string   // relative to the module: "tier/native"
	imports     []string // non-test imports, module-relative where they are the module's
	testImports []string // of the package's own _test.go files (not of an external _test package)
}

func listPackages(t *testing.T) map[string]pkg {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		t.Fatalf("the go command is not on PATH: %v", err)
	}
	out, err := exec.Command("go", "list", "-f",
		"{{.ImportPath}}|{{join .Imports \" \"}}|{{join .TestImports \" \"}}",
		"github.com/moat-sandbox/moat/...").Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("go list: %v\n%s", err, stderr)
	}
	const mod = "github.com/moat-sandbox/moat/"
	rel := func(fields []string) []string {
		var out []string
		for _, f := range fields {
			out = append(out, strings.TrimPrefix(f, mod))
		}
		return out
	}
	pkgs := map[string]pkg{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), "|", 3)
		if len(parts) != 3 {
			t.Fatalf("go list printed %q", sc.Text())
		}
		p := pkg{path: strings.TrimPrefix(parts[0], mod), imports: rel(strings.Fields(parts[1])), testImports: rel(strings.Fields(parts[2]))}
		pkgs[p.path] = p
	}
	if len(pkgs) < 20 {
		t.Fatalf("go list found only %d packages: is the test running inside the module?", len(pkgs))
	}
	return pkgs
}

// concreteTier matches the package of one isolation tier (or a package
// inside it): tier/native, tier/microvm/jail. Not tier itself, nor the
// conformance suite tier/tiertest.
var concreteTier = regexp.MustCompile(`^tier/([a-z0-9]+)(/.*)?$`)

func tierOf(p string) string {
	m := concreteTier.FindStringSubmatch(p)
	if m == nil || m[1] == "tiertest" {
		return ""
	}
	return m[1]
}

func TestLayering(t *testing.T) {
	pkgs := listPackages(t)
	guestInits := []string{"guest/nsinit", "guest/gvinit", "guest/vmagent"}
	tests := []struct {
		name string
		// forbidden reports why importer may not import imp ("" if it may).
		forbidden func(importer, imp string) string
		// test: also check the imports of the package's own _test.go
		// files. An external test package (package native_test) is not
		// checked: it is an end-to-end test of the tier through the
		// engine, outside the package graph, as a user's program would be.
		test bool
	}{
		{
			name: "no tier imports the engine, the service or the front doors",
			forbidden: func(importer, imp string) string {
				if !strings.HasPrefix(importer, "tier/") {
					return ""
				}
				for _, up := range []string{"engine", "service", "server", "cmd"} {
					if imp == up || strings.HasPrefix(imp, up+"/") {
						return "a tier is below the engine: the engine uses tiers through package tier, never the reverse"
					}
				}
				return ""
			},
			test: true,
		},
		{
			name: "no tier imports another tier",
			forbidden: func(importer, imp string) string {
				a, b := tierOf(importer), tierOf(imp)
				if a != "" && b != "" && a != b {
					return "tiers share code through package tier or a leaf package, so that each tier is one folder"
				}
				return ""
			},
		},
		{
			name: "the conformance suite tests tiers at the tier.Tier abstraction",
			forbidden: func(importer, imp string) string {
				if importer == "tier/tiertest" && (tierOf(imp) != "" || imp == "engine") {
					return "tier/tiertest takes a tier.Tier; the tier's own tests pass it in"
				}
				return ""
			},
			test: true,
		},
		{
			name: "the engine knows no concrete tier and no guest's init",
			forbidden: func(importer, imp string) string {
				if importer != "engine" {
					return ""
				}
				if tierOf(imp) != "" {
					return "the engine builds tiers through tier.Lookup (tiers register themselves)"
				}
				for _, g := range guestInits {
					if imp == g || imp == "guest" {
						return "guest code runs inside sandboxes; the engine needs only leaf packages (wire types, the source id)"
					}
				}
				return ""
			},
		},
		{
			name: "a guest's init is imported only to run it",
			forbidden: func(importer, imp string) string {
				for _, g := range guestInits {
					if imp == g && importer != "guest" && !strings.HasPrefix(importer, g+"/") {
						return "only the guest dispatcher (package guest) imports an init: its host-side types live in a wire package"
					}
				}
				return ""
			},
		},
		{
			name: "the image builder runs steps through a StepRunner, not the engine or a tier",
			forbidden: func(importer, imp string) string {
				if importer != "imagebuild" {
					return ""
				}
				if imp == "engine" || imp == "tier" || strings.HasPrefix(imp, "tier/") || imp == "service" || strings.HasPrefix(imp, "server") {
					return "imagebuild is below the engine: cmd/moat adapts engine.RunBuildStep to imagebuild.StepRunner, and tests pass a fake"
				}
				return ""
			},
			test: true,
		},
		{
			name: "the package guard is a leaf, and the proxy serves it as an http.Handler",
			forbidden: func(importer, imp string) string {
				_, ours := pkgs[imp]
				switch {
				case importer == "pkgguard" && ours:
					return "pkgguard imports nothing of Moat's, so that manifest can validate allow entries with its parser; its upstream transport is handed in"
				case importer == "egress" && imp == "pkgguard":
					return "the proxy serves the guard as an http.Handler set by the engine (Proxy.ServeIndex), so the proxy does not depend on index protocols"
				}
				return ""
			},
			test: true,
		},
		{
			name: "front doors stand on the service layer, never on test helpers",
			forbidden: func(importer, imp string) string {
				if importer != "server" && !strings.HasPrefix(importer, "server/") {
					return ""
				}
				switch {
				case imp == "net/http/httptest":
					return "an adapter that builds httptest requests to our own handlers is missing the service layer"
				case imp == "engine" || imp == "tier" || strings.HasPrefix(imp, "tier/"):
					return "a front door decodes, calls the service and encodes: what it needs of the engine, the service names"
				}
				return ""
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for _, p := range pkgs {
				check := func(imports []string, kind string) {
					for _, imp := range imports {
						if why := tc.forbidden(p.path, imp); why != "" {
							t.Errorf("%s imports %s (%s): %s", p.path, imp, kind, why)
						}
					}
				}
				check(p.imports, "in its non-test files")
				if tc.test {
					check(p.testImports, "in its tests")
				}
			}
		})
	}
	t.Run("server, server/e2b and server/mcp import the service layer", func(t *testing.T) {
		for _, front := range []string{"server", "server/e2b", "server/mcp"} {
			p, ok := pkgs[front]
			if !ok {
				t.Fatalf("package %s is missing", front)
			}
			found := false
			for _, imp := range p.imports {
				found = found || imp == "service"
			}
			if !found {
				t.Errorf("%s does not import service: a front door decodes, calls the service and encodes", front)
			}
		}
	})
}

// TestTierOf pins the helper the rules above depend on.
func TestTierOf(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"tier", ""}, {"tier/tiertest", ""}, {"tier/native", "native"},
		{"tier/microvm/jail", "microvm"}, {"engine", ""}, {path.Join("tier", "wasm"), "wasm"},
	} {
		if got := tierOf(tc.in); got != tc.want {
			t.Errorf("tierOf(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
