package main

import (
	"archive/zip"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/engine"
)

// buildHome makes a MOAT_HOME whose store holds the default store's
// python image (linked, not copied: the builder copies what it builds
// on) and is reachable by the sandbox's unprivileged ids.
func buildHome(t *testing.T) []string {
	t.Helper()
	home := t.TempDir()
	for _, d := range []string{filepath.Dir(home), home} {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(home, "images"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(engine.DefaultHome(), "images", "python"), filepath.Join(home, "images", "python")); err != nil {
		t.Fatal(err)
	}
	return []string{"MOAT_HOME=" + home}
}

// writeWheel writes a pure-Python wheel of package hello to dir.
func writeWheel(t *testing.T, dir string) {
	t.Helper()
	files := []struct{ name, body string }{
		{"hello/__init__.py", "def greet():\n    return 'hi from wheel'\n"},
		{"hello-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: hello\nVersion: 1.0\n"},
		{"hello-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: moat-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"},
	}
	var record strings.Builder
	for _, f := range files {
		sum := sha256.Sum256([]byte(f.body))
		fmt.Fprintf(&record, "%s,sha256=%s,%d\n", f.name, base64.RawURLEncoding.EncodeToString(sum[:]), len(f.body))
	}
	record.WriteString("hello-1.0.dist-info/RECORD,,\n")
	files = append(files, struct{ name, body string }{"hello-1.0.dist-info/RECORD", record.String()})
	out, err := os.Create(filepath.Join(dir, "hello-1.0-py3-none-any.whl"))
	if err != nil {
		t.Fatal(err)
	}
	zw := zip.NewWriter(out)
	for _, f := range files {
		w, err := zw.Create(f.name)
		if err != nil {
			t.Fatal(err)
		}
		w.Write([]byte(f.body))
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	out.Close()
}

// TestImageBuildDockerfile builds a Dockerfile FROM python end to end
// (its RUN steps in real native sandboxes) twice, checks both builds
// have the same digest, then runs the image with no command: its CMD
// runs and sees its ENV.
func TestImageBuildDockerfile(t *testing.T) {
	t.Parallel() // one of the slow ones (cli_test.go: TestMain)
	needSandbox(t)
	env := buildHome(t)
	ctxDir := t.TempDir()
	if err := os.Chmod(ctxDir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{
		"app.py":    "import os, hello\nprint(os.environ['GREETING'], open('/app/gen.txt').read().strip(), hello.greet())\n",
		"pkg/m.py":  "X = 1\n",
		"README.md": "not copied\n",
	} {
		os.MkdirAll(filepath.Join(ctxDir, filepath.Dir(name)), 0o755)
		if err := os.WriteFile(filepath.Join(ctxDir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	writeWheel(t, ctxDir)
	dockerfile := filepath.Join(ctxDir, "Dockerfile")
	if err := os.WriteFile(dockerfile, []byte(`# syntax=docker/dockerfile:1
FROM python
ARG WHEEL=hello-1.0-py3-none-any.whl
ENV GREETING=hello PATH=/app/bin:$PATH
WORKDIR /app
COPY app.py ./
COPY pkg/ ./pkg/
COPY ${WHEEL} /opt/wheels/
RUN python3 -c 'import pathlib; pathlib.Path("/app/gen.txt").write_text("generated\n")'
RUN python3 -m compileall -q /app/pkg
RUN pip install --no-index --break-system-packages /opt/wheels/$WHEEL
LABEL org.example=ignored
CMD ["python3", "/app/app.py"]
`), 0o644); err != nil {
		t.Fatal(err)
	}
	var digests []string
	for i := range 2 {
		out := moat(t, invocation{args: []string{"image", "build", "app", "-f", dockerfile}, env: env})
		out.check(t, 0, []string{"app sha256:", "from dockerfile:" + dockerfile}, []string{"step 1/9 (Dockerfile:4): ENV GREETING=hello", "step 8/9 (Dockerfile:11): RUN pip install", "note: Dockerfile:12: LABEL ignored", "built app sha256:"}, nil)
		if out.code != 0 {
			t.Fatalf("build %d failed", i+1)
		}
		digests = append(digests, strings.Fields(out.stdout)[1])
	}
	if digests[0] != digests[1] {
		t.Errorf("the same Dockerfile built %s, then %s", digests[0], digests[1])
	}
	// The lockfile beside the Dockerfile records the build; --locked
	// rebuilds and passes while nothing changed.
	lockData, err := os.ReadFile(dockerfile + ".lock")
	if err != nil || !strings.Contains(string(lockData), digests[0]) || !strings.Contains(string(lockData), `"python3"`) {
		t.Errorf("Dockerfile.lock = %s, %v; want the digest and the tree's Debian packages", lockData, err)
	}
	moat(t, invocation{args: []string{"image", "build", "app", "-f", dockerfile, "--locked"}, env: env}).check(t, 0, []string{digests[0]}, nil, nil)
	out := moat(t, invocation{args: []string{"run", "--image", "app"}, env: env})
	out.check(t, 0, []string{"hello generated hi from wheel"}, nil, nil)
	// Every image runs on every Linux tier (issue 19 §3), built ones
	// too: the gVisor tier on the same tree, the microVM tier on an ext4
	// disk made from it, each running the CMD with the image's ENV.
	for _, tierName := range []string{"gvisor", "microvm"} {
		t.Run("tier "+tierName, func(t *testing.T) {
			out := moat(t, invocation{args: []string{"run", "--no-build", "--tier", tierName, "--image", "app"}, env: env})
			out.check(t, 0, []string{"hello generated hi from wheel"}, nil, nil)
		})
	}
}

// TestImageBuildStepFails: a RUN step that exits non-zero is the build
// file's failure, not Moat's: exit 2 (not 125), naming the file, the
// line, the step's status and its last output, for a Dockerfile and an
// image file alike.
func TestImageBuildStepFails(t *testing.T) {
	t.Parallel() // one of the slow ones (cli_test.go: TestMain)
	needSandbox(t)
	env := buildHome(t)
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, file, body string
		wantErr          []string
	}{
		{"Dockerfile RUN false", "Dockerfile", "FROM python\nENV A=1\nRUN false\n",
			[]string{"Dockerfile:3: RUN false exited with status 1"}},
		{"Dockerfile RUN with output", "out.Dockerfile", "FROM python\nRUN echo compiling; echo boom >&2; exit 3\n",
			[]string{"out.Dockerfile:2: RUN echo compiling; echo boom >&2; exit 3 exited with status 3; its last output:", "boom"}},
		{"image file run", "app.yaml", "version: 1\nbase: {image: python}\nrun:\n  - \"true\"\n  - \"false\"\n",
			[]string{"app.yaml:5: RUN false exited with status 1"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := filepath.Join(dir, tc.file)
			if err := os.WriteFile(f, []byte(tc.body), 0o644); err != nil {
				t.Fatal(err)
			}
			out := moat(t, invocation{args: []string{"image", "build", "app", "-f", f}, env: env})
			out.check(t, exitUsage, nil, tc.wantErr, nil)
			if _, err := os.Lstat(filepath.Join(strings.TrimPrefix(env[0], "MOAT_HOME="), "images", "app", "current")); err == nil {
				t.Errorf("a failed build made app current")
			}
		})
	}
}

// TestImageBuildFileErrors: what `moat image build NAME -f FILE` says
// before it builds anything.
func TestImageBuildFileErrors(t *testing.T) {
	needRoot(t)
	env := buildHome(t)
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("Dockerfile", "FROM python\n")
	unknown := write("unknown.Dockerfile", "FROM cobol\n")
	bad := write("bad.Dockerfile", "FROM python\nRUN --mount=type=cache,target=/x true\n")
	sniffed := write("build-file", "# comment\nFROM python AS x\n")
	other := write("notes.txt", "hello\n")
	yaml := write("app.yaml", "base: python\n")
	tests := []struct {
		name    string
		args    []string
		code    int
		wantErr []string
	}{
		{name: "missing file", args: []string{"image", "build", "app", "-f", filepath.Join(dir, "nope")}, code: exitUsage, wantErr: []string{"-f " + filepath.Join(dir, "nope"), "no such file"}},
		{name: "no name", args: []string{"image", "build", "-f", good}, code: exitUsage, wantErr: []string{"name the image to build"}},
		{name: "bad name", args: []string{"image", "build", "App/x", "-f", good}, code: exitUsage, wantErr: []string{`image name "App/x"`}},
		{name: "built-in name", args: []string{"image", "build", "python", "-f", good}, code: exitUsage, wantErr: []string{"built-in image definition"}},
		{name: "unknown FROM names the stored images", args: []string{"image", "build", "app", "-f", unknown}, code: exitUsage, wantErr: []string{`unknown.Dockerfile:1: FROM cobol: no image named "cobol"; stored images: python; built-in images you can build: base, code-interpreter, node (or add cobol with`, "moat image import cobol"}},
		{name: "refused instruction names the line", args: []string{"image", "build", "app", "-f", bad}, code: exitUsage, wantErr: []string{"bad.Dockerfile:2: RUN --mount is not supported"}},
		{name: "first instruction FROM makes a Dockerfile", args: []string{"image", "build", "app", "-f", sniffed}, code: exitUsage, wantErr: []string{"build-file:2: FROM ... AS x is not supported"}},
		{name: "neither kind", args: []string{"image", "build", "app", "-f", other}, code: exitUsage, wantErr: []string{"not a Dockerfile", "NAME.yaml"}},
		{name: "yaml goes to the image file reader", args: []string{"image", "build", "app", "-f", yaml}, code: exitUsage, wantErr: []string{yaml}},
		{name: "unknown build arg", args: []string{"image", "build", "app", "-f", good, "--build-arg", "X=1"}, code: exitUsage, wantErr: []string{"--build-arg X: the Dockerfile declares no ARG"}},
		{name: "locked without a lockfile", args: []string{"image", "build", "app", "-f", good, "--locked"}, code: exitUsage, wantErr: []string{"image build --locked: read lockfile", "Dockerfile.lock", "build once without --locked"}},
		{name: "build-arg without -f", args: []string{"image", "build", "--build-arg", "X=1", "python"}, code: exitUsage, wantErr: []string{"go with -f FILE"}},
		{name: "context not a directory", args: []string{"image", "build", "app", "-f", good, "--context", other}, code: exitUsage, wantErr: []string{"--context " + other + ": not a directory"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out := moat(t, invocation{args: tc.args, env: env})
			out.check(t, tc.code, nil, tc.wantErr, nil)
			if _, err := os.Lstat(filepath.Join(strings.TrimPrefix(env[0], "MOAT_HOME="), "images", "app")); err == nil {
				t.Errorf("a refused build left images/app behind")
			}
		})
	}
}
