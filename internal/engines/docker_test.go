package engines_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/engines"
)

// dockerFixture is a private dockerd with runtimes moat and runc and the
// python image imported (docker import of its rootfs tar). Started once
// by the first test that needs it; TestMain's teardown stops it.
var dockerShared struct {
	once sync.Once
	d    *engines.Dockerd
	err  error
}

func getDockerd(t testing.TB, f *fixture) *engines.Dockerd {
	t.Helper()
	preconditions(t, "dockerd", engines.DockerClient)
	dockerShared.once.Do(func() {
		dir := filepath.Join(f.dir, "docker")
		if dockerShared.err = os.Mkdir(dir, 0o700); dockerShared.err != nil {
			return
		}
		// Docker puts a prestart hook (libnetwork-setkey: dockerd itself,
		// on the host) in every container's spec, --network none too; the
		// policy says explicitly that this engine's hooks are trusted.
		policy := filepath.Join(f.dir, "runtime-docker.yaml")
		if dockerShared.err = os.WriteFile(policy, []byte("hooks: true\nengine_state_dirs: ["+strconv.Quote(f.dir)+"]\n"), 0o644); dockerShared.err != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		d, err := engines.StartDockerd(ctx, engines.DockerdConfig{
			Dir:          dir,
			Runtimes:     []engines.Runtime{{Handler: "moat", Binary: f.moatRuntime}},
			CgroupParent: f.cgroupParent,
			Env:          []string{"MOAT_GUEST=" + f.guest, "MOAT_RUNTIME_POLICY=" + policy},
		})
		if err != nil {
			dockerShared.err = err
			return
		}
		f.dockerd = d
		dockerShared.d = d
		for _, im := range []struct{ layer, ref string }{{f.pyLayer, pythonImage}, {f.busyboxLayer, busyboxImage}} {
			if _, dockerShared.err = d.Docker(ctx, nil, "import", im.layer, im.ref); dockerShared.err != nil {
				return
			}
		}
	})
	if dockerShared.err != nil {
		t.Fatalf("setting up the private dockerd: %v", dockerShared.err)
	}
	return dockerShared.d
}

// TestDocker runs workloads with docker run --runtime, as a Docker host
// configured with --add-runtime moat=… would: output, exit code, exec
// into a running container, and a refusal that reaches the docker
// client. runc (Docker's default) runs the same table.
func TestDocker(t *testing.T) {
	f := getFixture(t)
	d := getDockerd(t, f)
	for _, runtime := range []string{"runc", "moat"} {
		t.Run(runtime, func(t *testing.T) {
			f.needMoat(t, runtime)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			base := []string{"run", "--rm", "--runtime", runtime, "--network", "none"}
			runs := []struct {
				name     string
				argv     []string
				wantOut  string
				wantExit int
			}{
				{"python", []string{"python3", "-c", "print('six times seven is', 6*7)"}, "six times seven is 42", 0},
				{"exit code", []string{"sh", "-c", "echo leaving; exit 5"}, "leaving", 5},
			}
			for _, r := range runs {
				// python only where it is needed: the vfs driver copies
				// the image per container.
				image := busyboxImage
				if r.argv[0] == "python3" {
					image = pythonImage
				}
				out, err := d.Docker(ctx, nil, append(append(append([]string{}, base...), image), r.argv...)...)
				code := 0
				if ce, ok := err.(*engines.CmdError); ok {
					code = ce.ExitCode()
				} else if err != nil {
					t.Fatalf("%s: %v", r.name, err)
				}
				if code != r.wantExit || !strings.Contains(out, r.wantOut) {
					t.Errorf("%s: docker run: exit %d output %q (%v), want exit %d and %q", r.name, code, out, err, r.wantExit, r.wantOut)
				}
			}

			id := "sleeper-" + runtime
			defer d.Docker(context.Background(), nil, "rm", "-f", id)
			if _, err := d.Docker(ctx, nil, "run", "-d", "--name", id, "--runtime", runtime, "--network", "none", busyboxImage, "sleep", "120"); err != nil {
				t.Fatalf("docker run -d: %v", err)
			}
			if out, err := d.Docker(ctx, nil, "exec", id, "sh", "-c", "echo $((6*7))"); err != nil || strings.TrimSpace(out) != "42" {
				t.Errorf("docker exec: %q, %v; want 42", out, err)
			}
			if _, err := d.Docker(ctx, nil, "rm", "-f", id); err != nil {
				t.Errorf("docker rm -f: %v", err)
			}

			// Moat refuses these and says why; runc runs them, which
			// proves the refusal is Moat's. Except --privileged under
			// runc where the test host is itself a container without
			// every capability: runc then fails with "unable to apply
			// caps", so only moat's message is checked there.
			refusals := []struct {
				flags       []string
				want        string
				runcMustRun bool
			}{
				{[]string{"--privileged"}, "privileged", false},
				{[]string{"--cap-add", "SYS_ADMIN"}, "SYS_ADMIN", true},
			}
			for _, r := range refusals {
				out, err := d.Docker(ctx, nil, append(append(append([]string{}, base...), r.flags...), busyboxImage, "true")...)
				switch {
				case runtime == "runc" && r.runcMustRun && err != nil:
					t.Errorf("runc refused %v too, so the case proves nothing: %v", r.flags, err)
				case runtime == "moat" && err == nil:
					t.Errorf("moat ran a container with %v: %q", r.flags, out)
				case runtime == "moat" && !strings.Contains(strings.ToLower(err.Error()), strings.ToLower(r.want)):
					t.Errorf("moat's refusal of %v does not name %s: %v", r.flags, r.want, err)
				}
			}
			if out, err := d.Docker(ctx, nil, "ps", "-aq"); err != nil || strings.TrimSpace(out) != "" {
				t.Errorf("containers left after --rm and rm -f: %q, %v", out, err)
			}
		})
	}
}
