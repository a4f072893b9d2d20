package service_test

import (
	"context"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/engine"
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
	if _, err := e.Images().Lookup("python"); err != nil {
		t.Skipf("the python image is not built (%v): run moat image build python", err)
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
