package manifest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzParse feeds arbitrary bytes to Parse as YAML, JSON and sniffed input.
// Parse must not panic (its recover turns a panic into an "internal error",
// which fails here), and whatever it accepts must re-validate and survive a
// round trip through its canonical YAML and JSON with the same digest.
func FuzzParse(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("testdata", "*.*"))
	for _, p := range files {
		if b, err := os.ReadFile(p); err == nil {
			f.Add(b, uint8(0))
			f.Add(b, uint8(2))
		}
	}
	for _, s := range []string{
		"",
		"{}",
		"image: python\ntier: gvisor\n",
		"resources: {cpus: 0.5, memory: 1.5GiB, timeout: 1m30s, stdout_bytes: 0}",
		"resources: {memory: 2TiB, pids: 010, timeout: 30}",
		"inputs: [{src: a, dst: ../x}, {src: b, dst: b/c}, {src: c/b}]",
		"env: {LANG: C.UTF-8, A: \"x\\0y\", 1B: c, D: 2024-01-01}",
		"env: {A: &a x, B: *a}",
		"resources: {<<: {pids: 5}}",
		"security: {allow_missing: [landlock, landlock]}",
		"network: {mode: allowlist}",
		"network: {inbound: [8000, \"9000-9100\", \"1-65535\", 0, \"80-\", \"08\", {a: 1}]}",
		"network: {mode: allowlist}\npackages: {pypi: {index: \"http://127.0.0.1:1/simple\", allow: [\"requests==2.31.0 --hash=sha256:00\", idna]}, npm: {allow: [\"@types/node@>=20\"]}, typosquat: warn}",
		"a: 1\n---\nb: 2\n",
		"resources: {memory: 1GiB}\njustifications: {resources.memory: \"pandas\", network.allow: x, bogus: \"\\u202e\"}",
		"? [a, b]\n: c\n",
		"image: !!binary aGVsbG8=",
		`{"image": "python", "env": {"K": "\u00e9\ud83d\ude00"}, "resources": {"cpus": 1e-2}}`,
		`{"inputs": [{"src": "x", "dst": "x\u0000"}]}`,
		`[[[[[[[[[[]]]]]]]]]]`,
	} {
		f.Add([]byte(s), uint8(0))
		f.Add([]byte(s), uint8(1))
	}
	names := []string{"m.yaml", "m.json", ""}
	f.Fuzz(func(t *testing.T, data []byte, which uint8) {
		name := names[int(which)%len(names)]
		m, err := Parse(data, name)
		if err != nil {
			if m != nil {
				t.Fatalf("Parse returned a manifest and an error: %v", err)
			}
			if strings.Contains(err.Error(), "internal error") {
				t.Fatalf("Parse panicked: %v", err)
			}
			if err.Error() == "" {
				t.Fatal("empty error message")
			}
			return
		}
		if err := m.Validate(); err != nil {
			t.Fatalf("accepted manifest does not re-validate: %v", err)
		}
		if m.Digest() == "" {
			t.Fatal("accepted manifest has no digest")
		}
		assertRoundTrip(t, m)
	})
}
