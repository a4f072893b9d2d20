package service_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/image"
	"github.com/moat-sandbox/moat/internal/testbin"
	"github.com/moat-sandbox/moat/service"
	"github.com/moat-sandbox/moat/service/servicetest"
	// The native tier registers itself with the engine.
	_ "github.com/moat-sandbox/moat/tier/native"
)

// nativeBin is the moat binary the native tier re-executes as init, built
// once for the package's kernel tests and removed by TestMain.
var (
	nativeCleanup func()
	nativeBin     = sync.OnceValues(func() (string, error) {
		bin, cleanup, err := testbin.Build()
		nativeCleanup = cleanup
		return bin, err
	})
)

func TestMain(m *testing.M) {
	code := m.Run()
	if nativeCleanup != nil {
		nativeCleanup()
	}
	os.Exit(code)
}

// newNativeService is a Service over a real engine (the native tier, the
// python image), shut down when the test ends.
func newNativeService(t testing.TB) *service.Service {
	t.Helper()
	return nativeService(t, "python", false)
}

// imageBuilds serialises this package's builds (the store's flock
// serialises them across packages); imageBuilt remembers what was built.
var (
	imageBuilds sync.Mutex
	imageBuilt  = map[string]bool{}
)

// nativeService is newNativeService with sandboxes of image. With build,
// the image is built into the engine's store when it is missing or was
// built from an older definition (once per machine and definition, as
// scripts/setup builds python); without, the test skips.
func nativeService(t testing.TB, img string, build bool) *service.Service {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the native tier creates cgroups and maps user namespaces")
	}
	bin, err := nativeBin()
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.New(engine.Options{Exe: bin, NoAutoBuild: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	if _, err := e.Images().Lookup(img); err != nil {
		if !build || !errors.Is(err, image.ErrNotBuilt) {
			t.Skipf("the %s image is not built (%v): run moat image build %s", img, err, img)
		}
		if testing.Short() {
			t.Skipf("skipping the %s image build (1-2 minutes, needs the Debian mirror) in -short mode", img)
		}
		if _, err := exec.LookPath("mmdebstrap"); err != nil {
			t.Skip("needs mmdebstrap to build the image: apt-get install mmdebstrap")
		}
		imageBuilds.Lock()
		defer imageBuilds.Unlock()
		if !imageBuilt[img] {
			start := time.Now()
			built, err := e.BuildImage(context.Background(), img, image.BuildOptions{})
			if err != nil {
				t.Fatalf("build image %s: %v", img, err)
			}
			imageBuilt[img] = true
			t.Logf("built image %s in %s: %.0f MB, %d packages", img, time.Since(start).Round(time.Second), float64(built.Size)/1e6, len(built.Packages))
		}
	}
	s, err := service.New(service.Config{Backend: service.NewEngineBackend(e), Auditor: servicetest.NewAuditor(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	})
	return s
}
