package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestImageBuildImageFile builds a declarative image file end to end: pip
// packages pinned by hash from local wheels (no network: PyPI is not
// reachable here, and a --no-index install needs none), files, env,
// workdir and cmd. The same file builds the same digest and the same
// lockfile twice; --locked refuses a changed file and a tampered wheel
// fails pip's hash check, each leaving the current build as it was.
func TestImageBuildImageFile(t *testing.T) {
	t.Parallel() // one of the slow ones (cli_test.go: TestMain)
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
		code    int
		wantErr []string
	}{
		{
			name: "--locked refuses a changed file",
			change: func(t *testing.T) {
				os.WriteFile(imageFile, []byte(strings.Replace(spec, "production", "staging", 1)), 0o644)
			},
			args:    []string{"--locked"},
			code:    exitDiffers,
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
			code:    exitUsage,
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
			out.check(t, tc.code, nil, tc.wantErr, nil)
			// The current build is still the good one.
			moat(t, invocation{args: []string{"image", "inspect", "app"}, env: env}).check(t, 0, []string{digests[0]}, nil, nil)
		})
	}
}

// TestImageBuildDebianApt builds a debian base with an apt package end to
// end: the bootstrap (on the host) only downloads jq, a sandboxed step
// with no network installs it, and the lockfile records every package's
// version and the sha256 of its .deb. The same file builds the same
// digest twice (the second build --locked against the first's lockfile,
// hashes included), jq runs in a sandbox on the image, and removing the
// image leaves none. Two Debian bootstraps: a few minutes.
func TestImageBuildDebianApt(t *testing.T) {
	t.Parallel() // one of the slow ones (cli_test.go: TestMain)
	needSandbox(t)
	env := buildHome(t)
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	imageFile := filepath.Join(dir, "jq.yaml")
	spec := "version: 1\nbase: {debian: bookworm}\napt: [jq]\ncmd: [jq, --version]\n"
	if err := os.WriteFile(imageFile, []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	build := func(extra ...string) outcome {
		return moat(t, invocation{args: append([]string{"image", "build", "debjq", "-f", imageFile}, extra...), env: env, timeout: 10 * time.Minute})
	}
	removed := false
	t.Cleanup(func() {
		if !removed {
			moat(t, invocation{args: []string{"image", "rm", "debjq"}, env: env})
		}
	})
	start := time.Now()
	out := build()
	t.Logf("first build: %s", time.Since(start).Round(time.Second))
	out.check(t, 0, []string{"debjq sha256:"}, []string{"downloading jq", "apt: jq", "Setting up jq", "built debjq sha256:"}, nil)
	if out.code != 0 {
		t.Fatalf("build failed:\n%s", out)
	}
	digest := strings.Fields(out.stdout)[1]
	data, err := os.ReadFile(imageFile + ".lock")
	if err != nil {
		t.Fatal(err)
	}
	var lock struct {
		Debian       map[string]string `json:"debian"`
		DebianSHA256 map[string]string `json:"debian_sha256"`
		Digest       string            `json:"digest"`
	}
	if err := json.Unmarshal(data, &lock); err != nil {
		t.Fatal(err)
	}
	if lock.Digest != digest || lock.Debian["jq"] == "" {
		t.Errorf("lockfile digest %s (built %s), jq %q", lock.Digest, digest, lock.Debian["jq"])
	}
	// Every installed package came from the bootstrap's downloads: each
	// has a hash, and no hash is of a package not installed.
	for pkg := range lock.Debian {
		if h := lock.DebianSHA256[pkg]; !strings.HasPrefix(h, "sha256:") || len(h) != len("sha256:")+64 {
			t.Errorf("debian_sha256 of %s = %q", pkg, h)
		}
	}
	for pkg := range lock.DebianSHA256 {
		if _, ok := lock.Debian[pkg]; !ok {
			t.Errorf("debian_sha256 names %s, which is not installed", pkg)
		}
	}

	moat(t, invocation{args: []string{"run", "--image", "debjq", "--", "sh", "-c", `echo '{"a": [1, 2]}' | jq -c '.a | add'`}, env: env}).
		check(t, 0, []string{"3"}, nil, nil)

	start = time.Now()
	again := build("--locked")
	t.Logf("second build (--locked): %s", time.Since(start).Round(time.Second))
	again.check(t, 0, []string{digest}, nil, []string{"differs from its lockfile"})

	moat(t, invocation{args: []string{"image", "rm", "debjq"}, env: env}).check(t, 0, nil, nil, nil)
	removed = true
	moat(t, invocation{args: []string{"image", "inspect", "debjq"}, env: env}).check(t, exitUsage, nil, []string{`"debjq"`}, nil)
}
