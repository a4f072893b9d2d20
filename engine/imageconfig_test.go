package engine

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/image"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/result"
	"github.com/moat-sandbox/moat/tier"
)

// recordTier prepares sandboxes that run nothing and remember the
// command the engine gave them: what the engine decided from the image.
type recordTier struct {
	capsTier
	got *tier.Command
}

type recordSandbox struct {
	t  *recordTier
	ws string
}

func (t *recordTier) Name() string { return "record" }

func (t *recordTier) Prepare(_ context.Context, spec *tier.Spec) (tier.Sandbox, error) {
	ws := filepath.Join(spec.StateDir, "workspace")
	if err := os.Mkdir(ws, 0o755); err != nil {
		return nil, err
	}
	return &recordSandbox{t: t, ws: ws}, nil
}

func (s *recordSandbox) Workspace() tier.Workspace {
	return tier.Workspace{Dir: s.ws, UID: os.Geteuid(), GID: os.Getegid()}
}

func (s *recordSandbox) Exec(_ context.Context, c *tier.Command) (*tier.Outcome, error) {
	s.t.got = c
	return &tier.Outcome{Termination: result.Exited}, nil
}

func (s *recordSandbox) Destroy() error { return nil }

// storeImage stores an image named name whose root has the directories
// dirs, with the metadata meta (name and digest are filled in), as an
// import leaves it: rootfs, image.json, current.
func storeImage(t *testing.T, s *image.Store, name string, dirs []string, meta map[string]any) {
	t.Helper()
	rootfs := filepath.Join(t.TempDir(), "rootfs")
	for _, d := range append([]string{"bin"}, dirs...) {
		if err := os.MkdirAll(filepath.Join(rootfs, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(rootfs, "bin", "file"), []byte("x"), 0o755); err != nil {
		t.Fatal(err)
	}
	digest, _, err := image.TreeDigest(rootfs)
	if err != nil {
		t.Fatal(err)
	}
	hexDigest := strings.TrimPrefix(digest, "sha256:")
	dir := filepath.Join(s.Dir, name, hexDigest)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(rootfs, filepath.Join(dir, "rootfs")); err != nil {
		t.Fatal(err)
	}
	meta["name"], meta["digest"] = name, digest
	b, err := json.Marshal(meta)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "image.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(hexDigest, filepath.Join(s.Dir, name, "current")); err != nil {
		t.Fatal(err)
	}
}

// TestRunHonoursImageConfig: the engine runs an image's Entrypoint+Cmd
// when the request has no command, the request's command alone when it
// has one, in the config's WorkingDir when that exists, and names the
// import's source in the result.
func TestRunHonoursImageConfig(t *testing.T) {
	rt := &recordTier{}
	e, err := New(Options{Home: t.TempDir(), NoAutoBuild: true, Tiers: map[string]tier.Tier{"record": rt}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	s := e.Images()
	storeImage(t, s, "both", []string{"app"}, map[string]any{
		"entrypoint": []string{"/bin/tini", "--"}, "cmd": []string{"node", "server.js"}, "working_dir": "/app",
		"source": "oci-archive:app.tar", "source_digest": "sha256:" + strings.Repeat("b", 64)})
	storeImage(t, s, "cmdonly", nil, map[string]any{"cmd": []string{"python3", "-V"}})
	storeImage(t, s, "entryonly", nil, map[string]any{"entrypoint": []string{"/bin/app"}})
	storeImage(t, s, "bare", nil, map[string]any{})
	storeImage(t, s, "wsdir", nil, map[string]any{"cmd": []string{"ls"}, "working_dir": "/workspace"})
	storeImage(t, s, "missingdir", nil, map[string]any{"cmd": []string{"ls"}, "working_dir": "/srv/app"})
	storeImage(t, s, "wsmissing", nil, map[string]any{"cmd": []string{"ls"}, "working_dir": "/workspace/src"})
	storeImage(t, s, "relative", nil, map[string]any{"cmd": []string{"ls"}, "working_dir": "app"})
	storeImage(t, s, "filedir", nil, map[string]any{"cmd": []string{"ls"}, "working_dir": "/bin/file"})
	storeImage(t, s, "emptyentry", nil, map[string]any{"entrypoint": []string{""}, "cmd": []string{"x"}})

	tests := []struct {
		name     string
		image    string
		argv     []string
		wantArgv []string
		wantDir  string
		wantErr  string // substring of a usage error; "" for success
	}{
		{name: "no command: entrypoint then cmd", image: "both", wantArgv: []string{"/bin/tini", "--", "node", "server.js"}, wantDir: "/app"},
		{name: "a command replaces entrypoint and cmd", image: "both", argv: []string{"sh", "-c", "true"}, wantArgv: []string{"sh", "-c", "true"}, wantDir: "/app"},
		{name: "cmd only", image: "cmdonly", wantArgv: []string{"python3", "-V"}, wantDir: "/workspace"},
		{name: "entrypoint only", image: "entryonly", wantArgv: []string{"/bin/app"}, wantDir: "/workspace"},
		{name: "working dir /workspace", image: "wsdir", wantArgv: []string{"ls"}, wantDir: "/workspace"},
		{name: "built image with a command", image: "bare", argv: []string{"true"}, wantArgv: []string{"true"}, wantDir: "/workspace"},
		{name: "neither command nor image config", image: "bare", wantErr: `image "bare" has no Entrypoint or Cmd to run instead: give a command`},
		{name: "image not stored and no command", image: "python", wantErr: "no command given"},
		{name: "entrypoint with an empty name", image: "emptyentry", wantErr: "starts with an empty name"},
		{name: "working dir missing from the image", image: "missingdir", wantErr: "WorkingDir /srv/app does not exist in the image"},
		{name: "working dir missing from the workspace", image: "wsmissing", wantErr: "WorkingDir /workspace/src does not exist in the workspace"},
		{name: "relative working dir", image: "relative", wantErr: `WorkingDir "app" is not an absolute path`},
		{name: "working dir is a file", image: "filedir", wantErr: "WorkingDir /bin/file is not a directory"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rt.got = nil
			m := manifest.Default()
			m.Tier, m.Image = "record", tc.image
			res, err := e.Run(context.Background(), &Request{Manifest: m, Argv: tc.argv})
			if tc.wantErr != "" {
				if !errors.Is(err, ErrUsage) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Run error %v, want a usage error containing %q", err, tc.wantErr)
				}
				if res != nil || rt.got != nil {
					t.Errorf("a refused run ran %+v", rt.got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if rt.got == nil {
				t.Fatal("the tier was given no command")
			}
			if !slices.Equal(rt.got.Argv, tc.wantArgv) || !slices.Equal(res.Command, tc.wantArgv) {
				t.Errorf("argv %q (result %q), want %q", rt.got.Argv, res.Command, tc.wantArgv)
			}
			if rt.got.Dir != tc.wantDir {
				t.Errorf("dir %q, want %q", rt.got.Dir, tc.wantDir)
			}
		})
	}
	t.Run("result names the source", func(t *testing.T) {
		m := manifest.Default()
		m.Tier, m.Image = "record", "both"
		res, err := e.Run(context.Background(), &Request{Manifest: m})
		if err != nil {
			t.Fatal(err)
		}
		if res.Image.Source != "oci-archive:app.tar" || res.Image.SourceDigest != "sha256:"+strings.Repeat("b", 64) || !strings.HasPrefix(res.Image.Digest, "sha256:") {
			t.Errorf("result image %+v, want the source and its digest beside Moat's", res.Image)
		}
	})
}

// TestSessionStartsInImageWorkingDir: a session's command with no dir
// starts where a run on the image would (the config's WorkingDir, else
// /workspace), checked by the same rule at each command; a dir given by
// the caller wins.
func TestSessionStartsInImageWorkingDir(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"app", "bin"} {
		if err := os.Mkdir(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name       string
		workingDir string
		wsDirs     []string // made in the workspace before the command
		dir        string   // the request's
		wantDir    string
		wantErr    string // substring of a usage error
	}{
		{name: "no WorkingDir", wantDir: "/workspace"},
		{name: "WorkingDir in the image", workingDir: "/app", wantDir: "/app"},
		{name: "WorkingDir made in the workspace", workingDir: "/workspace/src", wsDirs: []string{"src"}, wantDir: "/workspace/src"},
		{name: "the request's dir wins", workingDir: "/app", dir: "/tmp", wantDir: "/tmp"},
		{name: "WorkingDir missing from the workspace", workingDir: "/workspace/src", wantErr: "WorkingDir /workspace/src does not exist in the workspace"},
		{name: "WorkingDir missing from the image", workingDir: "/srv", wantErr: "WorkingDir /srv does not exist in the image"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := manifest.Default()
			p, _ := fakePrepared(t, m)
			p.img.Root, p.img.WorkingDir = root, tc.workingDir
			sb := p.sb.(*fakeSandbox)
			for _, d := range tc.wsDirs {
				if err := os.Mkdir(filepath.Join(sb.dir, d), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			s := &Session{p: p, m: m, info: SessionInfo{ID: p.id}}
			pr, err := s.Start(context.Background(), &ExecRequest{Argv: []string{"out:x"}, Dir: tc.dir})
			if tc.wantErr != "" {
				if !errors.Is(err, ErrUsage) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Start error %v, want a usage error containing %q", err, tc.wantErr)
				}
				if len(sb.cmds) != 0 {
					t.Errorf("a refused command was started: %+v", sb.cmds[0])
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			<-pr.Done()
			if len(sb.cmds) != 1 || sb.cmds[0].Dir != tc.wantDir {
				t.Fatalf("commands %+v, want one in %s", sb.cmds, tc.wantDir)
			}
		})
	}
}
