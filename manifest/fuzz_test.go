package manifest

import (
	"errors"
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

// FuzzParseSize checks ParseSize on any string: it never panics, what it
// accepts is 0 or more bytes and survives String, and no spelling means
// one number in one case and another in another case ("512m" is MiB;
// "512M", which Kubernetes reads as 512e6, is refused rather than read
// as either).
func FuzzParseSize(f *testing.F) {
	for _, s := range []string{
		"0", "1024", "512MiB", "512mib", "512 MiB", "1.5GiB", "10KB", "10kB", "1MB",
		"512Mi", "4Ki", "1.5Gi", "512m", "2g", "1t", "100b", "512M", "512k", "512K",
		"1gb", "1Gb", "512Mm", "1e3", "0x10", "-1", ".5MiB", "9223372036854775807", "8388608TiB",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := ParseSize(s)
		if err != nil {
			var fe *FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("ParseSize(%q): %v is not a *FieldError", s, err)
			}
			return
		}
		if got < 0 {
			t.Fatalf("ParseSize(%q) = %d < 0", s, got)
		}
		if back, err := ParseSize(got.String()); err != nil || back != got {
			t.Fatalf("ParseSize(%q) = %d, whose String %q parses as %d, %v", s, got, got.String(), back, err)
		}
		for _, other := range []string{strings.ToUpper(s), strings.ToLower(s)} {
			if v, err := ParseSize(other); err == nil && v != got {
				t.Fatalf("ParseSize(%q) = %d but ParseSize(%q) = %d: case changed the size", s, got, other, v)
			}
		}
	})
}
