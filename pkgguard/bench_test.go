package pkgguard

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// BenchmarkGuardedInstall: pip installs 20 allowed wheels from a local
// index through the guard (page filtering, spooling, hash verification)
// and directly from the same index, in the same run; the ratio is what
// the guard costs an install.
//
//	CGO_ENABLED=0 go test -run '^$' -bench GuardedInstall -benchtime 3x ./pkgguard/
func BenchmarkGuardedInstall(b *testing.B) {
	py, err := exec.LookPath("python3")
	if err != nil || exec.Command(py, "-m", "pip", "--version").Run() != nil {
		b.Skip("needs python3 with pip on the host: the benchmark drives the real client")
	}
	u := newUpstream(b)
	var allow []Requirement
	var pkgs []string
	for i := range 20 {
		name := fmt.Sprintf("moatbench%02d", i)
		u.addWheel(b, name, "1.0")
		allow = append(allow, mustReq(b, PyPI, name+"==1.0"))
		pkgs = append(pkgs, name)
	}
	srv, _ := guardFor(b, u, Config{PyPI: &Index{URL: u.srv.URL + "/simple", Allow: allow}})
	install := func(index string) time.Duration {
		dir, err := os.MkdirTemp("", "moat-bench-")
		if err != nil {
			b.Fatal(err)
		}
		defer os.RemoveAll(dir)
		args := append([]string{"-m", "pip", "install", "--isolated", "--no-deps", "--no-cache-dir", "--disable-pip-version-check", "--no-compile",
			"--target", filepath.Join(dir, "t"), "--index-url", index, "--trusted-host", "127.0.0.1"}, pkgs...)
		start := time.Now()
		out, err := exec.Command(py, args...).CombinedOutput()
		if err != nil {
			b.Fatalf("pip install from %s: %v\n%s", index, err, out)
		}
		return time.Since(start)
	}
	var guarded, direct time.Duration
	b.ResetTimer()
	for range b.N {
		direct += install(u.srv.URL + "/simple/")
		guarded += install(srv.URL + "/moat-index/pypi/simple/")
	}
	b.ReportMetric(float64(guarded.Milliseconds())/float64(b.N), "guarded-ms/op")
	b.ReportMetric(float64(direct.Milliseconds())/float64(b.N), "direct-ms/op")
	b.ReportMetric(float64(guarded)/float64(direct), "guarded/direct")
}
