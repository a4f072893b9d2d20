package imagebuild

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/moat-sandbox/moat/image"
)

// fakeRunner stands in for the engine's RunBuildStep: it records each
// step and carries out a tiny command language on the tree from the
// shell text, as a RUN would:
//
//	write PATH CONTENT    write a file (PATH inside the tree)
//	link PATH TARGET      plant a symlink
//	print TEXT            print a line of output
//	exit N                exit with status N
//	block                 wait for the context to end
type fakeRunner struct {
	mu    sync.Mutex
	steps []RunStep
	roots []string
}

func (f *fakeRunner) RunStep(ctx context.Context, root string, s RunStep) (int, error) {
	f.mu.Lock()
	f.steps = append(f.steps, s)
	f.roots = append(f.roots, root)
	f.mu.Unlock()
	if _, err := os.Stat(filepath.Join(root, s.Dir)); err != nil {
		return -1, fmt.Errorf("working directory %s missing in the tree: %w", s.Dir, err)
	}
	script := s.Argv[len(s.Argv)-1]
	for _, cmd := range strings.Split(script, ";") {
		f := strings.Fields(cmd)
		if len(f) == 0 {
			continue
		}
		switch f[0] {
		case "write":
			p := filepath.Join(root, f[1])
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return -1, err
			}
			if err := os.WriteFile(p, []byte(strings.Join(f[2:], " ")), 0o644); err != nil {
				return -1, err
			}
		case "writenl": // as write, with \n for newlines
			p := filepath.Join(root, f[1])
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return -1, err
			}
			if err := os.WriteFile(p, []byte(strings.ReplaceAll(strings.Join(f[2:], " "), `\n`, "\n")), 0o644); err != nil {
				return -1, err
			}
		case "link":
			if err := os.Symlink(f[2], filepath.Join(root, f[1])); err != nil {
				return -1, err
			}
		case "print":
			fmt.Fprintln(s.Stdout, strings.Join(f[1:], " "))
		case "exit":
			var n int
			fmt.Sscan(f[1], &n)
			return n, nil
		case "block":
			<-ctx.Done()
			return -1, ctx.Err()
		}
	}
	return 0, nil
}

// newBaseStore makes a store holding one imported image, "rootimg", with
// files of both owners, a symlink, a hard link and a private directory.
func newBaseStore(t *testing.T) *image.Store {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: image trees hold root- and sandbox-owned files")
	}
	dir := t.TempDir()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	add := func(h *tar.Header, body string) {
		h.Size = int64(len(body))
		if h.Typeflag == tar.TypeSymlink || h.Typeflag == tar.TypeLink || h.Typeflag == tar.TypeDir {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(body))
	}
	add(&tar.Header{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755}, "")
	add(&tar.Header{Name: "usr/bin/", Typeflag: tar.TypeDir, Mode: 0o755}, "")
	add(&tar.Header{Name: "usr/bin/tool", Typeflag: tar.TypeReg, Mode: 0o755}, "#!/bin/sh\n")
	add(&tar.Header{Name: "usr/bin/tool2", Typeflag: tar.TypeLink, Linkname: "usr/bin/tool"}, "")
	add(&tar.Header{Name: "bin", Typeflag: tar.TypeSymlink, Linkname: "usr/bin"}, "")
	add(&tar.Header{Name: "home/sandbox/", Typeflag: tar.TypeDir, Mode: 0o700, Uid: 1000, Gid: 1000}, "")
	add(&tar.Header{Name: "home/sandbox/own", Typeflag: tar.TypeReg, Mode: 0o600, Uid: 1000, Gid: 1000}, "mine")
	tw.Close()
	tarPath := filepath.Join(dir, "base.tar")
	if err := os.WriteFile(tarPath, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	store := image.NewStore(filepath.Join(dir, "images"))
	src, err := image.ParseSource("rootfs:" + tarPath)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Import(context.Background(), "rootimg", src, image.ImportOptions{}); err != nil {
		t.Fatal(err)
	}
	return store
}

// contextDir writes files (name -> content) into a fresh build context.
func contextDir(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, body := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func planFor(t *testing.T, ctxDir, dockerfile string) *Plan {
	t.Helper()
	p, err := parseDockerfile("Dockerfile", []byte(dockerfile), nil)
	if err != nil {
		t.Fatal(err)
	}
	p.File, p.Context = filepath.Join(ctxDir, "Dockerfile"), ctxDir
	if err := os.WriteFile(p.File, []byte(dockerfile), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestBuild(t *testing.T) {
	type file struct {
		body string
		uid  int
	}
	tests := []struct {
		name       string
		files      map[string]string // build context
		dockerfile string
		want       map[string]file // in the image
		env        []string        // in the image's Env
		workdir    string
		entrypoint []string
		cmd        []string
		user       string
		runs       []RunStep // Argv, Dir, UID compared; Env must contain these entries
	}{
		{
			name:       "copy run env workdir cmd",
			files:      map[string]string{"app.py": "print(1)", "pkg/a.py": "a", "pkg/sub/b.py": "b"},
			dockerfile: "FROM rootimg\nENV A=1 PATH=/app/bin:$PATH\nWORKDIR /app\nCOPY app.py .\nCOPY pkg lib/\nRUN write /app/out.txt $A\nCMD [\"python3\", \"app.py\"]\n",
			want: map[string]file{
				"app/app.py": {"print(1)", 0}, "app/lib/a.py": {"a", 0}, "app/lib/sub/b.py": {"b", 0},
				"app/out.txt": {"$A", 0}, "usr/bin/tool": {"#!/bin/sh\n", 0}, "usr/bin/tool2": {"#!/bin/sh\n", 0},
				"home/sandbox/own": {"mine", 1000},
			},
			env:     []string{"A=1", "PATH=/app/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
			workdir: "/app",
			cmd:     []string{"python3", "app.py"},
			runs: []RunStep{{Argv: []string{"/bin/sh", "-c", "write /app/out.txt $A"}, Dir: "/app", UID: 0,
				Env: []string{"A=1", "SOURCE_DATE_EPOCH=1686355200", "PIP_NO_CACHE_DIR=1", "HOME=/root"}}},
		},
		{
			name:       "user and chown",
			files:      map[string]string{"f": "x"},
			dockerfile: "FROM rootimg\nUSER sandbox\nCOPY --chown=sandbox f /home/sandbox/f\nCOPY f /opt/f\nRUN write /home/sandbox/made x\nUSER app\nRUN true\n",
			want:       map[string]file{"home/sandbox/f": {"x", 1000}, "opt/f": {"x", 0}},
			user:       "app",
			workdir:    "/",
			runs: []RunStep{
				{Argv: []string{"/bin/sh", "-c", "write /home/sandbox/made x"}, Dir: "/", UID: 1000, Env: []string{"HOME=/home/sandbox"}},
				{Argv: []string{"/bin/sh", "-c", "true"}, Dir: "/", UID: 1000},
			},
		},
		{
			name:       "entrypoint drops inherited cmd, relative workdir, args in run env only",
			files:      map[string]string{"x": "1", "y": "2"},
			dockerfile: "FROM rootimg\nARG V=7\nWORKDIR srv\nCOPY x y ./\nRUN true\nENTRYPOINT [\"tool\"]\n",
			want:       map[string]file{"srv/x": {"1", 0}, "srv/y": {"2", 0}},
			workdir:    "/srv",
			entrypoint: []string{"tool"},
			runs:       []RunStep{{Argv: []string{"/bin/sh", "-c", "true"}, Dir: "/srv", Env: []string{"V=7"}}},
		},
		{
			name:       "glob sources and a file to a file",
			files:      map[string]string{"a.txt": "a", "b.txt": "b", "c.md": "c"},
			dockerfile: "FROM rootimg\nCOPY *.txt /t/\nCOPY c.md /d/readme\n",
			want:       map[string]file{"t/a.txt": {"a", 0}, "t/b.txt": {"b", 0}, "d/readme": {"c", 0}},
			workdir:    "/",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			store := newBaseStore(t)
			ctxDir := contextDir(t, tc.files)
			runner := &fakeRunner{}
			var progress bytes.Buffer
			img, err := Build(context.Background(), store, "app", planFor(t, ctxDir, tc.dockerfile), Options{Runner: runner, Progress: &progress})
			if err != nil {
				t.Fatalf("Build: %v\n%s", err, progress.String())
			}
			for p, want := range tc.want {
				data, err := os.ReadFile(filepath.Join(img.Root, p))
				if err != nil || string(data) != want.body {
					t.Errorf("%s = %q, %v; want %q", p, data, err, want.body)
					continue
				}
				fi, _ := os.Lstat(filepath.Join(img.Root, p))
				if uid := int(fi.Sys().(*syscall.Stat_t).Uid); uid != want.uid {
					t.Errorf("%s owned by %d, want %d", p, uid, want.uid)
				}
			}
			for _, kv := range tc.env {
				if !slices.Contains(img.Env, kv) {
					t.Errorf("image Env %q lacks %q", img.Env, kv)
				}
			}
			for _, kv := range img.Env {
				if strings.HasPrefix(kv, "V=") || strings.HasPrefix(kv, "SOURCE_DATE_EPOCH=") {
					t.Errorf("image Env has the build-only %q", kv)
				}
			}
			if img.WorkingDir != tc.workdir || !slices.Equal(img.Entrypoint, tc.entrypoint) || !slices.Equal(img.Cmd, tc.cmd) || img.User != tc.user {
				t.Errorf("config = workdir %q entrypoint %q cmd %q user %q; want %q %q %q %q",
					img.WorkingDir, img.Entrypoint, img.Cmd, img.User, tc.workdir, tc.entrypoint, tc.cmd, tc.user)
			}
			if !strings.HasPrefix(img.Source, "dockerfile:") {
				t.Errorf("Source = %q", img.Source)
			}
			if len(runner.steps) != len(tc.runs) {
				t.Fatalf("%d RUN steps, want %d", len(runner.steps), len(tc.runs))
			}
			for i, want := range tc.runs {
				got := runner.steps[i]
				if !slices.Equal(got.Argv, want.Argv) || got.Dir != want.Dir || got.UID != want.UID {
					t.Errorf("run %d = argv %q dir %q uid %d; want %q %q %d", i, got.Argv, got.Dir, got.UID, want.Argv, want.Dir, want.UID)
				}
				for _, kv := range want.Env {
					if !slices.Contains(got.Env, kv) {
						t.Errorf("run %d env %q lacks %q", i, got.Env, kv)
					}
				}
				if filepath.Dir(filepath.Dir(runner.roots[i])) != filepath.Join(store.Dir, "app") {
					t.Errorf("run %d root %s is not a build directory in the store", i, runner.roots[i])
				}
			}
			if got, err := store.Lookup("app"); err != nil || got.Digest != img.Digest {
				t.Errorf("Lookup(app) = %v, %v; want the new build current", got, err)
			}
		})
	}
}

func TestBuildProgress(t *testing.T) {
	store := newBaseStore(t)
	ctxDir := contextDir(t, map[string]string{"f": "x"})
	for _, terminal := range []bool{false, true} {
		t.Run(fmt.Sprintf("terminal=%v", terminal), func(t *testing.T) {
			var progress bytes.Buffer
			plan := planFor(t, ctxDir, "FROM rootimg\nLABEL a=b\nCOPY f /f\nRUN print hello from the step\n")
			img, err := Build(context.Background(), store, "app", plan, Options{Runner: &fakeRunner{}, Progress: &progress, Terminal: terminal})
			if err != nil {
				t.Fatal(err)
			}
			out := progress.String()
			line := "step 2| hello from the step\n"
			if terminal {
				line = "    │ hello from the step\n"
			}
			for _, want := range []string{"note: Dockerfile:2: LABEL ignored", "s] step 1/2 (Dockerfile:3): COPY f /f\n", "s] step 2/2 (Dockerfile:4): RUN print hello from the step\n", line, "built app " + img.Digest} {
				if !strings.Contains(out, want) {
					t.Errorf("progress lacks %q:\n%s", want, out)
				}
			}
		})
	}
}

func TestBuildReproducible(t *testing.T) {
	store := newBaseStore(t)
	ctxDir := contextDir(t, map[string]string{"a.py": "print(1)", "d/b": "b"})
	df := "FROM rootimg\nCOPY . /app/\nRUN write /app/gen.txt generated; write /root/.cache/pip/x junk\nENV X=1\n"
	var digests []string
	for i := 0; i < 2; i++ {
		img, err := Build(context.Background(), store, "app", planFor(t, ctxDir, df), Options{Runner: &fakeRunner{}})
		if err != nil {
			t.Fatal(err)
		}
		digests = append(digests, img.Digest)
		if _, err := os.Lstat(filepath.Join(img.Root, "root/.cache")); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("the pip cache survived the build: %v", err)
		}
	}
	if digests[0] != digests[1] {
		t.Errorf("two builds of the same file: %s and %s", digests[0], digests[1])
	}
	assertNoBuildDirs(t, store, "app")
}

// TestBuildCopyThroughPlantedSymlink: a RUN step is untrusted; a link it
// plants must never make a later COPY write outside the tree.
func TestBuildCopyThroughPlantedSymlink(t *testing.T) {
	store := newBaseStore(t)
	outside := t.TempDir()
	victim := filepath.Join(outside, "victim")
	if err := os.WriteFile(victim, []byte("host"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctxDir := contextDir(t, map[string]string{"f": "evil", "victim": "evil"})
	rel, _ := filepath.Rel("/app", outside) // a relative link climbing out
	tests := []struct {
		name, dockerfile string
		wantErr          bool
	}{
		{name: "absolute dir link", dockerfile: fmt.Sprintf("FROM rootimg\nRUN link app %s\nCOPY f /app/f\n", outside), wantErr: true},
		{name: "relative dir link climbing out", dockerfile: fmt.Sprintf("FROM rootimg\nRUN link app ../../../../../../../..%s\nCOPY f /app/f\n", outside), wantErr: true},
		{name: "dotdot dir link", dockerfile: fmt.Sprintf("FROM rootimg\nRUN write /x/y 1; link x/app %s\nCOPY f /x/app/f\n", rel), wantErr: true},
		{name: "file link is replaced, not written through", dockerfile: fmt.Sprintf("FROM rootimg\nRUN write /app/keep 1; link app/victim %s\nCOPY victim /app/victim\n", victim)},
		{name: "workdir through link", dockerfile: fmt.Sprintf("FROM rootimg\nRUN link app %s\nWORKDIR /app/sub\n", outside), wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			img, err := Build(context.Background(), store, "app", planFor(t, ctxDir, tc.dockerfile), Options{Runner: &fakeRunner{}})
			t.Logf("Build: %v", err)
			if tc.wantErr && err == nil {
				t.Errorf("Build through a planted link succeeded")
			}
			if !tc.wantErr {
				if err != nil {
					t.Fatal(err)
				}
				fi, err := os.Lstat(filepath.Join(img.Root, "app/victim"))
				if err != nil || !fi.Mode().IsRegular() {
					t.Errorf("app/victim in the image = %v, %v; want the copied file", fi, err)
				}
			}
			if data, _ := os.ReadFile(victim); string(data) != "host" {
				t.Errorf("host file changed to %q", data)
			}
			if ents, _ := os.ReadDir(outside); len(ents) != 1 {
				t.Errorf("files appeared outside the tree: %v", ents)
			}
			assertNoBuildDirs(t, store, "app")
		})
	}
}

// TestBuildUnknownBaseImageFile: an image file's unknown base is named
// by its line and key, as a Dockerfile's FROM is, and the store's images
// and the built-in ones are each listed once.
func TestBuildUnknownBaseImageFile(t *testing.T) {
	store := newBaseStore(t)
	plan, err := ReadImageFile(buildDirWith(t, "version: 1\n\nbase:\n  image: nosuch\n", nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = Build(context.Background(), store, "app", plan, Options{Runner: &fakeRunner{}})
	want := `image.yaml:4: base.image: nosuch: no image named "nosuch"; stored images: rootimg; built-in images you can build: base, code-interpreter, node, python (`
	if err == nil || !strings.Contains(err.Error(), want) || !errors.Is(err, image.ErrUnknown) {
		t.Fatalf("Build = %v, want %q wrapping image.ErrUnknown", err, want)
	}
	if n := strings.Count(err.Error(), "python"); n != 1 {
		t.Errorf("python is named %d times in %q, want once", n, err)
	}
}

func TestBuildContextEscape(t *testing.T) {
	store := newBaseStore(t)
	secret := filepath.Join(t.TempDir(), "secret")
	os.WriteFile(secret, []byte("s"), 0o600)
	ctxDir := contextDir(t, map[string]string{"ok": "1"})
	if err := os.Symlink(secret, filepath.Join(ctxDir, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../../../../../../..", filepath.Join(ctxDir, "up")); err != nil {
		t.Fatal(err)
	}
	for _, df := range []string{"FROM rootimg\nCOPY link /x\n", "FROM rootimg\nCOPY up/etc/passwd /x\n"} {
		t.Run(df, func(t *testing.T) {
			_, err := Build(context.Background(), store, "app", planFor(t, ctxDir, df), Options{Runner: &fakeRunner{}})
			if err == nil || !strings.Contains(err.Error(), "Dockerfile:2: COPY") {
				t.Errorf("Build = %v, want a COPY error naming the line", err)
			}
		})
	}
}

func TestBuildFailureLeavesStore(t *testing.T) {
	store := newBaseStore(t)
	ctxDir := contextDir(t, map[string]string{"f": "x"})
	first, err := Build(context.Background(), store, "app", planFor(t, ctxDir, "FROM rootimg\nCOPY f /f\n"), Options{Runner: &fakeRunner{}})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, dockerfile, want string
		cancel                 bool
		runner                 StepRunner
	}{
		{name: "run fails", dockerfile: "FROM rootimg\nCOPY f /g\nRUN print compiling; print boom; exit 3\n",
			want: "Dockerfile:3: RUN print compiling; print boom; exit 3 exited with status 3; its last output:\ncompiling\nboom"},
		{name: "cancelled", dockerfile: "FROM rootimg\nRUN block\n", cancel: true, want: "context canceled"},
		{name: "copy to tmp", dockerfile: "FROM rootimg\nCOPY f /tmp/f\n", want: "Dockerfile:2: COPY to /tmp/f: /tmp is mounted fresh for every run"},
		{name: "workdir workspace", dockerfile: "FROM rootimg\nWORKDIR /workspace/x\n", want: "Dockerfile:2: WORKDIR /workspace/x: /workspace is mounted fresh"},
		{name: "copy missing source", dockerfile: "FROM rootimg\nCOPY nope /x\n", want: "Dockerfile:2: COPY: source nope"},
		{name: "glob matches nothing", dockerfile: "FROM rootimg\nCOPY *.none /x/\n", want: "no file in the build context"},
		{name: "unknown base", dockerfile: "# a comment\nFROM nosuch\n", want: `Dockerfile:2: FROM nosuch: no image named "nosuch"; stored images: app, rootimg; built-in images you can build: base, code-interpreter, node, python (or add nosuch with`},
		{name: "run without runner", dockerfile: "FROM rootimg\nRUN true\n", runner: StepRunner(nil), want: "Options.Runner is nil"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			runner := tc.runner
			if runner == nil && tc.name != "run without runner" {
				runner = &fakeRunner{}
			}
			if tc.cancel {
				go func() {
					r := runner.(*fakeRunner)
					for {
						r.mu.Lock()
						n := len(r.steps)
						r.mu.Unlock()
						if n > 0 {
							cancel()
							return
						}
					}
				}()
			}
			_, err := Build(ctx, store, "app", planFor(t, ctxDir, tc.dockerfile), Options{Runner: runner})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Build = %v, want %q", err, tc.want)
			}
			// The CLI's exit status branches on these: a step that ran
			// and failed, an image the store does not have.
			var stepErr *StepError
			if got, want := errors.As(err, &stepErr), tc.name == "run fails"; got != want {
				t.Errorf("errors.As(%v, *StepError) = %v, want %v", err, got, want)
			} else if got && (stepErr.Code != 3 || stepErr.Where != "Dockerfile:3") {
				t.Errorf("StepError = %+v, want Code 3 at Dockerfile:3", stepErr)
			}
			if got, want := errors.Is(err, image.ErrUnknown), tc.name == "unknown base"; got != want {
				t.Errorf("errors.Is(%v, image.ErrUnknown) = %v, want %v", err, got, want)
			}
			assertNoBuildDirs(t, store, "app")
			cur, err := store.Lookup("app")
			if err != nil || cur.Digest != first.Digest {
				t.Errorf("current after a failed build = %v, %v; want %s", cur, err, first.Digest)
			}
		})
	}
	t.Run("new name leaves no trace", func(t *testing.T) {
		_, err := Build(context.Background(), store, "fresh", planFor(t, ctxDir, "FROM rootimg\nRUN exit 1\n"), Options{Runner: &fakeRunner{}})
		if err == nil {
			t.Fatal("Build succeeded")
		}
		if _, err := os.Lstat(filepath.Join(store.Dir, "fresh")); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("a failed build of a new name left its directory: %v", err)
		}
	})
	t.Run("an image file's step is named as the file says it", func(t *testing.T) {
		plan := &Plan{File: filepath.Join(ctxDir, "jq.yaml"), Context: ctxDir, Base: Base{Image: "rootimg"}, Steps: []Step{
			{Op: OpRun, Line: 3, Text: "apt: jq", Argv: []string{"/bin/sh", "-c", "print E: Unable to locate package jq; exit 100"}},
		}}
		_, err := Build(context.Background(), store, "app", plan, Options{Runner: &fakeRunner{}})
		want := "jq.yaml:3: apt: jq: RUN print E: Unable to locate package jq; exit 100 exited with status 100; its last output:\nE: Unable to locate package jq"
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("Build = %v, want %q", err, want)
		}
		assertNoBuildDirs(t, store, "app")
	})
	t.Run("built-in name refused", func(t *testing.T) {
		_, err := Build(context.Background(), store, "python", planFor(t, ctxDir, "FROM rootimg\n"), Options{})
		if !errors.Is(err, image.ErrBadImage) || !strings.Contains(err.Error(), "built-in image definition") {
			t.Errorf("Build(python) = %v", err)
		}
	})
}

func assertNoBuildDirs(t *testing.T, store *image.Store, name string) {
	t.Helper()
	ents, _ := os.ReadDir(filepath.Join(store.Dir, name))
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".build-") {
			t.Errorf("build directory %s left in the store", e.Name())
		}
	}
}

// TestBuildLockDebHashes: the .debs an apt step left in the tree's
// cache are hashed into the lockfile (only the installed version of an
// installed package; a symlink a step planted is not followed) and do not
// reach the image.
func TestBuildLockDebHashes(t *testing.T) {
	if _, err := exec.LookPath("dpkg-query"); err != nil {
		t.Skip("needs dpkg-query: apt-get install dpkg")
	}
	store := newBaseStore(t)
	ctxDir := contextDir(t, map[string]string{})
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("host file"), 0o600); err != nil {
		t.Fatal(err)
	}
	status := `Package: xx\nStatus: install ok installed\nArchitecture: all\nMaintainer: m\nDescription: d\nVersion: 1:1.0\n\n` +
		`Package: yy\nStatus: install ok installed\nArchitecture: all\nMaintainer: m\nDescription: d\nVersion: 2\n`
	df := "FROM rootimg\n" +
		"RUN writenl /var/lib/dpkg/status " + status + "\n" +
		"RUN write /var/cache/apt/archives/xx_1%3a1.0_all.deb the x deb; write /var/cache/apt/archives/xx_0.9_all.deb old x; " +
		"write /var/cache/apt/archives/notes.deb not apt's; link /var/cache/apt/archives/yy_2_all.deb " + secret + "\n"
	lockPath := LockPath(filepath.Join(ctxDir, "Dockerfile"))
	img, err := Build(context.Background(), store, "app", planFor(t, ctxDir, df), Options{Runner: &fakeRunner{}, LockFile: lockPath})
	if err != nil {
		t.Fatal(err)
	}
	lock, err := ReadLock(lockPath)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte("the x deb"))
	want := map[string]string{"xx": "sha256:" + hex.EncodeToString(sum[:])}
	if !reflect.DeepEqual(lock.DebianSHA256, want) || lock.Debian["xx"] != "1:1.0" || lock.Debian["yy"] != "2" {
		t.Errorf("lock debian %v, sha256 %v; want sha256 %v", lock.Debian, lock.DebianSHA256, want)
	}
	if ents, err := os.ReadDir(filepath.Join(img.Root, "var/cache")); err != nil || len(ents) != 0 {
		t.Errorf("/var/cache of the image holds %v (err %v), want it empty", ents, err)
	}
}

// TestBuildLock: a build writes its lockfile; --locked passes while the
// build matches it and fails, publishing nothing, when it does not; the
// lockfile beside the build file is never copied into the image.
func TestBuildLock(t *testing.T) {
	store := newBaseStore(t)
	ctxDir := contextDir(t, map[string]string{"a.py": "1"})
	df := "FROM rootimg\nCOPY . /app/\nRUN write /app/gen x\n"
	lockPath := LockPath(filepath.Join(ctxDir, "Dockerfile"))
	build := func(locked *Lock) (*image.Image, error) {
		return Build(context.Background(), store, "app", planFor(t, ctxDir, df), Options{Runner: &fakeRunner{}, LockFile: lockPath, Locked: locked})
	}
	first, err := build(nil)
	if err != nil {
		t.Fatal(err)
	}
	lock, err := ReadLock(lockPath)
	if err != nil {
		t.Fatal(err)
	}
	if lock.Digest != first.Digest || lock.Base.Image != "rootimg" || lock.Base.ImageDigest == "" || lock.FileSHA256 == "" {
		t.Errorf("lock = %+v, want the build's digest, base and file hash", lock)
	}
	// The lockfile now sits in the context that COPY . copies.
	second, err := build(nil)
	if err != nil {
		t.Fatal(err)
	}
	if second.Digest != first.Digest {
		t.Errorf("the second build (with the lockfile in the context) got %s, the first %s", second.Digest, first.Digest)
	}
	if _, err := os.Lstat(filepath.Join(second.Root, "app", "Dockerfile.lock")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the lockfile was copied into the image: %v", err)
	}
	tests := []struct {
		name   string
		edit   func(l *Lock)
		wantOK bool
		want   string
	}{
		{name: "matching", edit: func(*Lock) {}, wantOK: true},
		{name: "digest differs", edit: func(l *Lock) { l.Digest = "sha256:" + strings.Repeat("0", 64) }, want: "digest: sha256:000"},
		{name: "base digest differs", edit: func(l *Lock) { l.Base.ImageDigest = "sha256:" + strings.Repeat("1", 64) }, want: "base image digest"},
		{name: "file differs", edit: func(l *Lock) { l.FileSHA256 = "00" }, want: "build file sha256: 00 ->"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l := *lock
			tc.edit(&l)
			img, err := build(&l)
			if tc.wantOK {
				if err != nil || img.Digest != first.Digest {
					t.Fatalf("Build --locked = %v, %v", img, err)
				}
				return
			}
			var diff *LockDiffError
			if !errors.As(err, &diff) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Build --locked = %v, want a LockDiffError naming %q", err, tc.want)
			}
			assertNoBuildDirs(t, store, "app")
			if cur, _ := store.Lookup("app"); cur == nil || cur.Digest != first.Digest {
				t.Errorf("current after a refused locked build = %v", cur)
			}
			if again, _ := ReadLock(lockPath); again == nil || again.Digest != lock.Digest {
				t.Errorf("a locked build rewrote the lockfile")
			}
		})
	}
}

// runnerFunc is a StepRunner from a function.
type runnerFunc func(ctx context.Context, root string, s RunStep) (int, error)

func (f runnerFunc) RunStep(ctx context.Context, root string, s RunStep) (int, error) {
	return f(ctx, root, s)
}

// TestBuildNetworkSettings: the operator's CA bundle is in the tree, and
// named by the CA variables, only while a RUN step with network runs;
// granted addresses go only to such steps; neither reaches the image.
func TestBuildNetworkSettings(t *testing.T) {
	store := newBaseStore(t)
	ctxDir := contextDir(t, nil)
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, []byte("-----BEGIN CERTIFICATE-----\nx\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	plan := planFor(t, ctxDir, "FROM rootimg\nRUN offline\nRUN online\n")
	plan.Steps[1].Hosts = []string{"registry.npmjs.org"}
	type seen struct {
		ca    string // the CA file's content in the tree, "" if absent
		env   map[string]string
		addrs []string
	}
	var steps []seen
	runner := runnerFunc(func(ctx context.Context, root string, s RunStep) (int, error) {
		b, _ := os.ReadFile(filepath.Join(root, BuildCAPath))
		steps = append(steps, seen{ca: string(b), env: envMap(s.Env), addrs: s.AllowAddresses})
		// A step may replace the file with a link out of the tree: the
		// builder's removal must not follow it.
		os.Remove(filepath.Join(root, BuildCAPath))
		return 0, os.Symlink(caFile, filepath.Join(root, BuildCAPath))
	})
	img, err := Build(context.Background(), store, "net", plan, Options{
		Runner: runner, CAFile: caFile, AllowAddresses: []string{"203.0.113.80"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(steps) != 2 {
		t.Fatalf("%d RUN steps ran, want 2", len(steps))
	}
	tests := []struct {
		name      string
		got       seen
		wantCA    bool
		wantAddrs int
	}{
		{"offline step", steps[0], false, 0},
		{"online step", steps[1], true, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if (tc.got.ca != "") != tc.wantCA {
				t.Errorf("CA file in the tree: %q, want present=%v", tc.got.ca, tc.wantCA)
			}
			for _, k := range caEnv {
				if v, ok := tc.got.env[k]; ok != tc.wantCA || (ok && v != BuildCAPath) {
					t.Errorf("%s=%q (set %v), want set=%v to %s", k, v, ok, tc.wantCA, BuildCAPath)
				}
			}
			if len(tc.got.addrs) != tc.wantAddrs {
				t.Errorf("AllowAddresses %q, want %d", tc.got.addrs, tc.wantAddrs)
			}
		})
	}
	if _, err := os.Lstat(filepath.Join(img.Root, BuildCAPath)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the build CA reached the image: %v", err)
	}
	if b, err := os.ReadFile(caFile); err != nil || !strings.HasPrefix(string(b), "-----BEGIN") {
		t.Errorf("the operator's CA file changed: %q %v", b, err)
	}
}

// TestBuildNeeds: an image file's install step on a base that lacks its
// tool (apt-get, npm: Moat's built-in images have no apt) fails before it
// runs, naming the file, the line, the program and the fix, and leaves the
// store as it was; a tool found on the PATH, through the tree's own
// relative links (/bin -> usr/bin), lets the step run.
func TestBuildNeeds(t *testing.T) {
	store := newBaseStore(t)
	tests := []struct {
		name     string
		yaml     string
		files    map[string]string
		want     []string
		runSteps int
	}{
		{name: "apt on an image without apt-get",
			yaml: "version: 1\nbase: {image: rootimg}\napt: [curl]\n",
			want: []string{"image.yaml:3: image refused: apt: curl: the base image rootimg has no apt-get on its PATH", "base: {debian: bookworm}"}},
		{name: "npm on an image without npm",
			yaml:  "version: 1\nbase: {image: rootimg}\nnpm: {lockfile: package-lock.json, dir: /opt/app}\n",
			files: map[string]string{"package.json": fixture(t, "npm/package.json"), "package-lock.json": fixture(t, "npm/package-lock.json")},
			want:  []string{"image.yaml:3: image refused: npm: ci in /opt/app: the base image rootimg has no npm on its PATH", "(node, base)"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			files := map[string]string{"image.yaml": tc.yaml}
			for k, v := range tc.files {
				files[k] = v
			}
			dir := contextDir(t, files)
			plan, err := ReadImageFile(filepath.Join(dir, "image.yaml"), nil)
			if err != nil {
				t.Fatal(err)
			}
			runner := &fakeRunner{}
			_, err = Build(context.Background(), store, "app", plan, Options{Runner: runner})
			if !errors.Is(err, image.ErrBadImage) {
				t.Errorf("Build = %v, want image.ErrBadImage (the CLI's exit 2)", err)
			}
			for _, w := range tc.want {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("Build = %v, want an error containing %q", err, w)
				}
			}
			if len(runner.steps) != 0 {
				t.Errorf("%d steps ran; the missing tool must stop the build before its step", len(runner.steps))
			}
			assertNoBuildDirs(t, store, "app")
			if _, err := store.Lookup("app"); err == nil {
				t.Errorf("a refused build stored app")
			}
		})
	}
	t.Run("found through the tree's /bin link", func(t *testing.T) {
		plan := &Plan{Base: Base{Image: "rootimg"}, Steps: []Step{
			{Op: OpEnv, Line: 2, Text: "ENV PATH=/bin", Key: "PATH", Value: "/bin"},
			{Op: OpRun, Line: 3, Text: "tool step", Argv: []string{"/bin/sh", "-c", "print ok"}, Needs: []string{"tool"}, NeedsFix: "unused"},
		}}
		runner := &fakeRunner{}
		if _, err := Build(context.Background(), store, "found", plan, Options{Runner: runner}); err != nil {
			t.Fatalf("Build: %v", err)
		}
		if len(runner.steps) != 1 {
			t.Errorf("%d steps ran, want 1", len(runner.steps))
		}
	})
}
