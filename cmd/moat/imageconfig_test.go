package main

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/client"
	"github.com/moat-sandbox/moat/manifest"
)

// writeDockerArchive writes a docker-archive (what `docker save` writes)
// whose one layer holds this test's moat binary as /bin/moat, with the
// image config cfg.
func writeDockerArchive(t *testing.T, file string, cfg map[string]any) {
	t.Helper()
	writeDockerArchiveOf(t, file, moatBin, "bin/moat", cfg)
}

// writeDockerArchiveOf writes a docker-archive whose one layer holds the
// program at binPath as name (e.g. "bin/moat"), with the image config cfg.
func writeDockerArchiveOf(t *testing.T, file, binPath, name string, cfg map[string]any) {
	t.Helper()
	bin, err := os.ReadFile(binPath)
	if err != nil {
		t.Fatal(err)
	}
	layer := filepath.Join(t.TempDir(), "layer.tar")
	lf, err := os.Create(layer)
	if err != nil {
		t.Fatal(err)
	}
	lw := tar.NewWriter(lf)
	for _, h := range []*tar.Header{
		{Name: "bin/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "srv/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: name, Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(bin))},
	} {
		if err := lw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := lw.Write(bin); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := lw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := lf.Close(); err != nil {
		t.Fatal(err)
	}
	layerData, err := os.ReadFile(layer)
	if err != nil {
		t.Fatal(err)
	}
	config, _ := json.Marshal(map[string]any{"architecture": "amd64", "os": "linux", "config": cfg})
	manifest, _ := json.Marshal([]map[string]any{{"Config": "config.json", "Layers": []string{"layer.tar"}}})
	f, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w := tar.NewWriter(f)
	for _, m := range []struct {
		name string
		data []byte
	}{{"manifest.json", manifest}, {"config.json", config}, {"layer.tar", layerData}} {
		if err := w.WriteHeader(&tar.Header{Name: m.name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(m.data))}); err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write(m.data); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestRunImageCommand: `moat run` with no command runs an imported
// image's Entrypoint+Cmd; a command replaces them; an image with neither
// is refused with the usage line; --json names the import's source.
func TestRunImageCommand(t *testing.T) {
	t.Parallel() // one of the slow ones (cli_test.go: TestMain)
	needRoot(t)
	watchLeftovers(t)
	// The sandbox's unprivileged init must reach the image below the
	// home, and t.TempDir's parent is private.
	home := t.TempDir()
	for _, d := range []string{filepath.Dir(home), home} {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	env := []string{"MOAT_HOME=" + home}
	archive := filepath.Join(t.TempDir(), "app.tar")
	writeDockerArchive(t, archive, map[string]any{
		"Entrypoint": []string{"/bin/moat"}, "Cmd": []string{"version"}, "WorkingDir": "/srv", "Env": []string{"PATH=/bin"}})
	if out := moat(t, invocation{args: []string{"image", "import", "app", "docker-archive:" + archive}, env: env}); out.code != 0 {
		t.Fatalf("import: %v", out)
	}
	bare := filepath.Join(t.TempDir(), "bare.tar")
	writeDockerArchive(t, bare, map[string]any{"Env": []string{"PATH=/bin"}})
	if out := moat(t, invocation{args: []string{"image", "import", "bare", "docker-archive:" + bare}, env: env}); out.code != 0 {
		t.Fatalf("import: %v", out)
	}
	t.Cleanup(func() {
		moat(t, invocation{args: []string{"image", "rm", "--force", "app"}, env: env})
		moat(t, invocation{args: []string{"image", "rm", "--force", "bare"}, env: env})
	})

	tests := []struct {
		name     string
		args     []string
		code     int
		wantArgv []string
		wantErr  []string
	}{
		{name: "no command: entrypoint and cmd", args: []string{"--image", "app"}, wantArgv: []string{"/bin/moat", "version"}},
		{name: "a command replaces them", args: []string{"--image", "app", "--", "/bin/moat", "help"}, wantArgv: []string{"/bin/moat", "help"}},
		{name: "image with neither", args: []string{"--image", "bare"}, code: exitUsage, wantErr: []string{"no command given", `image "bare" has no Entrypoint or Cmd`, "moat run --help"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out := moat(t, invocation{args: append([]string{"run", "--json"}, tc.args...), env: env})
			if tc.code != 0 {
				out.check(t, tc.code, nil, tc.wantErr, nil)
				return
			}
			if out.code != 0 {
				t.Fatalf("run: %v", out)
			}
			var res struct {
				Command  []string `json:"command"`
				ExitCode int      `json:"exit_code"`
				Image    struct {
					Source       string `json:"source"`
					SourceDigest string `json:"source_digest"`
				} `json:"image"`
			}
			if err := json.Unmarshal([]byte(out.stdout), &res); err != nil {
				t.Fatalf("decode result: %v\n%v", err, out)
			}
			if !slices.Equal(res.Command, tc.wantArgv) || res.ExitCode != 0 {
				t.Errorf("ran %q (exit %d), want %q exiting 0\n%v", res.Command, res.ExitCode, tc.wantArgv, out)
			}
			if res.Image.Source != "docker-archive:"+archive || len(res.Image.SourceDigest) != len("sha256:")+64 {
				t.Errorf("result image source %q %q, want the archive and its config digest", res.Image.Source, res.Image.SourceDigest)
			}
		})
	}
	// Every image runs on every Linux tier (issue 19 §3), imported ones
	// too: the gVisor tier on the same tree, the microVM tier on an ext4
	// disk made from it. The image's Entrypoint and Cmd, its WorkingDir
	// and its PATH-only Env hold there as on the native tier.
	for _, tierName := range []string{"gvisor", "microvm"} {
		t.Run("tier "+tierName, func(t *testing.T) {
			out := moat(t, invocation{args: []string{"run", "--json", "--tier", tierName, "--image", "app"}, env: env})
			var res struct {
				Command  []string `json:"command"`
				ExitCode int      `json:"exit_code"`
				Stdout   struct {
					Data string `json:"data"`
				} `json:"stdout"`
			}
			if err := json.Unmarshal([]byte(out.stdout), &res); err != nil || out.code != 0 {
				t.Fatalf("run on %s: %v\n%v", tierName, err, out)
			}
			if !slices.Equal(res.Command, []string{"/bin/moat", "version"}) || res.ExitCode != 0 || !strings.HasPrefix(res.Stdout.Data, "moat ") {
				t.Errorf("on %s ran %q (exit %d, stdout %q), want /bin/moat version exiting 0\n%v", tierName, res.Command, res.ExitCode, res.Stdout.Data, out)
			}
		})
	}
}

// TestServeRunsImageCommand: through `moat serve` and the Go SDK, a run
// with no argv on an imported image runs its Entrypoint and Cmd, and one
// on an image with neither is refused naming argv (a 400, not a run).
func TestServeRunsImageCommand(t *testing.T) {
	needRoot(t)
	watchLeftovers(t)
	home := t.TempDir()
	for _, d := range []string{filepath.Dir(home), home} {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	env := []string{"MOAT_HOME=" + home}
	for name, cfg := range map[string]map[string]any{
		"app":  {"Entrypoint": []string{"/bin/moat"}, "Cmd": []string{"version"}, "Env": []string{"PATH=/bin"}},
		"bare": {"Env": []string{"PATH=/bin"}},
	} {
		archive := filepath.Join(t.TempDir(), name+".tar")
		writeDockerArchive(t, archive, cfg)
		if out := moat(t, invocation{args: []string{"image", "import", name, "docker-archive:" + archive}, env: env}); out.code != 0 {
			t.Fatalf("import %s: %v", name, out)
		}
	}
	key := createKey(t, home)
	s := startServer(t, home, key)
	c := s.client(t)

	tests := []struct {
		name     string
		image    string
		wantArgv []string
		wantErr  string // in the refusal
	}{
		{name: "entrypoint and cmd", image: "app", wantArgv: []string{"/bin/moat", "version"}},
		{name: "image with neither", image: "bare", wantErr: `image "bare" has no Entrypoint or Cmd`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := manifest.Default()
			m.Image = tc.image
			run, err := c.Run(context.Background(), &client.RunRequest{Manifest: m})
			if tc.wantErr != "" {
				var ae *client.Error
				if !errors.As(err, &ae) || ae.Status != 400 || ae.Field != "argv" || !strings.Contains(ae.Message, tc.wantErr) {
					t.Fatalf("error %v, want a 400 on argv containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(run.Result.Command, tc.wantArgv) || run.Result.ExitCode != 0 || !strings.Contains(run.Result.Stdout.Data, "moat") {
				t.Errorf("ran %q (exit %d, stdout %q), want %q exiting 0", run.Result.Command, run.Result.ExitCode, run.Result.Stdout.Data, tc.wantArgv)
			}
		})
		// The same through the CLI: `moat run --server` with no command.
		t.Run("cli "+tc.name, func(t *testing.T) {
			out := moat(t, invocation{args: []string{"run", "--server", s.url, "--api-key", key, "--image", tc.image}, env: env})
			if tc.wantErr != "" {
				if out.code == 0 || !strings.Contains(out.stderr, tc.wantErr) {
					t.Fatalf("want a refusal naming %q\n%s", tc.wantErr, out)
				}
				return
			}
			out.check(t, 0, []string{"moat"}, nil, nil)
		})
	}
}

// TestImageUserIsNeverRoot: an imported image whose config asks for root
// (User "root", "0:0") runs as the sandbox's unprivileged user, as issue
// 19 §1 asks; the config's User is recorded for inspect only. The image
// holds one static program that prints its ids.
func TestImageUserIsNeverRoot(t *testing.T) {
	needRoot(t)
	watchLeftovers(t)
	home := t.TempDir()
	for _, d := range []string{filepath.Dir(home), home} {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	env := []string{"MOAT_HOME=" + home}
	src := filepath.Join(t.TempDir(), "ids.go")
	if err := os.WriteFile(src, []byte("package main\n\nimport (\n\t\"fmt\"\n\t\"os\"\n)\n\nfunc main() {\n\tfmt.Printf(\"uid=%d euid=%d gid=%d egid=%d\\n\", os.Getuid(), os.Geteuid(), os.Getgid(), os.Getegid())\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ids := filepath.Join(t.TempDir(), "ids")
	build := exec.Command("go", "build", "-o", ids, src)
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GO111MODULE=off")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the ids program: %v\n%s", err, out)
	}
	for _, user := range []string{"root", "0:0"} {
		t.Run("User "+user, func(t *testing.T) {
			name := "asroot" + strings.ReplaceAll(user, ":", "")
			archive := filepath.Join(t.TempDir(), "img.tar")
			writeDockerArchiveOf(t, archive, ids, "bin/ids", map[string]any{"User": user, "Cmd": []string{"/bin/ids"}, "Env": []string{"PATH=/bin"}})
			if out := moat(t, invocation{args: []string{"image", "import", name, "docker-archive:" + archive}, env: env}); out.code != 0 {
				t.Fatalf("import: %v", out)
			}
			t.Cleanup(func() { moat(t, invocation{args: []string{"image", "rm", name}, env: env}) })
			moat(t, invocation{args: []string{"image", "inspect", name}, env: env}).check(t, 0, []string{`"user": "` + user + `"`}, nil, nil)
			moat(t, invocation{args: []string{"run", "--image", name}, env: env}).check(t, 0, []string{"uid=1000 euid=1000 gid=1000 egid=1000\n"}, nil, nil)
		})
	}
}
