package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestImageBuildImageFile builds a declarative image file end to end: pip
// packages pinned by hash from local wheels (no network: PyPI is not
// reachable here, and a --no-index install needs none), files, env,
// workdir and cmd. The same file builds the same digest and the same
// lockfile twice; --locked refuses a changed file and a tampered wheel
// fails pip's hash check, each leaving the current build as it was.
func TestImageBuildImageFile(t *testing.T) {
	needSandbox(t)
	env := buildHome(t)
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// The reader's own fixtures: a hand-made wheel and its hashed pin.
	for _, f := range []string{"requirements.txt", "wheels/moat_hello-1.0-py3-none-any.whl"} {
		b, err := os.ReadFile(filepath.Join("..", "..", "imagebuild", "testdata", "pip", f))
		if err != nil {
			t.Fatal(err)
		}
		os.MkdirAll(filepath.Join(dir, filepath.Dir(f)), 0o755)
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "main.py"), []byte("import os, moat_hello\nprint(os.environ['APP_MODE'], moat_hello.answer())\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	imageFile := filepath.Join(dir, "app.yaml")
	spec := `version: 1
base: {image: python}
pip:
  requirements: requirements.txt
  find_links: wheels
files:
  - {src: main.py, dest: /opt/app/main.py}
env: {APP_MODE: production}
workdir: /opt/app
cmd: [python3, /opt/app/main.py]
`
	if err := os.WriteFile(imageFile, []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	build := func(extra ...string) outcome {
		return moat(t, invocation{args: append([]string{"image", "build", "app", "-f", imageFile}, extra...), env: env})
	}
	var digests []string
	var locks []string
	for i := range 2 {
		out := build()
		out.check(t, 0, []string{"app sha256:", "from imagefile:" + imageFile}, []string{"pip: install requirements.txt", "Successfully installed moat-hello-1.0", "built app sha256:"}, []string{"Running pip as the 'root' user"})
		if out.code != 0 {
			t.Fatalf("build %d failed", i+1)
		}
		digests = append(digests, strings.Fields(out.stdout)[1])
		lock, err := os.ReadFile(imageFile + ".lock")
		if err != nil {
			t.Fatal(err)
		}
		locks = append(locks, string(lock))
	}
	if digests[0] != digests[1] {
		t.Errorf("the same image file built %s, then %s", digests[0], digests[1])
	}
	if locks[0] != locks[1] {
		t.Errorf("the same image file wrote two lockfiles:\n%s\n---\n%s", locks[0], locks[1])
	}
	for _, want := range []string{digests[0], `"moat-hello"`, "sha256:1b0910cd", `"python3"`} {
		if !strings.Contains(locks[0], want) {
			t.Errorf("app.yaml.lock lacks %s:\n%s", want, locks[0])
		}
	}
	moat(t, invocation{args: []string{"run", "--image", "app"}, env: env}).check(t, 0, []string{"production 42"}, nil, nil)

	tests := []struct {
		name    string
		change  func(t *testing.T)
		args    []string
		wantErr []string
	}{
		{
			name: "--locked refuses a changed file",
			change: func(t *testing.T) {
				os.WriteFile(imageFile, []byte(strings.Replace(spec, "production", "staging", 1)), 0o644)
			},
			args:    []string{"--locked"},
			wantErr: []string{"build file sha256", "->"},
		},
		{
			name: "a tampered wheel fails pip's hash check",
			change: func(t *testing.T) {
				os.WriteFile(imageFile, []byte(spec), 0o644)
				w := filepath.Join(dir, "wheels", "moat_hello-1.0-py3-none-any.whl")
				b, _ := os.ReadFile(w)
				b[len(b)/2] ^= 0xff
				os.WriteFile(w, b, 0o644)
			},
			wantErr: []string{"THESE PACKAGES DO NOT MATCH THE HASHES", "exited with status"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.change(t)
			out := build(tc.args...)
			if out.code == 0 {
				t.Fatalf("the build passed:\n%s", out)
			}
			out.check(t, out.code, nil, tc.wantErr, nil)
			// The current build is still the good one.
			moat(t, invocation{args: []string{"image", "inspect", "app"}, env: env}).check(t, 0, []string{digests[0]}, nil, nil)
		})
	}
}
